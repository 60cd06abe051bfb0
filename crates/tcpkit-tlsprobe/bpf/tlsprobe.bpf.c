// SPDX-License-Identifier: (MIT OR Apache-2.0) OR GPL-2.0
/* tcpkit tlsprobe: the plaintext of a TLS library's connections, read at its own SSL_read and
 * SSL_write (and their _ex forms) by uprobes and uretprobes, each SSL object tied to the
 * socket its library reads and writes, handed to user space through a ring buffer.
 *
 * How an SSL object is tied to its socket: while a thread is inside one of the SSL calls, the
 * kernel's sock_recv_length / sock_send_length tracepoints (raw tracepoints: no tracefs, no
 * kprobes) name the struct sock that thread reads or writes; that is the object's socket,
 * its addresses read from struct sock with CO-RE. Not SSL_set_fd and the file table: a
 * connection accepted before the probes were attached never calls SSL_set_fd again, a library
 * given a BIO (SSL_set_bio, BIO pairs) never calls it at all, and a descriptor number is reused
 * after close; the socket read inside the call is the one the bytes really crossed, whatever
 * the library version or the server's way of giving it the socket. An object whose calls have
 * not touched its socket yet (its first SSL_read served from bytes the library had already
 * read) is counted unmatched until one does. */
#include <linux/bpf.h>
#include <linux/types.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "tlsprobe.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

#define AF_INET 2
#define AF_INET6 10

/* The kernel's structs, the fields read here only; CO-RE finds each at its offset in the
 * running kernel's BTF (their local layout, padding included, is never used). */
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpadded"
struct in6_addr___tk {
	__u32 in6_u[4];
} __attribute__((preserve_access_index));

struct sock_common {
	__u32 skc_daddr;
	__u32 skc_rcv_saddr;
	__u16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	struct in6_addr___tk skc_v6_daddr;
	struct in6_addr___tk skc_v6_rcv_saddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

#pragma clang diagnostic pop

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_CONNS);
	__type(key, struct conn_key);
	__type(value, struct conn);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CALLS);
	__type(key, __u64);
	__type(value, struct call);
} calls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES);
} records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* A record with its bytes is assembled here, then copied to the ring at its real length: a
 * reservation of the largest size for every record would fill the ring with empty space. */
struct scratch {
	struct record r;
	__u8 data[CHUNK];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

static __always_inline void count(__u32 which, __u64 n)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += n;
}

static __always_inline void enter(struct pt_regs *ctx, __u32 kind, int ex)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct call c = {};
	c.ssl = PT_REGS_PARM1(ctx);
	c.buf = PT_REGS_PARM2(ctx);
	c.asked = PT_REGS_PARM3(ctx);
	c.count_ptr = ex ? PT_REGS_PARM4(ctx) : 0;
	c.kind = kind;
	bpf_map_update_elem(&calls, &id, &c, BPF_ANY);
}

static __always_inline void fill(struct record *r, const struct conn_key *k, const struct conn *c,
				 __u32 kind)
{
	r->ssl = k->ssl;
	r->tgid = k->tgid;
	r->ts = bpf_ktime_get_ns();
	r->kind = kind;
	r->family = c->family;
	r->from_start = c->from_start;
	r->lport = c->lport;
	r->rport = c->rport;
	__builtin_memcpy(r->local, c->local, sizeof(r->local));
	__builtin_memcpy(r->remote, c->remote, sizeof(r->remote));
}

static __always_inline void leave(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct call *call = bpf_map_lookup_elem(&calls, &id);
	if (!call)
		return;
	struct call cl = *call;
	bpf_map_delete_elem(&calls, &id);
	if (cl.kind == KIND_HANDSHAKE)
		return;

	/* Each call returns an int: the upper half of the register is not its. */
	int ret = (int)PT_REGS_RC(ctx);
	__u64 n = 0;
	if (cl.count_ptr) {
		/* _ex: 1 on success, the count through the pointer. */
		if (ret != 1)
			return;
		__u64 got = 0;
		if (bpf_probe_read_user(&got, sizeof(got), (void *)cl.count_ptr))
			return;
		n = got;
	} else {
		if (ret <= 0)
			return;
		n = ret;
	}
	if (n == 0)
		return;
	struct conn_key k = {.ssl = cl.ssl, .tgid = id >> 32};
	struct conn *c = bpf_map_lookup_elem(&conns, &k);
	if (!c) {
		count(COUNTER_UNMATCHED, 1);
		return;
	}
	__u32 dir = cl.kind == KIND_WRITE ? 1 : 0;
	__u64 base = c->off[dir & 1];
	c->off[dir & 1] = base + n;
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return;
	for (int i = 0; i < MAX_CHUNKS; i++) {
		__u64 done = (__u64)i * CHUNK;
		if (done >= n)
			return;
		__u64 len = n - done;
		if (len > CHUNK)
			len = CHUNK;
		/* The verifier needs the bound on the register the helpers get. */
		asm volatile("%[len] &= %[mask]" : [len] "+r"(len) : [mask] "i"(2 * CHUNK - 1));
		if (len > CHUNK)
			return;
		fill(&s->r, &k, c, cl.kind);
		s->r.offset = base + done;
		s->r.len = len;
		if (bpf_probe_read_user(s->data, len, (void *)(cl.buf + done))) {
			count(COUNTER_LOST_CHUNKS, len);
			continue;
		}
		if (bpf_ringbuf_output(&records, s, sizeof(struct record) + len, 0))
			count(COUNTER_LOST_RECORDS, 1);
	}
	if (n > (__u64)MAX_CHUNKS * CHUNK)
		count(COUNTER_LOST_BYTES, n - (__u64)MAX_CHUNKS * CHUNK);
}

SEC("uprobe")
int BPF_KPROBE(tk_ssl_read_enter) { enter(ctx, KIND_READ, 0); return 0; }
SEC("uprobe")
int BPF_KPROBE(tk_ssl_write_enter) { enter(ctx, KIND_WRITE, 0); return 0; }
/* A connection's handshake: the socket it reads ties the object from its start. */
SEC("uprobe")
int BPF_KPROBE(tk_ssl_handshake_enter) { enter(ctx, KIND_HANDSHAKE, 0); return 0; }
/* The return of every one of the calls: what was entered is in `calls`. */
SEC("uretprobe")
int BPF_KPROBE(tk_ssl_leave) { leave(ctx); return 0; }
SEC("uprobe")
int BPF_KPROBE(tk_ssl_read_enter_ex) { enter(ctx, KIND_READ, 1); return 0; }
SEC("uprobe")
int BPF_KPROBE(tk_ssl_write_enter_ex) { enter(ctx, KIND_WRITE, 1); return 0; }

/* SSL_free: the connection's end. */
SEC("uprobe")
int BPF_KPROBE(tk_ssl_free)
{
	struct conn_key k = {.ssl = PT_REGS_PARM1(ctx), .tgid = bpf_get_current_pid_tgid() >> 32};
	struct conn *c = bpf_map_lookup_elem(&conns, &k);
	if (!c)
		return 0;
	struct record r = {};
	fill(&r, &k, c, KIND_FREE);
	r.offset = c->off[0];
	if (bpf_ringbuf_output(&records, &r, sizeof(r), 0))
		count(COUNTER_LOST_RECORDS, 1);
	bpf_map_delete_elem(&conns, &k);
	return 0;
}

/* A socket read or written by a thread inside an SSL call is that call's object's socket. */
static __always_inline void tie(struct sock *sk)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct call *call = bpf_map_lookup_elem(&calls, &id);
	if (!call)
		return;
	if (!sk)
		return;
	struct conn_key k = {.ssl = call->ssl, .tgid = id >> 32};
	struct conn *old = bpf_map_lookup_elem(&conns, &k);
	if (old && old->sk == (__u64)sk)
		return;
	struct conn c = {};
	c.sk = (__u64)sk;
	c.from_start = call->kind == KIND_HANDSHAKE;
	c.family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (c.family == AF_INET) {
		c.local[0] = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
		c.remote[0] = BPF_CORE_READ(sk, __sk_common.skc_daddr);
	} else if (c.family == AF_INET6) {
		BPF_CORE_READ_INTO(&c.local, sk, __sk_common.skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(&c.remote, sk, __sk_common.skc_v6_daddr);
	} else {
		return;
	}
	c.lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	c.rport = __builtin_bswap16(BPF_CORE_READ(sk, __sk_common.skc_dport));
	/* An object moved to another socket (SSL_clear, SSL_set_fd again): a new connection,
	 * its offsets from zero; user space sees the new addresses. */
	bpf_map_update_elem(&conns, &k, &c, BPF_ANY);
}

SEC("raw_tracepoint/sock_recv_length")
int tk_sock_recv(struct bpf_raw_tracepoint_args *ctx)
{
	tie((struct sock *)ctx->args[0]);
	return 0;
}

SEC("raw_tracepoint/sock_send_length")
int tk_sock_send(struct bpf_raw_tracepoint_args *ctx)
{
	tie((struct sock *)ctx->args[0]);
	return 0;
}

/* The secrets mode: no probe on SSL_read/SSL_write at all (a keep-alive request costs the
 * server no trap). At the return of SSL_do_handshake (SSL_accept and SSL_connect call it)
 * with 1, the handshake is done and the SSL object holds what an NSS key log line says: the
 * client random, TLS 1.2's master key, TLS 1.3's handshake secret and transcript hash (user
 * space derives the handshake traffic secrets from them, as they are not kept) and both
 * application traffic secrets. They are read at the offsets user space set for the library's
 * version (LAYOUT), with the socket of the object's read BIO, so user space can check the
 * layout against the ClientHello it captured on that connection. */

const volatile struct layout LAYOUT = {};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_HANDSHAKES);
	__type(key, __u64);
	__type(value, __u64);
} handshakes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SECRET_RING_BYTES);
} secrets SEC(".maps");

#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpadded"
struct socket___tk {
	struct sock *sk;
} __attribute__((preserve_access_index));

struct file___tk {
	void *private_data;
} __attribute__((preserve_access_index));

struct fdtable___tk {
	unsigned int max_fds;
	struct file___tk **fd;
} __attribute__((preserve_access_index));

struct files_struct___tk {
	struct fdtable___tk *fdt;
} __attribute__((preserve_access_index));

struct task_struct___tk {
	struct files_struct___tk *files;
} __attribute__((preserve_access_index));
#pragma clang diagnostic pop

SEC("uprobe")
int BPF_KPROBE(tk_hs_enter)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 ssl = PT_REGS_PARM1(ctx);
	bpf_map_update_elem(&handshakes, &id, &ssl, BPF_ANY);
	return 0;
}

/* The socket behind descriptor `fd` of the current process, its addresses into `r`. */
static __always_inline void socket_of(int fd, struct secret_record *r)
{
	struct task_struct___tk *task = (void *)bpf_get_current_task();
	struct fdtable___tk *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return;
	struct file___tk **fds = BPF_CORE_READ(fdt, fd);
	struct file___tk *f = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return;
	struct socket___tk *so = BPF_CORE_READ(f, private_data);
	if (!so)
		return;
	struct sock *sk = BPF_CORE_READ(so, sk);
	if (!sk)
		return;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (family == AF_INET) {
		r->local[0] = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
		r->remote[0] = BPF_CORE_READ(sk, __sk_common.skc_daddr);
	} else if (family == AF_INET6) {
		BPF_CORE_READ_INTO(&r->local, sk, __sk_common.skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(&r->remote, sk, __sk_common.skc_v6_daddr);
	} else {
		return;
	}
	r->family = family;
	r->lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	r->rport = __builtin_bswap16(BPF_CORE_READ(sk, __sk_common.skc_dport));
}

#define READ_AT(dst, base, off) bpf_probe_read_user(&(dst), sizeof(dst), (void *)((base) + (off)))

SEC("uretprobe")
int BPF_KPROBE(tk_hs_leave)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 *sslp = bpf_map_lookup_elem(&handshakes, &id);
	if (!sslp)
		return 0;
	__u64 ssl = *sslp;
	bpf_map_delete_elem(&handshakes, &id);
	/* 1: done; else it wants more bytes (non-blocking) or failed, and is called again. */
	if ((int)PT_REGS_RC(ctx) != 1)
		return 0;
	struct secret_record *r = bpf_ringbuf_reserve(&secrets, sizeof(*r), 0);
	if (!r) {
		count(COUNTER_LOST_RECORDS, 1);
		return 0;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->ssl = ssl;
	r->tgid = id >> 32;
	r->ts = bpf_ktime_get_ns();
	int version = 0;
	__u64 session = 0, cipher = 0, rbio = 0;
	int fd = -1;
	READ_AT(version, ssl, LAYOUT.version);
	r->version = version;
	READ_AT(r->client_random, ssl, LAYOUT.client_random);
	READ_AT(session, ssl, LAYOUT.session);
	if (session) {
		/* Every read is a helper call on the server's CPU: TLS 1.3 has no master key. */
		if (version != 0x0304) {
			READ_AT(r->master_key_len, session, LAYOUT.master_key_length);
			READ_AT(r->master_key, session, LAYOUT.master_key);
		}
		READ_AT(cipher, session, LAYOUT.cipher);
		if (cipher)
			READ_AT(r->cipher_id, cipher, LAYOUT.cipher_id);
	}
	if (version == 0x0304) {
		READ_AT(r->handshake_secret, ssl, LAYOUT.handshake_secret);
		READ_AT(r->handshake_traffic_hash, ssl, LAYOUT.handshake_traffic_hash);
		READ_AT(r->client_app_secret, ssl, LAYOUT.client_app_secret);
		READ_AT(r->server_app_secret, ssl, LAYOUT.server_app_secret);
	}
	READ_AT(rbio, ssl, LAYOUT.rbio);
	if (rbio && !READ_AT(fd, rbio, LAYOUT.bio_num))
		socket_of(fd, r);
	/* No wakeup: copy drains this ring on its own timer (every POLL_NS, well inside the
	 * seconds a session waits for its secret) and never sleeps on it, while a wakeup is an
	 * irq_work the server's CPU raises as a self-IPI (a VM exit under virtualisation) for
	 * nothing on every handshake. */
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 0;
}
