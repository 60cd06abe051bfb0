/* tcpkit tlsprobe: what the BPF programs (tlsprobe.bpf.c) and user space (src/bpf.rs, generated
 * from this header by bindgen) share. This header is their only definition. */
#ifndef TCPKIT_TLSPROBE_H
#define TCPKIT_TLSPROBE_H

#include <linux/types.h>

/* Plaintext bytes one record carries at most: a TLS record's payload (16 KiB), so one
 * SSL_read or SSL_write of a record is one ring-buffer record. */
#define CHUNK 16384
/* Records one call is split into at most (1 MiB); what a call moved beyond that is counted
 * lost and shows to user space as a jump in the direction's offset, never as bytes cut. */
#define MAX_CHUNKS 64
/* Connections (SSL objects) tracked at once, least recently used going first. */
#define MAX_CONNS 65536
/* Threads inside an SSL call at once. */
#define MAX_CALLS 16384
/* The ring buffer between the programs and user space. */
#define RING_BYTES (16 * 1024 * 1024)

/* record.kind */
#define KIND_READ 0  /* SSL_read / SSL_read_ex: bytes the peer sent */
#define KIND_WRITE 1 /* SSL_write / SSL_write_ex: bytes sent to the peer */
#define KIND_FREE 2  /* SSL_free: the connection's end */
#define KIND_HANDSHAKE 3 /* SSL_do_handshake (a call only, never a record) */

/* counters (a per-CPU array) */
#define COUNTER_LOST_RECORDS 0 /* the ring buffer was full */
#define COUNTER_UNMATCHED 1    /* calls of an SSL object not (yet) tied to a socket */
#define COUNTER_LOST_BYTES 2   /* bytes of one call beyond MAX_CHUNKS records */
#define COUNTER_LOST_CHUNKS 3  /* bytes of a record that could not be read from the process */
#define COUNTERS 4

/* An SSL object of one process. */
struct conn_key {
	__u64 ssl;
	__u32 tgid;
	__u32 pad;
};

/* What is known of an SSL object: the socket its library reads and writes (seen inside its
 * calls), and the bytes counted in each direction since it was first tied to it. */
struct conn {
	__u64 sk;
	__u64 off[2];
	__u32 local[4];
	__u32 remote[4];
	__u16 lport;
	__u16 rport;
	__u16 family;
	/* Tied during its handshake: its bytes are counted from the first. */
	__u16 from_start;
};

/* A thread inside an SSL call: what the return probe needs. */
struct call {
	__u64 ssl;
	__u64 buf;
	/* SSL_read_ex/SSL_write_ex: where the library writes the byte count (else 0). */
	__u64 count_ptr;
	/* For a write: the bytes asked for (what SSL_write_ex writes on success). */
	__u64 asked;
	__u32 kind;
	__u32 pad;
};

/* One ring-buffer record: this header, then `len` bytes. Addresses in network byte order as
 * the socket holds them (an IPv4 address in the first word, family 2 (AF_INET) or 10
 * (AF_INET6)); ports in host order. */
struct record {
	__u64 ssl;
	/* CLOCK_MONOTONIC */
	__u64 ts;
	/* Bytes of this direction before these, since the object was tied to its socket. */
	__u64 offset;
	__u32 tgid;
	__u32 len;
	__u32 local[4];
	__u32 remote[4];
	__u16 lport;
	__u16 rport;
	__u16 family;
	__u8 kind;
	/* The object was tied to its socket during its handshake: offset 0 is its first byte
	 * (else it was joined mid-stream, open before the probes). */
	__u8 from_start;
};

#endif
