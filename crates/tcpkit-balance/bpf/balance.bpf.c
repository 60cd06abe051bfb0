// SPDX-License-Identifier: (MIT OR Apache-2.0) OR GPL-2.0
/* tcpkit balance: cgroup socket-address hooks that send connect() to a VIP to one of its
 * backends (the address is rewritten once, inside connect: nothing is paid per packet), and
 * make getpeername() show the VIP again. Attached to one cgroup v2 with bpf_link. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "balance.h"

#define ECONNREFUSED 111

char LICENSE[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SERVICES);
	__type(key, struct svc_key);
	__type(value, struct svc);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES * MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend);
} backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_SOCKETS);
	__type(key, __u64);
	__type(value, struct revnat);
} revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Connects sent to each backend slot (service id * MAX_BACKENDS + i). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SERVICES * MAX_BACKENDS);
	__type(key, __u32);
	__type(value, __u64);
} picks SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += 1;
}

SEC("cgroup/connect4")
int tk_connect4(struct bpf_sock_addr *ctx)
{
	struct svc_key key = { .ip4 = ctx->user_ip4, .port = (__u16)ctx->user_port };
	struct svc *s = bpf_map_lookup_elem(&services, &key);
	if (!s)
		return 1; /* not a VIP: untouched */
	__u32 n = s->count;
	if (n == 0 || n > MAX_BACKENDS) {
		/* No backend: refuse, never a silent connect to the VIP, never EPERM. */
		count(COUNTER_REFUSED);
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	__u32 i;
	if (s->algo == ALGO_ROUND_ROBIN)
		i = __sync_fetch_and_add(&s->rr, 1) % n;
	else
		i = bpf_get_prandom_u32() % n;
	__u32 slot = s->id * MAX_BACKENDS + i;
	struct backend *b = bpf_map_lookup_elem(&backends, &slot);
	if (!b) {
		count(COUNTER_REFUSED);
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	struct revnat r = {
		.vip4 = key.ip4, .vport = key.port, .bip4 = b->ip4, .bport = b->port,
	};
	__u64 cookie = bpf_get_socket_cookie(ctx);
	bpf_map_update_elem(&revnat, &cookie, &r, BPF_ANY);
	ctx->user_ip4 = b->ip4;
	ctx->user_port = b->port;
	__u64 *p = bpf_map_lookup_elem(&picks, &slot);
	if (p)
		*p += 1;
	count(COUNTER_TRANSLATED);
	return 1;
}

SEC("cgroup/getpeername4")
int tk_getpeername4(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct revnat *r = bpf_map_lookup_elem(&revnat, &cookie);
	if (!r)
		return 1;
	if (r->bip4 != ctx->user_ip4 || r->bport != (__u16)ctx->user_port) {
		/* The socket is no longer on the backend it was sent to: forget it. */
		bpf_map_delete_elem(&revnat, &cookie);
		count(COUNTER_STALE);
		return 1;
	}
	ctx->user_ip4 = r->vip4;
	ctx->user_port = r->vport;
	count(COUNTER_REVNAT);
	return 1;
}
