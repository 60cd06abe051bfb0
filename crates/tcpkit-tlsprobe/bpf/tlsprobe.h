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

/* The secrets mode (tlsprobe.bpf.c's second half): one record per completed handshake. */

/* The secrets' ring buffer: a record per handshake, drained every few milliseconds (no
 * wakeup: the reader polls it). */
#define SECRET_RING_BYTES (1024 * 1024)
/* EVP_MAX_MD_SIZE: OpenSSL's TLS 1.3 secrets' arrays (the hash's length is used of each). */
#define SECRET_MAX 64
/* SSL_MAX_MASTER_KEY_LENGTH */
#define MASTER_KEY_MAX 48
/* SSL3_RANDOM_SIZE */
#define RANDOM_LEN 32
/* Threads inside SSL_do_handshake at once. */
#define MAX_HANDSHAKES 16384

/* Where one OpenSSL version keeps what a key log needs: byte offsets into struct ssl_st,
 * ssl_session_st, ssl_cipher_st and bio_st. User space picks it by the library's version
 * (src/layout.rs, its table and the source of each) and sets it before loading. */
struct layout {
	__u32 version;                /* ssl_st.version (int) */
	__u32 rbio;                   /* ssl_st.rbio (BIO *) */
	__u32 session;                /* ssl_st.session (SSL_SESSION *) */
	__u32 client_random;          /* ssl_st.s3.client_random[32] */
	__u32 handshake_secret;       /* ssl_st.handshake_secret[64] */
	__u32 handshake_traffic_hash; /* ssl_st.handshake_traffic_hash[64] */
	__u32 client_app_secret;      /* ssl_st.client_app_traffic_secret[64] */
	__u32 server_app_secret;      /* ssl_st.server_app_traffic_secret[64] */
	__u32 master_key_length;      /* ssl_session_st.master_key_length (size_t) */
	__u32 master_key;             /* ssl_session_st.master_key[] */
	__u32 cipher;                 /* ssl_session_st.cipher (const SSL_CIPHER *) */
	__u32 cipher_id;              /* ssl_cipher_st.id (uint32_t) */
	__u32 bio_num;                /* bio_st.num (int: a socket BIO's descriptor) */
	__u32 pad;
};

/* One completed handshake: what the library holds when SSL_do_handshake returns 1, read as
 * the layout says, and the socket its read BIO's descriptor names in the process. Addresses
 * as in struct record; family 0 when the descriptor was not an IPv4/IPv6 socket. */
struct secret_record {
	__u64 ssl;
	/* CLOCK_MONOTONIC */
	__u64 ts;
	/* TLS 1.2 only (not read for TLS 1.3: 0, and master_key zeros). */
	__u64 master_key_len;
	__u32 tgid;
	/* ssl_st.version: 0x0303 TLS 1.2, 0x0304 TLS 1.3 */
	__u32 version;
	/* ssl_cipher_st.id: 0x0300XXXX, XXXX the suite's IANA number */
	__u32 cipher_id;
	__u32 local[4];
	__u32 remote[4];
	__u16 lport;
	__u16 rport;
	__u16 family;
	__u16 pad;
	__u8 client_random[RANDOM_LEN];
	__u8 master_key[MASTER_KEY_MAX];
	__u8 handshake_secret[SECRET_MAX];
	__u8 handshake_traffic_hash[SECRET_MAX];
	__u8 client_app_secret[SECRET_MAX];
	__u8 server_app_secret[SECRET_MAX];
	__u32 pad2;
};

#endif
