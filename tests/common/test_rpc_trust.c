/*
 * test_rpc_trust.c - what the RPC server knows of its callers and what it
 * holds for them before they prove anything (issue 28): the caller's uid
 * from the kernel over IPv4 and IPv6, for another local user too, cheap
 * with thousands of sockets open; a token-less server's strangers stay
 * unproven; frames in progress evicted past the slow bound; parked calls
 * capped per caller, and busy retried; TLS connections that never
 * handshake closed.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <grp.h>
#include <sys/wait.h>

#include "errors.h"
#include "rpc.h"
#include "rpc_raw.h"
#include "test.h"
#include "tls.h"
#include "util.h"

static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rpc_call *held[512];
static int nheld;
static atomic_int handled;

/* T.Uid answers the caller's uid; T.Hold keeps the call (answered by
 * release_one); anything else echoes. */
static void handler(struct rpc_call *call, void *arg)
{
    (void)arg;
    const struct rpc_frame *f = rpc_call_frame(call);
    atomic_fetch_add(&handled, 1);
    if (strcmp(f->method, "T.Uid") == 0) {
        char out[32];
        snprintf(out, sizeof out, "%d", rpc_call_peer_uid(call));
        rpc_call_reply(call, out, strlen(out));
        return;
    }
    if (strcmp(f->method, "T.Hold") == 0) {
        pthread_mutex_lock(&held_mu);
        if (nheld < 512) {
            held[nheld++] = call;
            pthread_mutex_unlock(&held_mu);
            return;
        }
        pthread_mutex_unlock(&held_mu);
    }
    rpc_call_reply(call, f->body, f->body_len);
}

static void release_all(void)
{
    pthread_mutex_lock(&held_mu);
    while (nheld > 0)
        rpc_call_reply(held[--nheld], "r", 1);
    pthread_mutex_unlock(&held_mu);
}

static int uid_call(struct rpc_client *cli)
{
    void *rep = NULL;
    size_t len = 0;
    char err[256], buf[32] = "";
    int rc = rpc_client_call(cli, "T.Uid", NULL, 0, &rep, &len, 3000, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "T.Uid: %s\n", err);
        return -2;
    }
    memcpy(buf, rep, len < sizeof buf - 1 ? len : sizeof buf - 1);
    free(rep);
    return atoi(buf);
}

/* A server on loopback TCP (unless cfg names another URL) with the
 * handler above. */
static struct rpc_server *serve(struct rpc_server_config cfg)
{
    struct rpc_server *srv = NULL;
    if (!cfg.url)
        cfg.url = "tcp://127.0.0.1:0";
    cfg.handler = handler;
    REQUIRE(rpc_server_open(&srv, &cfg) == 0);
    return srv;
}

static struct rpc_client *client_at(const char *url, uint64_t job, int rank, bool retry)
{
    struct rpc_client *cli = NULL;
    struct rpc_client_config cc = {
        .url = url, .identity = "t", .job_id = job, .rank = rank, .retry_busy = retry};
    REQUIRE(rpc_client_open(&cli, &cc) == 0);
    return cli;
}

/* ---- raw frames (no nng in a forked child) ---- */

static int raw_connect(int port)
{
    int fd = raw_tcp_connect(port);
    REQUIRE(fd >= 0);
    return fd;
}

/* One token-less request on fd (greeted when greet), its reply body as a
 * number (T.Uid), or -2 when the server closes instead. */
static int raw_uid(int fd, bool greet, uint32_t reqid)
{
    struct rpc_frame f = {0};
    f.version = KOLO_PROTO_VERSION;
    f.kind = RPC_REQUEST;
    f.ts_ms = now_wall_ms();
    random_bytes(f.nonce, sizeof f.nonce);
    strcpy(f.method, "T.Uid");
    uint8_t *data;
    size_t len;
    if (rpc_frame_encode(&f, NULL, &data, &len) != 0)
        return -3;
    uint8_t out[12 + 512];
    size_t n = 0;
    if (greet) {
        const uint8_t hello[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0}; /* req0 */
        memcpy(out, hello, 8);
        n = 8;
    }
    uint64_t wire = len + 4;
    for (int i = 0; i < 8; i++)
        out[n + (size_t)i] = (uint8_t)(wire >> (56 - 8 * i));
    n += 8;
    out[n++] = (uint8_t)(0x80 | (reqid >> 24));
    out[n++] = (uint8_t)(reqid >> 16);
    out[n++] = (uint8_t)(reqid >> 8);
    out[n++] = (uint8_t)reqid;
    memcpy(out + n, data, len);
    n += len;
    free(data);
    if (write(fd, out, n) != (ssize_t)n)
        return -2;
    uint8_t peer[8], head[12];
    if ((greet && read_full(fd, peer, 8) != 0) || read_full(fd, head, 12) != 0)
        return -2;
    uint64_t rlen = 0;
    for (int i = 0; i < 8; i++)
        rlen = rlen << 8 | head[i];
    if (rlen < 4 || rlen > 4096)
        return -2;
    uint8_t body[4096];
    struct rpc_frame rf;
    if (read_full(fd, body, rlen - 4) != 0 || rpc_frame_decode(body, rlen - 4, &rf) != 0)
        return -2;
    char num[32] = "";
    memcpy(num, rf.body, rf.body_len < 31 ? rf.body_len : 31);
    return atoi(num);
}

static int url_port(const char *url)
{
    const char *c = strrchr(url, ':');
    return c ? atoi(c + 1) : 0;
}

/* ---- tests ---- */

/* The kernel's answer, IPv4 and IPv6 (the /proc/net/tcp scan it replaces
 * knew only IPv4: a token-less coordinator on [::1] refused its own user). */
static void test_peer_uid_families(void)
{
    const char *urls[] = {"tcp://127.0.0.1:0", "tcp://[::1]:0", "inproc://trust-uid"};
    for (int i = 0; i < 3; i++) {
        struct rpc_server *srv = NULL;
        struct rpc_server_config cfg = {.url = urls[i], .contexts = 8, .handler = handler};
        if (rpc_server_open(&srv, &cfg) != 0) {
            fprintf(stderr, "note: cannot listen on %s (no IPv6 here?)\n", urls[i]);
            continue;
        }
        struct rpc_client *cli = client_at(rpc_server_url(srv), 0, 0, false);
        int uid = uid_call(cli);
        if (uid != (int)geteuid())
            fprintf(stderr, "%s: uid %d, expected %d\n", urls[i], uid, (int)geteuid());
        CHECK_EQ_INT(uid, (int)geteuid());
        CHECK_EQ_INT(uid_call(cli), (int)geteuid()); /* the cached answer */
        rpc_client_close(cli);
        rpc_server_close(srv);
    }
}

/* Another local user (nobody) gets its own uid, and on a token-less
 * server its connection stays unproven: closed at the handshake time
 * however many requests it sends. Needs root to become nobody. */
static void test_peer_uid_other_user(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "note: not root, the other-user case is skipped\n");
        return;
    }
    struct rpc_server *srv = serve((struct rpc_server_config){.contexts = 8, .handshake_ms = 600});
    int port = url_port(rpc_server_url(srv));
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int res[2] = {-9, -9};
        if (setgroups(0, NULL) == 0 && setresgid(65534, 65534, 65534) == 0 &&
            setresuid(65534, 65534, 65534) == 0) {
            int fd = raw_connect(port);
            if (fd >= 0) {
                res[0] = raw_uid(fd, true, 1);
                /* a valid request does not prove a stranger: the
                 * connection is still closed at the handshake time */
                usleep(1500 * 1000);
                res[1] = raw_uid(fd, false, 2);
                close(fd);
            }
        }
        if (write(pfd[1], res, sizeof res) != (ssize_t)sizeof res)
            _exit(2);
        _exit(0);
    }
    close(pfd[1]);
    int res[2] = {-9, -9};
    CHECK(read_full(pfd[0], res, sizeof res) == 0);
    close(pfd[0]);
    int status;
    waitpid(pid, &status, 0);
    CHECK_EQ_INT(res[0], 65534);
    CHECK_EQ_INT(res[1], -2);
    struct rpc_server_stats st;
    rpc_server_get_stats(srv, &st);
    CHECK(st.conns_timed_out >= 1);
    rpc_server_close(srv);
}

/* With thousands of TCP sockets open, a call that asks for the caller's
 * uid still costs microseconds (a table scan cost milliseconds: 8,000
 * sockets made /healthz take 0.3 s), first call of a connection or not. */
static void test_peer_uid_cost(void)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    int want = 6000 * 2 + 256;
    if (rl.rlim_cur < (rlim_t)want && rl.rlim_max >= (rlim_t)want) {
        rl.rlim_cur = (rlim_t)want;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    getrlimit(RLIMIT_NOFILE, &rl);
    int pairs = rl.rlim_cur > 2300 ? ((int)rl.rlim_cur - 256) / 2 : 0;
    pairs = pairs > 6000 ? 6000 : pairs;
    /* a listener of our own and pairs loopback connections to it */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    REQUIRE(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4096) == 0 &&
            getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    int *fds = calloc((size_t)pairs * 2, sizeof *fds);
    int open_pairs = 0;
    for (int i = 0; i < pairs; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof sa) != 0) {
            if (c >= 0)
                close(c);
            break;
        }
        int a = accept(lfd, NULL, NULL);
        if (a < 0) {
            close(c);
            break;
        }
        fds[2 * i] = c;
        fds[2 * i + 1] = a;
        open_pairs++;
    }
    fprintf(stderr, "note: %d extra TCP sockets open\n", open_pairs * 2 + 1);
    struct rpc_server *srv = serve((struct rpc_server_config){.contexts = 16});
    struct rpc_client *cli = client_at(rpc_server_url(srv), 0, 0, false);
    CHECK_EQ_INT(uid_call(cli), (int)geteuid());
    uint64_t t0 = now_mono_us();
    int calls = 500;
    for (int i = 0; i < calls; i++)
        CHECK_EQ_INT(uid_call(cli), (int)geteuid());
    double per_call_us = (double)(now_mono_us() - t0) / calls;
    /* and the first call of 40 new connections (one kernel query each) */
    t0 = now_mono_us();
    for (int i = 0; i < 40; i++) {
        struct rpc_client *c2 = client_at(rpc_server_url(srv), 0, 0, false);
        CHECK_EQ_INT(uid_call(c2), (int)geteuid());
        rpc_client_close(c2);
    }
    double first_ms = (double)(now_mono_us() - t0) / 1e3 / 40;
    fprintf(stderr,
            "note: T.Uid %.1f us per call on one connection, %.2f ms per new connection "
            "(connect included), %d sockets open\n",
            per_call_us, first_ms, open_pairs * 2 + 1);
    CHECK(per_call_us < 1000);
    CHECK(first_ms < 20);
    rpc_client_close(cli);
    rpc_server_close(srv);
    for (int i = 0; i < open_pairs * 2; i++)
        close(fds[i]);
    free(fds);
    close(lfd);
}

/* Connections that declared a frame and send it are the ones that hold
 * memory before authentication: while more than the budget sits on
 * unproven connections (the kernel's count of bytes each received), the
 * heaviest go; idle ones hold nothing and stay (rpc.h). A frame over the
 * cap is refused from its header. */
static void test_unproven_budget(void)
{
    struct rpc_server *srv = serve((struct rpc_server_config){
        .contexts = 8, .handshake_ms = 8000, .unproven_budget = 4u << 20});
    int port = url_port(rpc_server_url(srv));
    const uint8_t hello[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
    int idle[4];
    for (int i = 0; i < 4; i++) {
        idle[i] = raw_connect(port);
        REQUIRE(write(idle[i], hello, 8) == 8);
    }
    /* 12 x 600 KiB sent of frames declared under the cap: 7.2 MiB */
    enum { SENT = 600 << 10 };
    uint8_t *head = malloc(16 + SENT);
    REQUIRE(head != NULL);
    memset(head, 'x', 16 + SENT);
    memcpy(head, hello, 8);
    uint64_t declared = RPC_MAX_REQUEST - 1024;
    for (int k = 0; k < 8; k++)
        head[8 + k] = (uint8_t)(declared >> (56 - 8 * k));
    int fds[12];
    for (int i = 0; i < 12; i++) {
        fds[i] = raw_connect(port);
        REQUIRE(write(fds[i], head, 16 + SENT) == 16 + SENT);
    }
    free(head);
    struct rpc_server_stats st;
    uint64_t t0 = now_mono_ms();
    do {
        usleep(50000);
        rpc_server_get_stats(srv, &st);
    } while (st.conns_evicted < 6 && now_mono_ms() - t0 < 4000);
    usleep(600 * 1000); /* and no more than needed, over a few sweeps */
    rpc_server_get_stats(srv, &st);
    CHECK_EQ_INT((int)st.conns_evicted, 6); /* 7.2 MiB - 6 x 600 KiB <= 4 MiB */
    CHECK_EQ_INT((int)st.conns_timed_out, 0);
    for (int i = 0; i < 4; i++) { /* the idle ones are still open: the */
        uint8_t greeting[8];          /* server's greeting, then nothing */
        CHECK(read_full(idle[i], greeting, 8) == 0);
        struct pollfd p = {.fd = idle[i], .events = POLLIN};
        CHECK_EQ_INT(poll(&p, 1, 0), 0);
        close(idle[i]);
    }
    /* and a header over the cap is refused at once */
    int big = raw_connect(port);
    uint8_t over[16] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
    declared = 32u << 20;
    for (int k = 0; k < 8; k++)
        over[8 + k] = (uint8_t)(declared >> (56 - 8 * k));
    REQUIRE(write(big, over, sizeof over) == (ssize_t)sizeof over);
    uint8_t peer[8], b;
    CHECK(read_full(big, peer, 8) == 0);
    t0 = now_mono_ms();
    CHECK(read(big, &b, 1) <= 0); /* closed, not a 3 s read timeout */
    CHECK(now_mono_ms() - t0 < 2000);
    close(big);
    /* a client that speaks still gets through */
    struct rpc_client *cli = client_at(rpc_server_url(srv), 0, 0, false);
    CHECK_EQ_INT(uid_call(cli), (int)geteuid());
    rpc_client_close(cli);
    for (int i = 0; i < 12; i++)
        close(fds[i]);
    rpc_server_close(srv);
}

static atomic_int async_ok, async_busy, async_other;

static void count_done(void *arg, int code, const void *rep, size_t len, const char *err)
{
    (void)arg;
    (void)rep;
    (void)len;
    (void)err;
    if (code == 0)
        atomic_fetch_add(&async_ok, 1);
    else if (code == KOLO_EBUSY)
        atomic_fetch_add(&async_busy, 1);
    else
        atomic_fetch_add(&async_other, 1);
}

struct patient_call {
    struct rpc_client *cli;
    int rc;
    uint64_t took_ms;
};

static void *patient_main(void *arg)
{
    struct patient_call *pc = arg;
    void *rep = NULL;
    size_t len;
    char err[256];
    uint64_t t0 = now_mono_ms();
    pc->rc = rpc_client_call(pc->cli, "T.Echo", "p", 1, &rep, &len, 5000, err, sizeof err);
    pc->took_ms = now_mono_ms() - t0;
    free(rep);
    return NULL;
}

static void wait_handled(int n)
{
    uint64_t t0 = now_mono_ms();
    while (atomic_load(&handled) < n && now_mono_ms() - t0 < 5000)
        usleep(5000);
}

/* One caller parks calls over many connections: it holds at most its
 * share (a quarter of the contexts, at least 128), another caller is not
 * held to it, and a client that retries busy gets through once one of
 * the first caller's calls returns, within its deadline. */
static void test_parked_per_caller(void)
{
    struct rpc_server *srv = serve((struct rpc_server_config){.contexts = 400});
    const char *url = rpc_server_url(srv);
    atomic_store(&handled, 0);
    atomic_store(&async_ok, 0);
    atomic_store(&async_busy, 0);
    /* 4 connections x 40 parked: 160, over the share of 128 */
    struct rpc_client *admin[4];
    for (int c = 0; c < 4; c++) {
        admin[c] = client_at(url, 0, 0, false);
        for (int i = 0; i < 40; i++)
            REQUIRE(rpc_client_call_async(admin[c], "T.Hold", "x", 1, 20000, count_done, NULL) ==
                    0);
    }
    uint64_t t0 = now_mono_ms();
    while (atomic_load(&async_busy) < 32 && now_mono_ms() - t0 < 5000)
        usleep(5000);
    CHECK_EQ_INT(atomic_load(&async_busy), 32);
    pthread_mutex_lock(&held_mu);
    CHECK_EQ_INT(nheld, 128);
    pthread_mutex_unlock(&held_mu);
    struct rpc_server_stats st;
    rpc_server_get_stats(srv, &st);
    CHECK_EQ_INT((int)st.busy_refused, 32);
    /* the same caller on a fresh connection: busy, with the reason */
    struct rpc_client *more = client_at(url, 0, 0, false);
    void *rep = NULL;
    size_t len;
    char err[256];
    CHECK_EQ_INT(rpc_client_call(more, "T.Echo", "a", 1, &rep, &len, 2000, err, sizeof err),
                 KOLO_EBUSY);
    CHECK(strstr(err, "over all your connections") != NULL);
    /* a training process (its own job and rank) is another caller */
    struct rpc_client *rank = client_at(url, 7, 3, false);
    CHECK_EQ_INT(rpc_client_call(rank, "T.Echo", "a", 1, &rep, &len, 2000, err, sizeof err), 0);
    free(rep);
    /* retry_busy: the same caller waits for room instead of failing */
    struct patient_call pc = {.cli = client_at(url, 0, 0, true)};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, patient_main, &pc) == 0);
    usleep(300 * 1000);
    pthread_mutex_lock(&held_mu);
    rpc_call_reply(held[--nheld], "r", 1);
    pthread_mutex_unlock(&held_mu);
    pthread_join(th, NULL);
    CHECK_EQ_INT(pc.rc, 0);
    CHECK(pc.took_ms >= 250 && pc.took_ms < 5000);
    release_all();
    t0 = now_mono_ms();
    while (atomic_load(&async_ok) < 128 && now_mono_ms() - t0 < 5000)
        usleep(5000);
    CHECK_EQ_INT(atomic_load(&async_ok), 128);
    CHECK_EQ_INT(atomic_load(&async_other), 0);
    struct rpc_client *patient = pc.cli;
    rpc_client_close(patient);
    rpc_client_close(rank);
    rpc_client_close(more);
    for (int c = 0; c < 4; c++)
        rpc_client_close(admin[c]);
    release_all();
    rpc_server_close(srv);
}

/* A busy async call is sent again until room is made, within its
 * deadline; one whose deadline passes first ends busy. */
static void test_async_busy_retry(void)
{
    struct rpc_server *srv = serve(
        (struct rpc_server_config){.contexts = 16, .reserved_prefix = "T.Agent", .reserved = 4});
    const char *url = rpc_server_url(srv);
    atomic_store(&handled, 0);
    struct rpc_client *hog = client_at(url, 0, 0, false);
    for (int i = 0; i < 12; i++)
        REQUIRE(rpc_client_call_async(hog, "T.Hold", "x", 1, 20000, count_done, NULL) == 0);
    wait_handled(12);
    atomic_store(&async_ok, 0);
    atomic_store(&async_busy, 0);
    struct rpc_client *rank = client_at(url, 9, 0, true);
    REQUIRE(rpc_client_call_async(rank, "T.Echo", "a", 1, 400, count_done, NULL) == 0);
    uint64_t t0 = now_mono_ms();
    while (atomic_load(&async_busy) < 1 && now_mono_ms() - t0 < 3000)
        usleep(5000);
    CHECK_EQ_INT(atomic_load(&async_busy), 1); /* its deadline passed first */
    REQUIRE(rpc_client_call_async(rank, "T.Echo", "b", 1, 5000, count_done, NULL) == 0);
    usleep(300 * 1000);
    CHECK_EQ_INT(atomic_load(&async_ok), 0);
    pthread_mutex_lock(&held_mu);
    rpc_call_reply(held[--nheld], "r", 1);
    pthread_mutex_unlock(&held_mu);
    t0 = now_mono_ms();
    while (atomic_load(&async_ok) < 2 && now_mono_ms() - t0 < 3000)
        usleep(5000);
    CHECK_EQ_INT(atomic_load(&async_ok), 2); /* the released one and the retried one */
    /* every call answered before any client closes: libnng 1.5.2 can hang
     * in nng_close when replies arrive while a socket closes (so can the
     * code before issue 28; rpc_client_close's comment) */
    release_all();
    t0 = now_mono_ms();
    while (atomic_load(&async_ok) < 13 && now_mono_ms() - t0 < 3000)
        usleep(5000);
    CHECK_EQ_INT(atomic_load(&async_ok), 13);
    rpc_client_close(rank);
    rpc_client_close(hog);
    rpc_server_close(srv);
}

/* A TLS port closes connections that never send a ClientHello within the
 * handshake time, as the plain port does (nng makes a pipe only after the
 * handshake, and puts no limit on it). */
static void test_tls_handshake_timeout(void)
{
    if (system("command -v openssl >/dev/null 2>&1") != 0) {
        fprintf(stderr, "note: openssl is missing, the TLS case is skipped\n");
        return;
    }
    char dir[64], cmd[512], err[512];
    snprintf(dir, sizeof dir, "/tmp/kolo-trust-tls.XXXXXX");
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "%s/scripts/tls-certs.sh %s localhost 127.0.0.1 >/dev/null",
             KOLO_SOURCE_DIR, dir);
    REQUIRE(system(cmd) == 0);
    struct tls_files f;
    REQUIRE(tls_files_init(&f, NULL, NULL, NULL, dir, err, sizeof err) == 0);
    struct rpc_server *srv = serve((struct rpc_server_config){
        .token = "trust-test-token-0123456789", .contexts = 8, .handshake_ms = 1000, .tls = &f});
    int port = url_port(rpc_server_url(srv));
    enum { N = 20 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = raw_connect(port);
        REQUIRE(fds[i] >= 0);
    }
    /* every one ends within a few sweeps of the handshake time */
    uint64_t t0 = now_mono_ms();
    int closed = 0;
    bool done[N] = {false};
    while (closed < N && now_mono_ms() - t0 < 6000) {
        for (int i = 0; i < N; i++) {
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            uint8_t b;
            if (!done[i] && poll(&p, 1, 0) == 1 && read(fds[i], &b, 1) <= 0) {
                done[i] = true;
                closed++;
            }
        }
        usleep(50000);
    }
    uint64_t took = now_mono_ms() - t0;
    fprintf(stderr, "note: %d of %d silent TLS connections closed in %llu ms\n", closed, N,
            (unsigned long long)took);
    CHECK_EQ_INT(closed, N);
    struct rpc_server_stats st;
    rpc_server_get_stats(srv, &st);
    CHECK((int)st.conns_timed_out >= N);
    /* and a real TLS client still gets through */
    struct rpc_client *cli = NULL;
    struct rpc_client_config cc = {
        .url = rpc_server_url(srv), .token = "trust-test-token-0123456789", .tls = &f};
    REQUIRE(rpc_client_open(&cli, &cc) == 0);
    void *rep = NULL;
    size_t len;
    CHECK_EQ_INT(rpc_client_call(cli, "T.Echo", "t", 1, &rep, &len, 5000, err, sizeof err), 0);
    free(rep);
    rpc_client_close(cli);
    for (int i = 0; i < N; i++)
        close(fds[i]);
    rpc_server_close(srv);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    REQUIRE(system(cmd) == 0);
}

int main(void)
{
    test_peer_uid_families();
    test_peer_uid_other_user();
    test_unproven_budget();
    test_parked_per_caller();
    test_async_busy_retry();
    test_tls_handshake_timeout();
    test_peer_uid_cost();
    TEST_DONE();
}
