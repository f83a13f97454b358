/*
 * test_mesh.c - the authenticated TCP mesh (worker/transport/mesh.c) and the
 * handshake under it (transport_tcp.c): ranks as threads, strangers as
 * raw sockets that speak the wire format by hand.
 *
 * What must hold: a connection that cannot prove the generation's key
 * never delivers a byte and never takes a rank's place; garbage, idle,
 * stale and forged connections do not delay or break the mesh (they are
 * counted by reason); a flood of idle connections is evicted; a missing
 * rank or a rank with another key ends the set-up at its deadline with
 * a sentence naming it.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "errors.h"
#include "mesh.h"
#include "tcp_ident.h"
#include "test.h"
#include "transport.h"
#include "util.h"

#define JOB       9
#define GEN       4
#define MAX_RANKS 4

/* ---- a stranger's side of the wire (transport_tcp.c's format) ---- */

static int raw_connect(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    REQUIRE(s >= 0 && connect(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    return s;
}

static void le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A well-formed hello (56 bytes) naming job, generation and ranks. */
static void raw_hello(int s, uint64_t job, uint64_t gen, int from, int to)
{
    unsigned char h[56] = {0};
    le(h, 0x584c4f4bu, 4);
    le(h + 4, 2, 2);
    le(h + 6, 1, 2);
    le(h + 16, job, 8);
    le(h + 24, gen, 8);
    le(h + 32, (uint32_t)from, 4);
    le(h + 36, (uint32_t)to, 4);
    memset(h + 40, 0x5a, 16);
    REQUIRE(write(s, h, sizeof h) == (ssize_t)sizeof h);
}

/* What the injection of finding F2 did: a guessed hello, then floats,
 * here behind a proof that is not one. */
static void raw_inject(int s)
{
    unsigned char junk[32];
    memset(junk, 0xab, sizeof junk);
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = 1000.0f;
    REQUIRE(write(s, junk, sizeof junk) == (ssize_t)sizeof junk);
    (void)write(s, data, sizeof data);
}

static uint64_t deadline_in(uint64_t ms)
{
    return now_mono_ms() + ms;
}

/* ---- the handshake on one connection ---- */

static void test_forged_proof(void)
{
    int lfd, port;
    REQUIRE(tcp_listen("127.0.0.1", &lfd, &port) == 0);
    int s = raw_connect(port);
    raw_hello(s, JOB, GEN, 0, 1);
    raw_inject(s);
    struct xport *a = NULL;
    /* the hello itself is in order: accept answers it... */
    REQUIRE(tcp_accept(lfd, IDENT(JOB, GEN, 1), deadline_in(5000), &a) == 0);
    /* ...but nothing after it is data: the proof fails, no float arrives */
    float got = 0;
    CHECK_EQ_INT(xport_recv(a, &got, sizeof got, deadline_in(5000)), KOLO_EAUTH);
    CHECK(got == 0);
    CHECK(strstr(a->why, "does not hold this generation's key") != NULL);
    CHECK_EQ_INT(xport_send(a, &got, sizeof got, deadline_in(1000)), KOLO_EAUTH);
    xport_close(a);
    close(s);
    close(lfd);
}

/* Two honest ends with different keys (another job's credential): the
 * connector finds out from the answer, the acceptor from the missing
 * proof; neither moves data. */
static void test_wrong_key_pair(void)
{
    int lfd, port;
    REQUIRE(tcp_listen("127.0.0.1", &lfd, &port) == 0);
    struct tcp_ident other = *IDENT(JOB, GEN, 0);
    memcpy(other.key, "another job's key, not this one", 32);
    struct xport *c = NULL, *a = NULL;
    REQUIRE(tcp_connect("127.0.0.1", port, &other, 1, deadline_in(5000), &c) == 0);
    REQUIRE(tcp_accept(lfd, IDENT(JOB, GEN, 1), deadline_in(5000), &a) == 0);
    int v = 42;
    CHECK_EQ_INT(xport_send(c, &v, sizeof v, deadline_in(5000)), KOLO_EAUTH);
    CHECK(strstr(c->why, "not a member of this job") != NULL);
    xport_close(c);
    CHECK(xport_recv(a, &v, sizeof v, deadline_in(5000)) != 0);
    CHECK_EQ_INT(v, 42); /* untouched */
    xport_close(a);
    close(lfd);
}

/* ---- the mesh ---- */

struct rank_run {
    int rank, size;
    int *lfd, *port;
    const char *hosts[MAX_RANKS];
    unsigned char key[32];
    uint64_t timeout_ms;
    int code;
    char err[256];
    uint64_t took_ms;
    struct xport *peers[MAX_RANKS];
    int exchanged; /* peers that sent us their rank number correctly */
};

static void *rank_main(void *p)
{
    struct rank_run *r = p;
    struct mesh_spec spec = {.me = {.job = JOB, .generation = GEN, .rank = r->rank},
                             .size = r->size,
                             .listen_fd = r->lfd[r->rank],
                             .hosts = r->hosts,
                             .ports = r->port,
                             .deadline = deadline_in(r->timeout_ms)};
    memcpy(spec.me.key, r->key, 32);
    uint64_t t0 = now_mono_ms();
    r->code = mesh_connect(&spec, r->peers, r->err, sizeof r->err);
    r->took_ms = now_mono_ms() - t0;
    if (r->code)
        return NULL;
    for (int q = 0; q < r->size; q++) {
        if (q == r->rank)
            continue;
        int mine = r->rank, theirs = -1;
        if (xport_sendrecv(r->peers[q], &mine, sizeof mine, r->peers[q], &theirs, sizeof theirs,
                           deadline_in(5000)) == 0 &&
            theirs == q)
            r->exchanged++;
    }
    for (int q = 0; q < r->size; q++)
        if (r->peers[q])
            xport_close(r->peers[q]);
    return NULL;
}

/* Runs ranks [0, size) except `absent`, each with `keys[r]` (NULL: the
 * shared one), until all return. */
static void run_mesh(struct rank_run *runs, int size, int *lfd, int *port, int absent,
                     const char *const *keys, uint64_t timeout_ms)
{
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        runs[r] = (struct rank_run){.rank = r, .size = size, .lfd = lfd, .port = port,
                                    .timeout_ms = timeout_ms};
        for (int q = 0; q < size; q++)
            runs[r].hosts[q] = "127.0.0.1";
        memcpy(runs[r].key, keys && keys[r] ? keys[r] : TEST_KEY, 32);
    }
    for (int r = 0; r < size; r++)
        if (r != absent)
            REQUIRE(pthread_create(&th[r], NULL, rank_main, &runs[r]) == 0);
    for (int r = 0; r < size; r++)
        if (r != absent)
            pthread_join(th[r], NULL);
}

static void listeners(int size, int *lfd, int *port)
{
    for (int r = 0; r < size; r++)
        REQUIRE(tcp_listen("127.0.0.1", &lfd[r], &port[r]) == 0);
}

static void listeners_close(int size, int *lfd)
{
    for (int r = 0; r < size; r++)
        close(lfd[r]);
}

static void test_mesh_with_strangers(void)
{
    int lfd[3], port[3];
    listeners(3, lfd, port);
    uint64_t malformed = mesh_rejections(MESH_REJECT_MALFORMED);
    uint64_t stale = mesh_rejections(MESH_REJECT_STALE);
    uint64_t auth = mesh_rejections(MESH_REJECT_AUTH);

    /* Before any rank: garbage, an idle socket, F2's injection posing as
     * rank 1 and as rank 2, a stale generation's rank, at ranks 0 and 1. */
    int s[8], n = 0;
    s[n] = raw_connect(port[0]);
    REQUIRE(write(s[n], "GET / HTTP/1.1\r\n\r\n", 18) == 18);
    n++;
    s[n++] = raw_connect(port[0]);
    s[n] = raw_connect(port[0]);
    raw_hello(s[n], JOB, GEN, 1, 0);
    raw_inject(s[n++]);
    s[n] = raw_connect(port[0]);
    raw_hello(s[n], JOB, GEN, 2, 0);
    raw_inject(s[n++]);
    s[n] = raw_connect(port[1]);
    raw_hello(s[n], JOB, GEN - 1, 2, 1);
    n++;
    s[n++] = raw_connect(port[1]);

    struct rank_run runs[3];
    run_mesh(runs, 3, lfd, port, -1, NULL, 10000);
    for (int r = 0; r < 3; r++) {
        CHECK_EQ_INT(runs[r].code, 0);
        if (runs[r].code)
            fprintf(stderr, "rank %d: %s\n", r, runs[r].err);
        /* the idle ones held up nothing */
        CHECK(runs[r].took_ms < 3000);
        CHECK_EQ_INT(runs[r].exchanged, 2);
    }
    CHECK(mesh_rejections(MESH_REJECT_MALFORMED) >= malformed + 1);
    CHECK(mesh_rejections(MESH_REJECT_STALE) >= stale + 1);
    CHECK(mesh_rejections(MESH_REJECT_AUTH) >= auth + 2);
    for (int i = 0; i < n; i++)
        close(s[i]);
    listeners_close(3, lfd);
}

static void test_mesh_flood(void)
{
    int lfd[2], port[2];
    listeners(2, lfd, port);
    uint64_t crowded = mesh_rejections(MESH_REJECT_CROWDED);
    enum { FLOOD = MESH_PENDING + 40 };
    int s[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        s[i] = raw_connect(port[0]);
    struct rank_run runs[2];
    run_mesh(runs, 2, lfd, port, -1, NULL, 10000);
    CHECK_EQ_INT(runs[0].code, 0);
    CHECK_EQ_INT(runs[1].code, 0);
    CHECK_EQ_INT(runs[0].exchanged, 1);
    CHECK(mesh_rejections(MESH_REJECT_CROWDED) >= crowded + 40);
    for (int i = 0; i < FLOOD; i++)
        close(s[i]);
    listeners_close(2, lfd);
}

static void test_mesh_missing_rank(void)
{
    int lfd[3], port[3];
    listeners(3, lfd, port);
    struct rank_run runs[3];
    run_mesh(runs, 3, lfd, port, 2, NULL, 800);
    for (int r = 0; r < 2; r++) {
        CHECK_EQ_INT(runs[r].code, KOLO_ETIMEDOUT);
        CHECK(strstr(runs[r].err, "rank(s) 2") != NULL);
        CHECK(runs[r].took_ms >= 780 && runs[r].took_ms < 3000);
    }
    listeners_close(3, lfd);
}

static void test_mesh_wrong_key(void)
{
    int lfd[2], port[2];
    listeners(2, lfd, port);
    const char *keys[2] = {NULL, "another generation's key........"};
    struct rank_run runs[2];
    run_mesh(runs, 2, lfd, port, -1, keys, 1500);
    CHECK_EQ_INT(runs[1].code, KOLO_EAUTH);
    CHECK(strstr(runs[1].err, "rank 0") != NULL);
    CHECK_EQ_INT(runs[0].code, KOLO_ETIMEDOUT);
    listeners_close(2, lfd);
}

/* One rank: nothing to connect, nothing to wait for. */
static void test_mesh_one_rank(void)
{
    int lfd[1], port[1];
    listeners(1, lfd, port);
    struct rank_run runs[1];
    run_mesh(runs, 1, lfd, port, -1, NULL, 1000);
    CHECK_EQ_INT(runs[0].code, 0);
    CHECK(runs[0].took_ms < 100);
    listeners_close(1, lfd);
}

int main(void)
{
    test_forged_proof();
    test_wrong_key_pair();
    test_mesh_one_rank();
    test_mesh_with_strangers();
    test_mesh_flood();
    test_mesh_missing_rank();
    test_mesh_wrong_key();
    TEST_DONE();
}
