/*
 * tls_stream.c - what TLS would cost the data plane: one-way bandwidth of
 * one loopback connection, plain TCP against nng's TLS (mbedTLS, the
 * library kolo's TLS uses), sender and receiver in two threads of one
 * process, so both ends' CPU counts as it would between two ranks.
 *
 *   kolo-bench-tls-stream TLS_DIR [MIB] [REPS]
 *
 * TLS_DIR holds cert.pem, key.pem and ca.pem (scripts/tls-certs.sh).
 * Each rep sends MIB MiB (default 256) in 1 MiB writes and is timed to
 * the receiver's last byte. Prints one JSON line: GB/s median and p99
 * (the slow tail: the 1st percentile of bandwidth) for each, and TLS/TCP.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "bench_clock.h"
#include "tls.h"

#define CHUNK (1u << 20)

static void check(int rv, const char *what)
{
    if (rv != 0) {
        fprintf(stderr, "tls_stream: %s: %s\n", what, nng_strerror(rv));
        exit(1);
    }
}

/* Moves len bytes of buf through s, one direction. */
static void xfer(nng_stream *s, char *buf, size_t len, int sending)
{
    nng_aio *aio;
    check(nng_aio_alloc(&aio, NULL, NULL), "aio");
    while (len > 0) {
        nng_iov iov = {.iov_buf = buf, .iov_len = len};
        check(nng_aio_set_iov(aio, 1, &iov), "iov");
        if (sending)
            nng_stream_send(s, aio);
        else
            nng_stream_recv(s, aio);
        nng_aio_wait(aio);
        check(nng_aio_result(aio), sending ? "send" : "recv");
        size_t n = nng_aio_count(aio);
        buf += n;
        len -= n;
    }
    nng_aio_free(aio);
}

struct side {
    nng_stream *s;
    int reps;
    size_t bytes;
};

static void *receiver(void *arg)
{
    struct side *r = arg;
    char *buf = malloc(CHUNK);
    char ack = 1;
    for (int i = 0; i < r->reps; i++) {
        for (size_t got = 0; got < r->bytes; got += CHUNK)
            xfer(r->s, buf, CHUNK, 0);
        xfer(r->s, &ack, 1, 1);
    }
    free(buf);
    return NULL;
}

/* One connection over url; fills gbps[reps]. */
static void run(const char *url, nng_tls_config *server, nng_tls_config *client, size_t bytes,
                int reps, double *gbps)
{
    nng_stream_listener *l;
    nng_stream_dialer *d;
    nng_aio *acc, *dial;
    check(nng_stream_listener_alloc(&l, url), "listener");
    if (server)
        check(nng_stream_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, server), "listener tls");
    check(nng_stream_listener_listen(l), "listen");
    int port = 0;
    check(nng_stream_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port), "port");
    char dial_url[128];
    snprintf(dial_url, sizeof dial_url, "%s://localhost:%d", server ? "tls+tcp" : "tcp", port);
    check(nng_stream_dialer_alloc(&d, dial_url), "dialer");
    if (client)
        check(nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, client), "dialer tls");
    check(nng_aio_alloc(&acc, NULL, NULL), "aio");
    check(nng_aio_alloc(&dial, NULL, NULL), "aio");
    nng_stream_listener_accept(l, acc);
    nng_stream_dialer_dial(d, dial);
    nng_aio_wait(acc);
    nng_aio_wait(dial);
    check(nng_aio_result(acc), "accept");
    check(nng_aio_result(dial), "dial");
    struct side r = {.s = nng_aio_get_output(acc, 0), .reps = reps, .bytes = bytes};
    nng_stream *s = nng_aio_get_output(dial, 0);
    pthread_t t;
    pthread_create(&t, NULL, receiver, &r);
    char *buf = malloc(CHUNK), ack;
    memset(buf, 0x5a, CHUNK);
    for (int i = 0; i < reps; i++) {
        double t0 = now_us();
        for (size_t sent = 0; sent < bytes; sent += CHUNK)
            xfer(s, buf, CHUNK, 1);
        xfer(s, &ack, 1, 0);
        gbps[i] = (double)bytes / ((now_us() - t0) * 1e3);
    }
    pthread_join(t, NULL);
    free(buf);
    nng_stream_free(s);
    nng_stream_free(r.s);
    nng_stream_dialer_free(d);
    nng_stream_listener_free(l);
    nng_aio_free(acc);
    nng_aio_free(dial);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: kolo-bench-tls-stream TLS_DIR [MIB] [REPS]\n");
        return 2;
    }
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 256;
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    if (mib == 0 || reps < 1)
        return 2;
    struct tls_files f;
    char err[512];
    nng_tls_config *server, *client;
    if (tls_files_init(&f, NULL, NULL, NULL, argv[1], err, sizeof err) != 0 ||
        tls_config_new(&server, TLS_RPC_SERVER, &f, NULL, err, sizeof err) != 0 ||
        tls_config_new(&client, TLS_CLIENT, &f, "localhost", err, sizeof err) != 0) {
        fprintf(stderr, "tls_stream: %s\n", err);
        return 1;
    }
    double *tcp = calloc((size_t)reps, sizeof(double));
    double *tls = calloc((size_t)reps, sizeof(double));
    run("tcp://127.0.0.1:0", NULL, NULL, mib << 20, reps, tcp);
    run("tls+tcp://127.0.0.1:0", server, client, mib << 20, reps, tls);
    qsort(tcp, (size_t)reps, sizeof(double), cmp_double);
    qsort(tls, (size_t)reps, sizeof(double), cmp_double);
    int p50 = reps / 2, p99 = (int)((reps - 1) * 0.01); /* bandwidth: the slow end */
    printf("{\"mib\": %zu, \"reps\": %d, \"tcp_gbps_p50\": %.3f, \"tcp_gbps_p99\": %.3f, "
           "\"tls_gbps_p50\": %.3f, \"tls_gbps_p99\": %.3f, \"tls_over_tcp_p50\": %.3f, "
           "\"tls_over_tcp_p99\": %.3f, \"engine\": \"%s\"}\n",
           mib, reps, tcp[p50], tcp[p99], tls[p50], tls[p99], tls[p50] / tcp[p50],
           tls[p99] / tcp[p99], nng_tls_engine_name());
    nng_tls_config_free(server);
    nng_tls_config_free(client);
    free(tcp);
    free(tls);
    return 0;
}
