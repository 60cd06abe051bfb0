// SPDX-License-Identifier: (MIT OR Apache-2.0) OR GPL-2.0
/* tcpkit balance: cgroup socket-address hooks that send connect() to a VIP to one of its
 * backends (the address is rewritten once, inside connect: nothing is paid per packet), and
 * make getpeername() show the VIP again. UDP (IPv4 and IPv6, v4-mapped too): sendmsg to a VIP from an unconnected
 * socket goes to a backend chosen once per socket (it stays there), and recvmsg shows
 * replies from that backend as coming from the VIP; connected UDP goes through connect4/6. IPv4 (connect4), IPv6 (connect6), and IPv4 VIPs
 * reached through IPv6 sockets as v4-mapped addresses (connect6). Every socket sent to a
 * backend is counted on it while it is open (cgroup/sock_release counts it off), for status
 * and the least-connection algorithms. Attached to one cgroup v2 with bpf_link. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "balance.h"

#define ECONNREFUSED 111
#define WRITE_ONCE_U64(x, v) (*(volatile __u64 *)&(x) = (v))
#define READ_ONCE_U64(x) (*(volatile __u64 *)&(x))

char LICENSE[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SERVICES);
	__type(key, struct svc_key);
	__type(value, struct svc);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES * GENERATIONS * MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend);
} backends SEC(".maps");

/* Mmapable: --drain-kill reads all its slots in one go from user space, where a lookup
 * syscall per slot took 65,536 calls. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SOCKETS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct revnat);
} revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Connects sent to each backend (service index * MAX_BACKENDS + backend index). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SERVICES * MAX_BACKENDS);
	__type(key, __u32);
	__type(value, __u64);
} picks SEC(".maps");

/* Sockets open now on each backend (indexed as `picks`): see struct active. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES * MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct active);
} active SEC(".maps");

/* The tags of open sockets whose reverse-map slot a newer socket took (struct active), by
 * cookie. Not socket-local storage for every socket: creating it made connect4 ~1,100-1,350 ns
 * where it was ~270-330 ns; the tag in the reverse-map entry, written anyway, and this map's
 * lookup make it ~490-510 ns (kernel.bpf_stats_enabled, 2,000 connects, 3 runs each). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_OVERFLOW);
	__type(key, __u64);
	__type(value, struct sock_tag);
} overflow SEC(".maps");

/* --persistent: each client's backend and when it last connected (the least recently used
 * client goes first when full). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_PERSIST);
	__type(key, struct persist_key);
	__type(value, struct persist_val);
} persist SEC(".maps");

/* Each service slot's backends as configured, in order (slot * MAX_BACKENDS + position), each
 * with its `picks` counter (index) and weight; family 0 ends a slot's list. No program reads
 * it: it is pinned with the others so that a later `balance up --pin` adopting the pins knows
 * whose each counter is, also for a backend out of the live set (down, drained). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES * MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend);
} owners SEC(".maps");

/* Each service's lookup table: RING_SIZE backend indexes, filled by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES * GENERATIONS * RING_SIZE);
	__type(key, __u32);
	__type(value, __u32);
} ring SEC(".maps");

/* The ports some VIP uses, a bit each (bit port % 32 of word port / 32, the port as
 * bpf_sock_addr holds it, in network byte order): a connect or datagram to any other port is
 * none of ours, told without the services lookup (a hash of the 20-byte key and a memcmp:
 * over half of a translated connect4's time, and all of an untranslated one's). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, VIP_PORT_WORDS);
	__type(key, __u32);
	__type(value, __u32);
} vip_ports SEC(".maps");

/* Set by user space at load time (--trace): every selection is sent to `trace`. */
const volatile __u32 trace_on = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} trace SEC(".maps");

static __always_inline __u32 fmix32(__u32 h)
{
	/* MurmurHash3's finaliser: every input bit moves every output bit. */
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 cookie_hash(__u64 c)
{
	return fmix32((__u32)c ^ fmix32((__u32)(c >> 32)));
}

/* The client host: the socket's bound source address (zero while unbound) in its network
 * namespace. With `port`, the client's port too, as IPVS mh's port flag: a socket bound to a
 * port keeps its backend across reconnects; an unbound one has no port yet (the kernel picks
 * it after this hook), so its cookie stands in, as unforeseeable as an ephemeral port. */
static __always_inline __u32 client_hash(struct bpf_sock_addr *ctx, int v6, int port)
{
	__u64 ns = bpf_get_netns_cookie(ctx);
	__u32 h = cookie_hash(ns);
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return h;
	if (v6) {
		h = fmix32(h ^ sk->src_ip6[0]);
		h = fmix32(h ^ sk->src_ip6[1]);
		h = fmix32(h ^ sk->src_ip6[2]);
		h = fmix32(h ^ sk->src_ip6[3]);
	} else {
		h = fmix32(h ^ sk->src_ip4);
	}
	if (port) {
		__u32 p = sk->src_port;
		h = fmix32(h ^ (p ? p : cookie_hash(bpf_get_socket_cookie(ctx))));
	}
	return h;
}

static __always_inline int vip_port(__u32 user_port)
{
	__u32 k = (user_port & 0xffff) >> 5;
	__u32 *w = bpf_map_lookup_elem(&vip_ports, &k);
	return w && (*w & (1u << (user_port & 31)));
}

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += 1;
}

/* The socket's reverse-map slot, whoever holds it now. */
static __always_inline struct revnat *rev_slot(__u64 cookie)
{
	__u32 k = (__u32)cookie & (MAX_SOCKETS - 1);
	return bpf_map_lookup_elem(&revnat, &k);
}

/* The socket's entry, or NULL when its slot holds none or another socket's. */
static __always_inline struct revnat *rev_get(__u64 cookie)
{
	struct revnat *r = rev_slot(cookie);
	if (!r || r->cookie != cookie)
		return 0;
	return r;
}

/* Counts a tag off its backend, unless its counter went to another backend since (its epoch
 * moved on). */
static __always_inline void untag(__u32 key1, __u32 epoch)
{
	if (!key1)
		return;
	__u32 k = key1 - 1;
	struct active *a = bpf_map_lookup_elem(&active, &k);
	if (a && a->epoch == epoch)
		__sync_fetch_and_add(&a->n, -1);
}

/* Takes slot e from socket `cookie` (its owner) and counts the socket off: once, whoever
 * else tries at the same time (a release, a newer socket taking the slot). Returns whether
 * it did. */
static __always_inline int rev_take(struct revnat *e, __u64 cookie)
{
	__u32 key1 = e->key1, epoch = e->epoch;
	if (__sync_val_compare_and_swap(&e->cookie, cookie, 0) != cookie)
		return 0;
	untag(key1, epoch);
	return 1;
}

/* Counts socket `cookie` off through its overflow tag, if it has one. */
static __always_inline void overflow_take(__u64 cookie)
{
	struct sock_tag *t = bpf_map_lookup_elem(&overflow, &cookie);
	if (!t)
		return;
	__u32 key1 = t->key1, epoch = t->epoch;
	/* Deleted by whoever got there first: only that one counts it off. */
	if (bpf_map_delete_elem(&overflow, &cookie) == 0)
		untag(key1, epoch);
}

/* Writes the socket's entry into its slot, tag included. The socket's tag before (a socket
 * sent again: a UDP socket connected anew, a datagram to another VIP) is counted off first;
 * another socket's entry in the slot is that of a socket still open (a release frees its
 * slot), so its tag moves to `overflow` before the slot is taken. The cookie goes in last,
 * so a getpeername of the slot's previous socket never takes this socket's addresses for its
 * own. */
static __always_inline void rev_put(__u64 cookie, struct revnat *r)
{
	struct revnat *e = rev_slot(cookie);
	if (!e)
		return;
	__u64 old = READ_ONCE_U64(e->cookie);
	if (old == cookie) {
		rev_take(e, cookie);
	} else if (old) {
		struct sock_tag t = { .key1 = e->key1, .epoch = e->epoch };
		int moved = 0;
		if (t.key1) {
			moved = !bpf_map_update_elem(&overflow, &old, &t, BPF_NOEXIST);
			if (!moved)
				count(COUNTER_UNTAGGED);
		}
		/* Released meanwhile (it counted itself off): its overflow tag goes again. */
		if (__sync_val_compare_and_swap(&e->cookie, old, 0) != old && moved)
			bpf_map_delete_elem(&overflow, &old);
	}
	overflow_take(cookie);
	WRITE_ONCE_U64(e->cookie, 0);
	__builtin_memcpy(e->vip, r->vip, sizeof(e->vip));
	__builtin_memcpy(e->bip, r->bip, sizeof(e->bip));
	e->vport = r->vport;
	e->bport = r->bport;
	e->key1 = r->key1;
	e->epoch = r->epoch;
	WRITE_ONCE_U64(e->cookie, cookie);
}

/* Backend b's `picks` and `active` counter. */
static __always_inline __u32 counter_of(struct svc *s, struct backend *b)
{
	return (s->id / GENERATIONS) * MAX_BACKENDS + (b->index % MAX_BACKENDS);
}

/* least_conn's scan, one backend a step (bpf_loop: the verifier checks a step once, where
 * an unrolled scan of MAX_BACKENDS in each of four programs went past its limit). */
struct lc_scan {
	__u32 id;
	__u32 n;
	__u32 start;
	__u32 weighted;
	__s64 best;
	__s64 best_n;
	__s64 best_w;
};

static long lc_step(__u64 j, void *p)
{
	struct lc_scan *c = p;
	if (c->n == 0)
		return 1;
	__u32 i = (c->start + (__u32)j) % c->n;
	__u32 k = c->id * MAX_BACKENDS + i;
	struct backend *b = bpf_map_lookup_elem(&backends, &k);
	if (!b)
		return 0;
	__u32 ck = (c->id / GENERATIONS) * MAX_BACKENDS + (b->index % MAX_BACKENDS);
	struct active *a = bpf_map_lookup_elem(&active, &ck);
	__s64 on = a ? (__s64)READ_ONCE_U64(a->n) : 0;
	if (on < 0)
		on = 0;
	__s64 w = c->weighted ? b->weight : 1;
	if (w == 0)
		return 0;
	/* on / w < best_n / best_w, without a division. */
	if (c->best < 0 || on * c->best_w < c->best_n * w) {
		c->best = i;
		c->best_n = on;
		c->best_w = w;
	}
	return 0;
}

/* The set's backend with the fewest active sockets (per unit of weight with `weighted`):
 * ipvs lc/wlc, counting sockets open now. The scan starts at the next round-robin position,
 * so backends as loaded as each other take turns (ipvs takes the first of them). */
static __always_inline __s64 least_conn(struct svc *s, __u32 n, int weighted)
{
	struct lc_scan c = {
		.id = s->id,
		.n = n,
		.start = __sync_fetch_and_add(&s->rr, 1) % n,
		.weighted = weighted,
		.best = -1,
		.best_n = 0,
		.best_w = 1,
	};
	bpf_loop(n, lc_step, &c, 0);
	return c.best;
}

struct persist_scan {
	__u32 id;
	__u32 counter;
	__s64 slot;
};

static long persist_step(__u64 i, void *p)
{
	struct persist_scan *c = p;
	__u32 k = c->id * MAX_BACKENDS + (__u32)i;
	struct backend *b = bpf_map_lookup_elem(&backends, &k);
	if (b && b->index == c->counter) {
		c->slot = k;
		return 1;
	}
	return 0;
}

/* The backend `client` was last sent to, while --persistent holds and it is still in the set
 * (then its time starts again); NULL otherwise. */
static __always_inline struct backend *persisted(struct svc *s, __u32 n, struct persist_key *client,
						 __u64 now, __u32 *slot)
{
	struct persist_val *p = bpf_map_lookup_elem(&persist, client);
	if (!p || now - p->last_ns >= (__u64)s->persist_ms * 1000000)
		return 0;
	struct persist_scan c = { .id = s->id, .counter = p->counter, .slot = -1 };
	bpf_loop(n, persist_step, &c, 0);
	if (c.slot < 0)
		return 0;
	p->last_ns = now;
	*slot = (__u32)c.slot;
	return bpf_map_lookup_elem(&backends, slot);
}

static __always_inline void persist_key_of(struct bpf_sock_addr *ctx, struct svc *s, int v6,
					   struct persist_key *k)
{
	k->netns = bpf_get_netns_cookie(ctx);
	k->svc = s->id / GENERATIONS;
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return;
	if (v6) {
		k->ip[0] = sk->src_ip6[0];
		k->ip[1] = sk->src_ip6[1];
		k->ip[2] = sk->src_ip6[2];
		k->ip[3] = sk->src_ip6[3];
	} else {
		k->ip[0] = sk->src_ip4;
	}
}

/* Picks a backend for `key`: NULL when the service has none (the caller refuses), the
 * service's slot in *slot. */
static __always_inline struct backend *pick(struct bpf_sock_addr *ctx, struct svc *s, int v6,
					      __u32 *slot)
{
	__u32 n = s->count;
	if (n == 0 || n > MAX_BACKENDS || s->id >= MAX_SERVICES * GENERATIONS)
		return 0;
	struct persist_key client = {};
	__u64 now = 0;
	if (s->persist_ms) {
		persist_key_of(ctx, s, v6, &client);
		now = bpf_ktime_get_ns();
		struct backend *b = persisted(s, n, &client, now, slot);
		if (b)
			return b;
	}
	__u32 i, h, r;
	__s64 l;
	switch (s->algo) {
	case ALGO_ROUND_ROBIN:
		i = __sync_fetch_and_add(&s->rr, 1) % n;
		break;
	case ALGO_LC:
	case ALGO_WLC:
		l = least_conn(s, n, s->algo == ALGO_WLC);
		if (l < 0)
			return 0;
		i = (__u32)l;
		break;
	case ALGO_WEIGHTED:
	case ALGO_WRR:
	case ALGO_MAGLEV_CLIENT:
	case ALGO_MAGLEV_HOST:
	case ALGO_MAGLEV_COOKIE:
		if (s->algo == ALGO_WEIGHTED)
			h = bpf_get_prandom_u32() % RING_SIZE;
		else if (s->algo == ALGO_WRR)
			h = __sync_fetch_and_add(&s->rr, 1) % (s->len ? s->len : 1);
		else if (s->algo == ALGO_MAGLEV_CLIENT || s->algo == ALGO_MAGLEV_HOST)
			h = client_hash(ctx, v6, s->algo == ALGO_MAGLEV_CLIENT) % RING_SIZE;
		else
			h = cookie_hash(bpf_get_socket_cookie(ctx)) % RING_SIZE;
		r = s->id * RING_SIZE + (h % RING_SIZE);
		__u32 *e = bpf_map_lookup_elem(&ring, &r);
		if (!e || *e >= n)
			return 0;
		i = *e;
		break;
	default:
		i = bpf_get_prandom_u32() % n;
	}
	*slot = s->id * MAX_BACKENDS + i;
	struct backend *b = bpf_map_lookup_elem(&backends, slot);
	if (b && s->persist_ms) {
		struct persist_val v = { .last_ns = now, .counter = b->index };
		bpf_map_update_elem(&persist, &client, &v, BPF_ANY);
	}
	return b;
}

static __always_inline void emit(struct revnat *r, __u8 family, __u8 udp)
{
	if (!trace_on)
		return;
	struct trace_event e = {
		.pid_tgid = bpf_get_current_pid_tgid(),
		.cgroup = bpf_get_current_cgroup_id(),
		.vport = r->vport,
		.bport = r->bport,
		.family = family,
		.udp = udp,
	};
	__builtin_memcpy(e.vip, r->vip, sizeof(e.vip));
	__builtin_memcpy(e.bip, r->bip, sizeof(e.bip));
	if (bpf_ringbuf_output(&trace, &e, sizeof(e), 0))
		count(COUNTER_TRACE_LOST);
}

static __always_inline int refuse(void)
{
	/* No backend: refuse, never a silent connect to the VIP, never EPERM. */
	count(COUNTER_REFUSED);
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

/* Sends the socket (`cookie`) to backend b: its entry r written with its tag, and counted
 * (connects, and active until it is released). */
static __always_inline void placed(struct svc *s, struct backend *b, __u64 cookie,
				   struct revnat *r)
{
	__u32 k = counter_of(s, b);
	__u64 *p = bpf_map_lookup_elem(&picks, &k);
	if (p)
		*p += 1;
	count(COUNTER_TRANSLATED);
	struct active *a = bpf_map_lookup_elem(&active, &k);
	if (a) {
		r->key1 = k + 1;
		r->epoch = a->epoch;
		/* Counted on before the entry holds the tag: a release that finds the tag always
		 * finds it counted. */
		__sync_fetch_and_add(&a->n, 1);
	}
	rev_put(cookie, r);
}

SEC("cgroup/sock_release")
int tk_sock_release(struct bpf_sock *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *e = rev_slot(cookie);
	if (e && READ_ONCE_U64(e->cookie) == cookie && rev_take(e, cookie))
		return 1;
	overflow_take(cookie);
	return 1;
}

SEC("cgroup/connect4")
int tk_connect4(struct bpf_sock_addr *ctx)
{
	if (!vip_port(ctx->user_port))
		return 1; /* no VIP on this port: untouched */
	struct svc_key key = { .ip = { ctx->user_ip4 }, .port = (__u16)ctx->user_port, .family = 4,
				.proto = (__u8)ctx->protocol };
	struct svc *s = bpf_map_lookup_elem(&services, &key);
	if (!s)
		return 1; /* not a VIP: untouched */
	__u32 slot = 0;
	struct backend *b = pick(ctx, s, 0, &slot);
	if (!b || b->family != 4)
		return refuse();
	struct revnat r = {
		.vip = { key.ip[0] }, .bip = { b->ip[0] }, .vport = key.port, .bport = b->port,
	};
	placed(s, b, bpf_get_socket_cookie(ctx), &r);
	ctx->user_ip4 = b->ip[0];
	ctx->user_port = b->port;
	emit(&r, 4, 0);
	return 1;
}

/* The service key of the address an IPv6 socket asked for: ::ffff:a.b.c.d is an IPv4 VIP
 * asked for through an IPv6 socket. Returns whether it was v4-mapped. */
static __always_inline int key6(struct bpf_sock_addr *ctx, struct svc_key *key, __u32 a[4])
{
	a[0] = ctx->user_ip6[0];
	a[1] = ctx->user_ip6[1];
	a[2] = ctx->user_ip6[2];
	a[3] = ctx->user_ip6[3];
	int mapped = a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
	key->port = (__u16)ctx->user_port;
	key->proto = (__u8)ctx->protocol;
	if (mapped) {
		key->ip[0] = a[3];
		key->family = 4;
	} else {
		key->ip[0] = a[0];
		key->ip[1] = a[1];
		key->ip[2] = a[2];
		key->ip[3] = a[3];
		key->family = 6;
	}
	return mapped;
}

/* The revnat entry for backend b of a VIP asked for as a[] by an IPv6 socket. */
static __always_inline void revnat6(struct revnat *r, __u32 a[4], struct svc_key *key,
				    struct backend *b, int mapped)
{
	r->vport = key->port;
	r->bport = b->port;
	r->vip[0] = a[0];
	r->vip[1] = a[1];
	r->vip[2] = a[2];
	r->vip[3] = a[3];
	if (mapped) {
		r->bip[0] = 0;
		r->bip[1] = 0;
		r->bip[2] = bpf_htonl(0xffff);
		r->bip[3] = b->ip[0];
	} else {
		r->bip[0] = b->ip[0];
		r->bip[1] = b->ip[1];
		r->bip[2] = b->ip[2];
		r->bip[3] = b->ip[3];
	}
}

static __always_inline void write6(struct bpf_sock_addr *ctx, struct revnat *r)
{
	ctx->user_ip6[0] = r->bip[0];
	ctx->user_ip6[1] = r->bip[1];
	ctx->user_ip6[2] = r->bip[2];
	ctx->user_ip6[3] = r->bip[3];
	ctx->user_port = r->bport;
}

SEC("cgroup/connect6")
int tk_connect6(struct bpf_sock_addr *ctx)
{
	if (!vip_port(ctx->user_port))
		return 1;
	__u32 a[4];
	struct svc_key key = {};
	int mapped = key6(ctx, &key, a);
	struct svc *s = bpf_map_lookup_elem(&services, &key);
	if (!s)
		return 1;
	__u32 slot = 0;
	struct backend *b = pick(ctx, s, !mapped, &slot);
	if (!b || b->family != key.family)
		return refuse();
	struct revnat r = {};
	revnat6(&r, a, &key, b, mapped);
	placed(s, b, bpf_get_socket_cookie(ctx), &r);
	write6(ctx, &r);
	emit(&r, 6, 0);
	return 1;
}

/* Shows this socket the VIP its slot holds (getpeername, recvmsg). rev_put clears the cookie
 * before it rewrites a reused slot: the cookie is read again after the copy, so a slot taken by
 * a new socket meanwhile never lends this one its VIP. */
static __always_inline void show_vip4(struct bpf_sock_addr *ctx, struct revnat *r, __u64 cookie)
{
	__u32 vip = r->vip[0];
	__u32 vport = r->vport;
	asm volatile("" ::: "memory");
	if (READ_ONCE_U64(r->cookie) != cookie)
		return;
	ctx->user_ip4 = vip;
	ctx->user_port = vport;
	count(COUNTER_REVNAT);
}

static __always_inline void show_vip6(struct bpf_sock_addr *ctx, struct revnat *r, __u64 cookie)
{
	__u32 vip[4] = { r->vip[0], r->vip[1], r->vip[2], r->vip[3] };
	__u32 vport = r->vport;
	asm volatile("" ::: "memory");
	if (READ_ONCE_U64(r->cookie) != cookie)
		return;
	ctx->user_ip6[0] = vip[0];
	ctx->user_ip6[1] = vip[1];
	ctx->user_ip6[2] = vip[2];
	ctx->user_ip6[3] = vip[3];
	ctx->user_port = vport;
	count(COUNTER_REVNAT);
}

SEC("cgroup/getpeername4")
int tk_getpeername4(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *r = rev_get(cookie);
	if (!r)
		return 1;
	if (r->bip[0] != ctx->user_ip4 || r->bport != (__u16)ctx->user_port) {
		/* The socket is no longer on the backend it was sent to: forget it. */
		rev_take(r, cookie);
		count(COUNTER_STALE);
		return 1;
	}
	show_vip4(ctx, r, cookie);
	return 1;
}

SEC("cgroup/getpeername6")
int tk_getpeername6(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *r = rev_get(cookie);
	if (!r)
		return 1;
	if (r->bip[0] != ctx->user_ip6[0] || r->bip[1] != ctx->user_ip6[1] ||
	    r->bip[2] != ctx->user_ip6[2] || r->bip[3] != ctx->user_ip6[3] ||
	    r->bport != (__u16)ctx->user_port) {
		rev_take(r, cookie);
		count(COUNTER_STALE);
		return 1;
	}
	show_vip6(ctx, r, cookie);
	return 1;
}

SEC("cgroup/sendmsg4")
int tk_sendmsg4(struct bpf_sock_addr *ctx)
{
	if (!vip_port(ctx->user_port))
		return 1; /* no VIP on this port: untouched */
	struct svc_key key = { .ip = { ctx->user_ip4 }, .port = (__u16)ctx->user_port, .family = 4,
				.proto = (__u8)ctx->protocol };
	struct svc *s = bpf_map_lookup_elem(&services, &key);
	if (!s)
		return 1;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *old = rev_get(cookie);
	if (old && old->vip[0] == key.ip[0] && old->vport == key.port) {
		/* An unconnected socket stays on the backend it was given first. */
		ctx->user_ip4 = old->bip[0];
		ctx->user_port = old->bport;
		return 1;
	}
	__u32 slot = 0;
	struct backend *b = pick(ctx, s, 0, &slot);
	if (!b || b->family != 4)
		return refuse();
	struct revnat r = {
		.vip = { key.ip[0] }, .bip = { b->ip[0] }, .vport = key.port, .bport = b->port,
	};
	placed(s, b, cookie, &r);
	ctx->user_ip4 = b->ip[0];
	ctx->user_port = b->port;
	emit(&r, 4, 1);
	return 1;
}

SEC("cgroup/recvmsg4")
int tk_recvmsg4(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *r = rev_get(cookie);
	/* Only what came from the socket's backend is shown as the VIP's. */
	if (r && r->bip[0] == ctx->user_ip4 && r->bport == (__u16)ctx->user_port) {
		show_vip4(ctx, r, cookie);
	}
	return 1;
}

SEC("cgroup/sendmsg6")
int tk_sendmsg6(struct bpf_sock_addr *ctx)
{
	if (!vip_port(ctx->user_port))
		return 1;
	__u32 a[4];
	struct svc_key key = {};
	int mapped = key6(ctx, &key, a);
	struct svc *s = bpf_map_lookup_elem(&services, &key);
	if (!s)
		return 1;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *old = rev_get(cookie);
	if (old && old->vip[0] == a[0] && old->vip[1] == a[1] && old->vip[2] == a[2] &&
	    old->vip[3] == a[3] && old->vport == key.port) {
		write6(ctx, old);
		return 1;
	}
	__u32 slot = 0;
	struct backend *b = pick(ctx, s, !mapped, &slot);
	if (!b || b->family != key.family)
		return refuse();
	struct revnat r = {};
	revnat6(&r, a, &key, b, mapped);
	placed(s, b, cookie, &r);
	write6(ctx, &r);
	emit(&r, 6, 1);
	return 1;
}

SEC("cgroup/recvmsg6")
int tk_recvmsg6(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *r = rev_get(cookie);
	if (!r)
		return 1;
	/* An IPv6 socket's datagram to ::ffff:VIP went through sendmsg4 (the kernel hands
	 * v4-mapped destinations to IPv4): its entry is in IPv4 form. */
	if (ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	    ctx->user_ip6[2] == bpf_htonl(0xffff) && r->bip[1] == 0 && r->bip[2] == 0 &&
	    r->bip[3] == 0 && r->bip[0] == ctx->user_ip6[3] && r->bport == (__u16)ctx->user_port) {
		__u32 vip = r->vip[0];
		__u32 vport = r->vport;
		asm volatile("" ::: "memory");
		if (READ_ONCE_U64(r->cookie) != cookie)
			return 1;
		ctx->user_ip6[3] = vip;
		ctx->user_port = vport;
		count(COUNTER_REVNAT);
		return 1;
	}
	if (r->bip[0] == ctx->user_ip6[0] && r->bip[1] == ctx->user_ip6[1] &&
	    r->bip[2] == ctx->user_ip6[2] && r->bip[3] == ctx->user_ip6[3] &&
	    r->bport == (__u16)ctx->user_port) {
		show_vip6(ctx, r, cookie);
	}
	return 1;
}
