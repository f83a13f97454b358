/*
 * test_seal.c - the encrypted data plane (seal.h over transport_tcp.c).
 *
 * What test_transport.c cannot see from the two ends: a relay between
 * them (an on-path attacker) records and alters the bytes on the wire.
 * With sealing the secret never crosses in the clear, and a flipped bit,
 * a garbled length or a replayed record fails the connection with
 * KOLO_EAUTH before a byte of it is handed out; without sealing the same
 * relay reads the secret (so the check can fail). Also: ranks that
 * disagree about sealing refuse each other, a missing libcrypto is a
 * clear error, and the record layer keeps the send contract when the
 * socket takes a record a few bytes at a time.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "errors.h"
#include "seal.h"
#include "tcp_ident.h"
#include "test.h"
#include "transport.h"
#include "util.h"

#define JOB 42
#define GEN 7
/* the handshake's bytes from the connector (hello, proof) */
#define HANDSHAKE_C2A (56 + 32)

static const char SECRET[] = "the model's weights are a trade secret; do not print";

static struct tcp_ident ident(int rank, bool encrypt)
{
    struct tcp_ident id = {.job = JOB, .generation = GEN, .rank = rank, .key = TEST_KEY,
                           .encrypt = encrypt};
    return id;
}

static uint64_t deadline_in(uint64_t ms)
{
    return now_mono_ms() + ms;
}

/* ---- a relay between connector and acceptor ---- */

enum tamper { PASS, FLIP, GARBLE_LENGTH, REPLAY };

struct relay {
    int lfd, port;   /* where the connector dials */
    int to_port;     /* the acceptor */
    enum tamper what;
    /* connector -> acceptor bytes as they crossed, after the handshake */
    unsigned char seen[1 << 20];
    size_t nseen;
    /* the first sealed record, for REPLAY */
    unsigned char first[SEAL_RECORD_MAX + 64];
    size_t nfirst;
    bool replayed;
    pthread_t t;
};

static int dial(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    REQUIRE(s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    return s;
}

/* Copies both ways until either side closes; alters the connector's
 * stream past the handshake as told. */
static void *relay_main(void *p)
{
    struct relay *r = p;
    struct pollfd lp = {.fd = r->lfd, .events = POLLIN};
    REQUIRE(poll(&lp, 1, 10000) == 1);
    int a = accept(r->lfd, NULL, NULL);
    REQUIRE(a >= 0);
    int b = dial(r->to_port);
    size_t c2a = 0;
    for (;;) {
        struct pollfd fds[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(fds, 2, 10000) <= 0)
            break;
        unsigned char buf[65536];
        if (fds[0].revents) {
            ssize_t n = read(a, buf, sizeof buf);
            if (n <= 0)
                break;
            ssize_t from = 0; /* forwarded up to here */
            for (ssize_t i = 0; i < n; i++, c2a++) {
                if (c2a < HANDSHAKE_C2A)
                    continue;
                size_t at = c2a - HANDSHAKE_C2A;
                if (r->nseen < sizeof r->seen)
                    r->seen[r->nseen++] = buf[i];
                if (r->what == FLIP && at == 10)
                    buf[i] ^= 0x01; /* a ciphertext byte of the first record */
                if (r->what == GARBLE_LENGTH && at == 3)
                    buf[i] = 0x7f; /* a length far over the record maximum */
                if (r->what != REPLAY || r->replayed || r->nfirst == sizeof r->first)
                    continue;
                r->first[r->nfirst++] = buf[i];
                size_t whole = r->nfirst >= 4 ? 4 + SEAL_TAG_LEN + (r->first[0] | r->first[1] << 8 |
                                                                    (size_t)r->first[2] << 16)
                                              : 0;
                if (whole && r->nfirst == whole) {
                    /* the first record again, where the second belongs */
                    if (send(b, buf + from, (size_t)(i + 1 - from), MSG_NOSIGNAL) != i + 1 - from ||
                        send(b, r->first, whole, MSG_NOSIGNAL) != (ssize_t)whole)
                        goto out;
                    from = i + 1;
                    r->replayed = true; /* once */
                }
            }
            if (send(b, buf + from, (size_t)(n - from), MSG_NOSIGNAL) != n - from)
                break;
        }
        if (fds[1].revents) {
            ssize_t n = read(b, buf, sizeof buf);
            if (n <= 0 || send(a, buf, (size_t)n, MSG_NOSIGNAL) != n)
                break;
        }
    }
out:
    close(a);
    close(b);
    return NULL;
}

static void relay_start(struct relay *r, int to_port, enum tamper what)
{
    memset(r, 0, sizeof *r);
    r->to_port = to_port;
    r->what = what;
    REQUIRE(tcp_listen("127.0.0.1", &r->lfd, &r->port) == 0);
    REQUIRE(pthread_create(&r->t, NULL, relay_main, r) == 0);
}

static void relay_stop(struct relay *r)
{
    pthread_join(r->t, NULL);
    close(r->lfd);
}

static bool contains(const unsigned char *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0)
            return true;
    return false;
}

static unsigned char *message(size_t *len)
{
    /* 100 KiB: two records, the secret in each */
    *len = 100 << 10;
    unsigned char *m = calloc(1, *len);
    REQUIRE(m);
    memcpy(m + 16, SECRET, sizeof SECRET);
    memcpy(m + (70 << 10), SECRET, sizeof SECRET);
    return m;
}

/* Rank 0 (connector) and rank 1 (acceptor) with the relay between them,
 * and the message rank 0 is about to send. */
struct session {
    struct relay r;
    int lfd;
    struct xport *c, *a;
    unsigned char *msg, *got;
    size_t len;
};

static void session_open(struct session *s, enum tamper what, bool encrypt)
{
    int port;
    REQUIRE(tcp_listen("127.0.0.1", &s->lfd, &port) == 0);
    relay_start(&s->r, port, what);
    struct tcp_ident c = ident(0, encrypt), a = ident(1, encrypt);
    REQUIRE(tcp_connect("127.0.0.1", s->r.port, &c, 1, deadline_in(5000), &s->c) == 0);
    REQUIRE(tcp_accept(s->lfd, &a, deadline_in(5000), &s->a) == 0);
    s->msg = message(&s->len);
    s->got = calloc(1, s->len);
    REQUIRE(s->got);
}

/* Rank 0 sends the message; what rank 1's receive of it said. */
static int session_exchange(struct session *s)
{
    CHECK_EQ_INT(xport_send(s->c, s->msg, s->len, deadline_in(5000)), 0);
    return xport_recv(s->a, s->got, s->len, deadline_in(5000));
}

static void session_close(struct session *s)
{
    xport_close(s->c);
    xport_close(s->a);
    relay_stop(&s->r);
    close(s->lfd);
    free(s->msg);
    free(s->got);
}

static struct session sess; /* the relay's buffers are large */

static void test_wire(bool encrypt)
{
    struct session *s = &sess;
    session_open(s, PASS, encrypt);
    CHECK_EQ_INT(session_exchange(s), 0);
    CHECK(memcmp(s->got, s->msg, s->len) == 0);
    /* and back */
    CHECK_EQ_INT(xport_send(s->a, "ok", 2, deadline_in(5000)), 0);
    char ok[2];
    CHECK_EQ_INT(xport_recv(s->c, ok, 2, deadline_in(5000)), 0);
    CHECK(memcmp(ok, "ok", 2) == 0);
    session_close(s);
    /* 100 KiB crossed in two records plus their framing, or in clear */
    const struct relay *r = &s->r;
    if (encrypt) {
        CHECK(!contains(r->seen, r->nseen, SECRET));
        CHECK_EQ_INT(r->nseen, s->len + 2 * (4 + SEAL_TAG_LEN));
    } else {
        CHECK(contains(r->seen, r->nseen, SECRET));
        CHECK_EQ_INT(r->nseen, s->len);
    }
}

static void test_tamper(enum tamper what)
{
    struct session *s = &sess;
    session_open(s, what, true);
    CHECK_EQ_INT(session_exchange(s), KOLO_EAUTH);
    CHECK_EQ_INT(s->a->failed, KOLO_EAUTH);
    CHECK(strstr(s->a->why, "rank 0") != NULL);
    fprintf(stderr, "tamper %d: %s\n", (int)what, s->a->why);
    /* nothing of a record that failed its tag reached the caller: the
     * replayed record's copy is the first one again, so it is the second
     * record's place in the buffer that must stay untouched */
    size_t from = what == REPLAY ? 64 << 10 : 0;
    CHECK(!contains(s->got + from, s->len - from, SECRET));
    /* the failure sticks */
    CHECK_EQ_INT(xport_recv(s->a, s->got, 1, deadline_in(100)), KOLO_EAUTH);
    session_close(s);
}

/* Two records sent, one asked for: the second was read ahead with it,
 * so the socket is empty while the transport holds data. Whoever waits
 * for "the peer sent something" with poll() must ask xport_buffered
 * (the ring's idle wait once hung there, a barrier after 16 MiB). */
static void test_read_ahead(void)
{
    struct session *s = &sess;
    session_open(s, PASS, true);
    unsigned char one[100] = {1}, two[100] = {2};
    CHECK_EQ_INT(xport_send(s->c, one, sizeof one, deadline_in(5000)), 0);
    CHECK_EQ_INT(xport_send(s->c, two, sizeof two, deadline_in(5000)), 0);
    usleep(100000); /* both records are in the acceptor's socket */
    unsigned char got[100];
    CHECK_EQ_INT(xport_recv(s->a, got, sizeof got, deadline_in(5000)), 0);
    CHECK(got[0] == 1);
    CHECK(xport_buffered(s->a));
    short ev = 0;
    struct pollfd p = {.fd = s->a->ops->arm(s->a, false, true, &ev), .events = POLLIN};
    CHECK_EQ_INT(poll(&p, 1, 0), 0); /* what the idle wait would have slept on */
    CHECK_EQ_INT(xport_recv(s->a, got, sizeof got, deadline_in(5000)), 0);
    CHECK(got[0] == 2);
    CHECK(!xport_buffered(s->a));
    session_close(s);
}

/* One end seals, the other does not: the acceptor refuses, both know why. */
static void test_mismatch(bool connector_seals)
{
    int lfd, port;
    REQUIRE(tcp_listen("127.0.0.1", &lfd, &port) == 0);
    struct tcp_ident c = ident(0, connector_seals), a = ident(1, !connector_seals);
    struct xport *xc = NULL, *xa = (struct xport *)1;
    REQUIRE(tcp_connect("127.0.0.1", port, &c, 1, deadline_in(5000), &xc) == 0);
    CHECK_EQ_INT(tcp_accept(lfd, &a, deadline_in(5000), &xa), KOLO_EINVAL);
    CHECK(xa == NULL);
    unsigned char byte = 0;
    CHECK_EQ_INT(xport_send(xc, &byte, 1, deadline_in(5000)), KOLO_EINVAL);
    CHECK(strstr(xc->why, "KOLO_DATA_ENCRYPT") != NULL);
    xport_close(xc);
    close(lfd);
}

/* Without libcrypto a sealed connection fails with the reason: run in a
 * fresh process (this program again), since the library is looked for
 * once per process. */
static int no_libcrypto_child(void)
{
    {
        char err[256] = "";
        CHECK_EQ_INT(seal_available(err, sizeof err), KOLO_ENOTSUP);
        CHECK(strstr(err, "libssl3") != NULL);
        int lfd, port;
        REQUIRE(tcp_listen("127.0.0.1", &lfd, &port) == 0);
        struct tcp_ident c = ident(0, true), a = ident(1, true);
        struct xport *xc = NULL, *xa = NULL;
        REQUIRE(tcp_connect("127.0.0.1", port, &c, 1, deadline_in(5000), &xc) == 0);
        /* both ends fail at their first use, which finishes the handshake */
        REQUIRE(tcp_accept(lfd, &a, deadline_in(5000), &xa) == 0);
        unsigned char byte = 0;
        CHECK_EQ_INT(xport_send(xc, &byte, 1, deadline_in(5000)), KOLO_ENOTSUP);
        CHECK(strstr(xc->why, "cannot encrypt") != NULL);
        CHECK_EQ_INT(xport_recv(xa, &byte, 1, deadline_in(5000)), KOLO_ENOTSUP);
        CHECK(strstr(xa->why, "libssl3") != NULL);
        xport_close(xc);
        xport_close(xa);
        close(lfd);
    }
    TEST_DONE();
}

static void test_no_libcrypto(const char *self)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("KOLO_CRYPTO_LIBRARY", "/nonexistent/libcrypto.so.3", 1);
        execl("/proc/self/exe", self, "no-libcrypto", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The record layer on its own, over a socket pair whose buffers hold a
 * fraction of a record: sends come back 0 while a record is part-way out
 * (seal_midrecord), the resumed call finishes it, and a resumed call with
 * fewer bytes is refused. */
static void test_partial_records(void)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    unsigned char k1[SEAL_KEY_LEN], k2[SEAL_KEY_LEN];
    memset(k1, 1, sizeof k1);
    memset(k2, 2, sizeof k2);
    struct seal *tx, *rx;
    char err[256];
    REQUIRE(seal_new(k1, k2, &tx, err, sizeof err) == 0);
    REQUIRE(seal_new(k2, k1, &rx, err, sizeof err) == 0);
    size_t len = 3 * SEAL_RECORD_MAX + 5;
    unsigned char *out = malloc(len), *in = calloc(1, len);
    REQUIRE(out && in);
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)(i * 7 + 3);
    size_t sent = 0, got = 0;
    int zero_while_mid = 0, loops = 0;
    while ((sent < len || got < len) && loops++ < 1000000) {
        if (sent < len) {
            ssize_t n = seal_send(tx, sv[0], out + sent, len - sent);
            REQUIRE(n >= 0);
            if (n == 0 && seal_midrecord(tx)) {
                zero_while_mid++;
                CHECK_EQ_INT(seal_send(tx, sv[0], out + sent, 1), SEAL_MISUSE);
            }
            CHECK(n == 0 || n % SEAL_RECORD_MAX == 0 || sent + (size_t)n == len);
            sent += (size_t)n;
        }
        /* small reads: the receiver serves a record across many calls */
        ssize_t m = seal_recv(rx, sv[1], in + got, len - got < 1000 ? len - got : 1000);
        REQUIRE(m >= 0);
        got += (size_t)m;
    }
    CHECK_EQ_INT(sent, len);
    CHECK_EQ_INT(got, len);
    CHECK(memcmp(in, out, len) == 0);
    CHECK(zero_while_mid > 0);
    CHECK(!seal_midrecord(tx));
    /* the peer's end closes: EOF once everything was read */
    close(sv[0]);
    CHECK_EQ_INT(seal_recv(rx, sv[1], in, 1), SEAL_EOF);
    seal_free(tx);
    seal_free(rx);
    close(sv[1]);
    free(out);
    free(in);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_DFL);
    if (argc > 1 && strcmp(argv[1], "no-libcrypto") == 0)
        return no_libcrypto_child();
    char err[256];
    if (seal_available(err, sizeof err) != 0) {
        /* libcrypto is part of every Debian with Python; its absence is
         * tested in test_no_libcrypto */
        fprintf(stderr, "no libcrypto here: %s\n", err);
        return 1;
    }
    test_partial_records();
    test_wire(false);
    test_wire(true);
    test_read_ahead();
    test_tamper(FLIP);
    test_tamper(GARBLE_LENGTH);
    test_tamper(REPLAY);
    test_mismatch(true);
    test_mismatch(false);
    test_no_libcrypto(argv[0]);
    TEST_DONE();
}
