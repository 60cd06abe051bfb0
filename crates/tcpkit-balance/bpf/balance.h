/* The one definition of what user space and the BPF programs share: map keys and values, and
 * the constants both sides use. build.rs generates the Rust side from this file with bindgen
 * (src/bpf.rs includes it): the structs as the BPF target lays them out, each #define as a
 * constant. No struct may have padding (build.rs makes -Wpadded an error): user space copies
 * every byte of a key or value to the kernel, so pad explicitly. */
#ifndef TCPKIT_BALANCE_H
#define TCPKIT_BALANCE_H

#include <linux/types.h>

/* Bounds of every map: a service has at most MAX_BACKENDS slots, the backend array holds
 * MAX_SERVICES * MAX_BACKENDS of them, and the reverse map holds MAX_SOCKETS sockets (a power
 * of two: a socket's slot is its cookie's low bits). */
#define MAX_SERVICES 64
#define MAX_BACKENDS 64
#define MAX_SOCKETS 65536
/* Words of the vip_ports bitmap: a bit for each of the 65536 ports. */
#define VIP_PORT_WORDS 2048

/* Slots of a service's lookup table (weighted, maglev): a prime well above 60 x MAX_BACKENDS,
 * so maglev moves few slots and weights are kept to within 1/RING_SIZE. */
#define RING_SIZE 4093

#define ALGO_RANDOM 0
#define ALGO_ROUND_ROBIN 1
#define ALGO_WEIGHTED 2      /* a random slot of the table (filled in proportion to weights) */
#define ALGO_MAGLEV_CLIENT 3 /* the table's slot by a hash of the client: netns, bound source
			      * address, and its bound port (the socket cookie while unbound) */
#define ALGO_MAGLEV_COOKIE 4 /* the table's slot by a hash of the socket cookie */
#define ALGO_WRR 5           /* the table's slots in turn (a smooth weighted order, svc.len) */
#define ALGO_LC 6            /* the fewest active sockets (ties: in turn) */
#define ALGO_WLC 7           /* the fewest active sockets per unit of weight */
#define ALGO_MAGLEV_HOST 8   /* the table's slot by a hash of netns and bound source address */

/* Addresses are 16 bytes, in network byte order as bpf_sock_addr holds them: an IPv4
 * address is ip[0] with ip[1..3] zero (family 4). A service is a VIP for one protocol (the
 * socket's: IPPROTO_TCP 6 or IPPROTO_UDP 17); one balancing both has a key for each. */
struct svc_key {
	__u32 ip[4];
	__u16 port;
	__u8 family; /* 4 or 6 */
	__u8 proto;  /* 6 or 17 */
};

/* A service's backend set is swapped atomically: user space writes the other generation's
 * slots (backends and ring), then replaces the service's value (one map update) to point at
 * them; a connect reads one generation only. id = service index * GENERATIONS + generation. */
#define GENERATIONS 2

struct svc {
	__u32 id;     /* this set's slots in `backends`: id * MAX_BACKENDS + i, `ring`: id * RING_SIZE */
	__u32 count;  /* backends in the set; 0 refuses every connect (ECONNREFUSED) */
	__u32 algo;   /* ALGO_* */
	__u32 rr;     /* round-robin position, shared by every CPU (atomic add) */
	__u32 len;    /* ALGO_WRR: slots of the table in use (its order's length) */
	__u32 persist_ms; /* a client keeps its backend this long after its last connect; 0: off */
};

struct backend {
	__u32 ip[4];
	__u16 port;
	__u8 family;
	__u8 pad;
	__u32 index; /* the backend's place in the service as configured (its `picks` counter) */
	__u32 weight; /* ALGO_WLC */
};

/* Sockets open now on each backend (`active`, indexed as `picks`), for status and the
 * least-connection algorithms. A socket is tagged with its counter and the counter's epoch
 * when it is sent to a backend, in its reverse-map entry (written then anyway), and counted
 * off when it is released (cgroup/sock_release, which also frees the entry) or found
 * elsewhere (getpeername's stale check). The one socket that owns an entry takes it with a
 * compare-and-swap of the cookie, so a tag is counted off once. A socket still open whose
 * slot a newer socket takes (cookies MAX_SOCKETS apart) has its tag moved to `overflow`
 * (keyed by cookie) first: the count stays exact, at the cost of a hash update only then.
 * User space bumps the epoch when it gives the counter to another backend (a reload), so a
 * socket of the backend before never counts off the new one's. Shared by every CPU (atomic
 * adds): the least-connection pick reads it whole. */
struct active {
	__s64 n;
	__u32 epoch;
	__u32 pad;
};

struct sock_tag {
	__u32 key1;  /* the socket's `active` counter + 1; 0: none */
	__u32 epoch;
};
#define MAX_OVERFLOW 65536

/* --persistent: a client (netns, bound source address) of service slot `svc` keeps the
 * backend whose counter is `counter` until `last_ns` + the service's persist_ms. */
struct persist_key {
	__u64 netns;
	__u32 ip[4];
	__u32 svc;
	__u32 pad;
};

struct persist_val {
	__u64 last_ns;
	__u32 counter;
	__u32 pad;
};
#define MAX_PERSIST 65536

/* What getpeername must show for a translated socket (vip), and the address the socket was
 * sent to as the hook wrote it (bip; for an IPv4 service reached through an IPv6 socket, the
 * v4-mapped form). A socket found elsewhere since (reconnected by the application) is stale:
 * its entry is dropped.
 *
 * Kept in an array slot chosen by the socket's cookie (cookie % MAX_SOCKETS), the cookie
 * itself in the entry: an entry answers only for the socket whose cookie it holds, so a slot
 * taken over by a later socket forgets the earlier one (as an LRU map would once full) and
 * never shows it another socket's VIP. Cookies are handed out in increasing order, so a slot
 * comes round again only after MAX_SOCKETS newer sockets were given one. An array slot is
 * written in place, with no lock and no allocation: an LRU hash insert cost ~700 ns of
 * connect4's ~970 ns here (kernel.bpf_stats_enabled), a socket-local storage (created with the
 * socket's first entry) ~830 ns. cookie 0 is no socket's: an empty slot. */
struct revnat {
	__u64 cookie;
	__u32 vip[4];
	__u32 bip[4];
	__u16 vport;
	__u16 bport;
	__u32 key1;  /* the socket's `active` counter + 1 (0: none), and that counter's epoch */
	__u32 epoch;
	__u32 pad;
};

/* Per-CPU counters, indexed by the COUNTER_* below. */
#define COUNTER_TRANSLATED 0
#define COUNTER_REFUSED 1
#define COUNTER_REVNAT 2
#define COUNTER_STALE 3
#define COUNTER_TRACE_LOST 4
#define COUNTER_UNTAGGED 5 /* open sockets whose tag found no room in `overflow` (never counted off) */
#define COUNTERS 6

/* One selection, for --trace (ring buffer `trace`). */
struct trace_event {
	__u64 pid_tgid;
	__u64 cgroup;
	__u32 vip[4];
	__u32 bip[4];
	__u16 vport;
	__u16 bport;
	__u8 family; /* of the socket: 4, or 6 (an IPv4 VIP through an IPv6 socket is 6, v4-mapped) */
	__u8 udp;    /* 1: sendmsg (unconnected UDP); 0: connect */
	__u8 pad[2];
};

#endif
