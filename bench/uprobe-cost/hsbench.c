/* Cost of the secrets probes' traps, in-process: CPU (user+sys, getrusage) per
 * SSL_do_handshake call on an object with no handshake function (returns -1 at once), and per
 * in-memory TLS handshake (client and server in this thread, memory BIOs: the server calls
 * SSL_do_handshake twice per TLS 1.3 handshake, as nginx does). */
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double cpu_ns(void) {
	struct rusage u; getrusage(RUSAGE_SELF, &u);
	return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e9 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e3;
}

static void pump(BIO *from, BIO *to) {
	char buf[16384]; int n;
	while ((n = BIO_read(from, buf, sizeof buf)) > 0) BIO_write(to, buf, n);
}

int main(int argc, char **argv) {
	if (argc < 3) { fprintf(stderr, "usage: hsbench calls|hs13|hs12 N [cert key]\n"); return 2; }
	long n = atol(argv[2]);
	if (!strcmp(argv[1], "calls")) {
		SSL_CTX *ctx = SSL_CTX_new(TLS_method());
		SSL *s = SSL_new(ctx);
		double t0 = cpu_ns();
		for (long i = 0; i < n; i++) { SSL_do_handshake(s); ERR_clear_error(); }
		printf("%.1f ns/call\n", (cpu_ns() - t0) / n);
		return 0;
	}
	SSL_CTX *sc = SSL_CTX_new(TLS_server_method()), *cc = SSL_CTX_new(TLS_client_method());
	if (SSL_CTX_use_certificate_file(sc, argv[3], SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_use_PrivateKey_file(sc, argv[4], SSL_FILETYPE_PEM) != 1) { ERR_print_errors_fp(stderr); return 1; }
	if (!strcmp(argv[1], "hs12")) SSL_CTX_set_max_proto_version(cc, TLS1_2_VERSION);
	SSL_CTX_set_session_cache_mode(sc, SSL_SESS_CACHE_OFF);
	SSL_CTX_set_options(sc, SSL_OP_NO_TICKET);
	long server_calls = 0;
	double t0 = cpu_ns();
	for (long i = 0; i < n; i++) {
		SSL *c = SSL_new(cc), *s = SSL_new(sc);
		BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
		BIO *s_in = BIO_new(BIO_s_mem()), *s_out = BIO_new(BIO_s_mem());
		SSL_set_bio(c, c_in, c_out); SSL_set_bio(s, s_in, s_out);
		SSL_set_connect_state(c); SSL_set_accept_state(s);
		int cd = 0, sd = 0;
		for (int k = 0; k < 10 && !(cd && sd); k++) {
			if (!cd) cd = SSL_do_handshake(c) == 1;
			pump(c_out, s_in);
			if (!sd) { sd = SSL_do_handshake(s) == 1; server_calls++; }
			pump(s_out, c_in);
		}
		if (!(cd && sd)) { fprintf(stderr, "handshake %ld failed\n", i); ERR_print_errors_fp(stderr); return 1; }
		SSL_free(c); SSL_free(s);
	}
	printf("%.1f ns/handshake %.2f server calls/handshake\n", (cpu_ns() - t0) / n, (double)server_calls / n);
	return 0;
}
