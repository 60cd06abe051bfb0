/* The one definition of what user space and the BPF programs share: map keys and values.
 * balance.rs mirrors these structs with #[repr(C)] and checks their sizes in a unit test. */
#ifndef TCPKIT_BALANCE_H
#define TCPKIT_BALANCE_H

/* Bounds of every map: a service has at most MAX_BACKENDS slots, the backend array holds
 * MAX_SERVICES * MAX_BACKENDS of them, and the reverse map forgets the least recently used
 * socket once MAX_SOCKETS are held. */
#define MAX_SERVICES 64
#define MAX_BACKENDS 64
#define MAX_SOCKETS 65536

#define ALGO_RANDOM 0
#define ALGO_ROUND_ROBIN 1

/* Services are keyed by VIP and port in network byte order, as bpf_sock_addr holds them. */
struct svc_key {
	__u32 ip4;
	__u16 port;
	__u16 pad;
};

struct svc {
	__u32 id;     /* this service's slots in `backends`: id * MAX_BACKENDS + i */
	__u32 count;  /* backends in the set; 0 refuses every connect (ECONNREFUSED) */
	__u32 algo;   /* ALGO_* */
	__u32 rr;     /* round-robin position, shared by every CPU (atomic add) */
};

struct backend {
	__u32 ip4;
	__u16 port;
	__u16 pad;
};

/* What getpeername must show for a translated socket, and the backend it went to (a socket
 * reconnected elsewhere since, by the application, is stale: its entry is dropped). */
struct revnat {
	__u32 vip4;
	__u16 vport;
	__u16 pad;
	__u32 bip4;
	__u16 bport;
	__u16 pad2;
};

/* Per-CPU counters, indexed by the COUNTER_* below. */
#define COUNTER_TRANSLATED 0
#define COUNTER_REFUSED 1
#define COUNTER_REVNAT 2
#define COUNTER_STALE 3
#define COUNTERS 4

#endif
