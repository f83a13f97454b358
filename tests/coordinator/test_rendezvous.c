/*
 * test_rendezvous.c - the rendezvous reply's two forms (issue 29), with
 * the coordinator in-process over real RPC: a rank that asks for the
 * compact peer table gets the topology's hosts with their ranks'
 * address, ports, pids and segment and no PeerInfo; a rank that does not
 * ask (an older libkolo) gets one PeerInfo a rank; a generation whose
 * ranks on one host listen on different addresses, or whose address is
 * not "tcp:ADDR:PORT", falls back to the table for everyone. The size of
 * the compact reply at 512 ranks on 64 hosts is bounded by O(ranks).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "errors.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "test.h"
#include "coord_harness.h"
#include "util.h"

static struct coord *coord;

/* One rank's join: who it says it is, and the reply it got. */
struct joiner {
    uint64_t job;
    int rank, size;
    char host[32], addr[48], shm[32], machine[40];
    bool compact;
    uint64_t kept; /* RendezvousRequest.kept_segment */
    Kolo__RendezvousReply *rep;
    size_t reply_bytes;
};

static void *join_main(void *arg)
{
    struct joiner *j = arg;
    struct rpc_client *cli = harness_client(coord_rpc_url(coord), j->job, 1, j->rank);
    Kolo__RendezvousRequest req = KOLO__RENDEZVOUS_REQUEST__INIT;
    char *addrs[1] = {j->addr};
    req.host_id = j->host;
    req.data_addrs = addrs;
    req.n_data_addrs = 1;
    req.pid = 1000 + j->rank;
    req.shm_name = j->shm;
    req.machine = j->machine;
    req.wait_ms = 10000;
    req.size = j->size;
    req.compact_peers = j->compact;
    req.kept_segment = j->kept;
    uint8_t buf[512];
    size_t len = kolo__rendezvous_request__pack(&req, buf);
    char err[512];
    void *out = NULL;
    size_t olen = 0;
    int rv = 0;
    /* as libkolo does: a call that did not get through (hundreds of
     * connections at once) is made again, and so is one whose wait
     * passed before every rank joined (a slow, sanitized build) */
    for (int tries = 0; tries < 40; tries++) {
        free(out);
        out = NULL;
        rv = rpc_client_call(cli, "WorkerService.Rendezvous", buf, len, &out, &olen, 15000, err,
                             sizeof err);
        if (rv == KOLO_EIO || rv == KOLO_ECONNREFUSED || rv == KOLO_ETIMEDOUT || rv == KOLO_EBUSY) {
            usleep(100 * 1000);
            continue;
        }
        if (rv)
            break;
        if (j->rep)
            kolo__rendezvous_reply__free_unpacked(j->rep, NULL);
        j->rep = kolo__rendezvous_reply__unpack(NULL, olen, out);
        if (!j->rep || j->rep->complete)
            break;
    }
    if (rv)
        fprintf(stderr, "rank %d: %s\n", j->rank, err);
    REQUIRE(rv == 0);
    j->reply_bytes = olen;
    if (!j->rep || !j->rep->complete)
        fprintf(stderr, "rank %d of %d: reply of %zu bytes, %s\n", j->rank, j->size, olen,
                j->rep ? "not complete" : "malformed");
    REQUIRE(j->rep && j->rep->complete);
    free(out);
    rpc_client_close(cli);
    return NULL;
}

/* Every rank of a job joins (threads); the replies in js. order: the
 * ranks in the order they join, 50 ms apart (NULL: all at once). */
static void join_in_order(struct joiner *js, int n, const int *order)
{
    pthread_t *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        int r = order ? order[i] : i;
        REQUIRE(pthread_create(&t[r], NULL, join_main, &js[r]) == 0);
        if (order)
            usleep(50 * 1000);
    }
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
    free(t);
}

static void join_all(struct joiner *js, int n)
{
    join_in_order(js, n, NULL);
}

static void free_all(struct joiner *js, int n)
{
    for (int r = 0; r < n; r++)
        kolo__rendezvous_reply__free_unpacked(js[r].rep, NULL);
}

static void joiner_set(struct joiner *j, uint64_t job, int rank, int size, const char *host,
                       const char *ip, const char *shm, bool compact)
{
    *j = (struct joiner){.job = job, .rank = rank, .size = size, .compact = compact};
    snprintf(j->host, sizeof j->host, "%s", host);
    snprintf(j->addr, sizeof j->addr, "tcp:%s:%d", ip, 20000 + rank);
    snprintf(j->shm, sizeof j->shm, "%s", shm);
    snprintf(j->machine, sizeof j->machine, "boot-%s", host); /* RendezvousRequest.machine */
}

/* A compact reply: hosts a (ranks 0, 2; rank 0 made its segment) and b
 * (ranks 3, 1; rank 3 made its segment, so it leads). b's ranks kept a
 * segment from an earlier generation (0xb00 + their member index): the
 * host lists their codes in local order, a (none kept) lists none. */
static void check_compact(const Kolo__RendezvousReply *rep)
{
    CHECK_EQ_INT((int)rep->n_peers, 0);
    REQUIRE(rep->n_hosts == 2);
    const Kolo__TopoHost *a = rep->hosts[0], *b = rep->hosts[1];
    CHECK(strcmp(a->host_id, "a") == 0 && strcmp(b->host_id, "b") == 0);
    REQUIRE(a->n_ranks == 2 && a->n_ports == 2 && a->n_pids == 2);
    REQUIRE(b->n_ranks == 2 && b->n_ports == 2 && b->n_pids == 2);
    CHECK(a->ranks[0] == 0 && a->ranks[1] == 2 && b->ranks[0] == 3 && b->ranks[1] == 1);
    CHECK(strcmp(a->data_host, "127.0.0.1") == 0 && strcmp(b->data_host, "127.0.0.1") == 0);
    CHECK(a->ports[0] == 20000 && a->ports[1] == 20002);
    CHECK(b->ports[0] == 20003 && b->ports[1] == 20001);
    CHECK(a->pids[1] == 1002 && b->pids[0] == 1003);
    CHECK(strcmp(a->shm_name, "seg-a") == 0 && strcmp(b->shm_name, "seg-b") == 0);
    CHECK(strcmp(a->machine, "boot-a") == 0 && strcmp(b->machine, "boot-b") == 0);
    CHECK_EQ_INT((int)a->n_kept_segments, 0);
    REQUIRE(b->n_kept_segments == 2);
    CHECK(b->kept_segments[0] == 0xb00 && b->kept_segments[1] == 0xb01);
}

/* A peer table: one PeerInfo a rank, as an older libkolo reads it;
 * kept: the ranks' kept segments are test_forms' (else none). */
static void check_table(const Kolo__RendezvousReply *rep, int size, bool kept)
{
    REQUIRE((int)rep->n_peers == size);
    for (int r = 0; r < size; r++) {
        CHECK_EQ_INT(rep->peers[r]->rank, r);
        CHECK_EQ_INT(rep->peers[r]->pid, 1000 + r);
        CHECK(strncmp(rep->peers[r]->machine, "boot-", 5) == 0 &&
              strcmp(rep->peers[r]->machine + 5, rep->peers[r]->host_id) == 0);
        REQUIRE(rep->peers[r]->n_data_addrs == 1);
        uint64_t want = !kept ? 0 : r == 3 ? 0xb00 : r == 1 ? 0xb01 : 0;
        CHECK(rep->peers[r]->kept_segment == want);
    }
    for (size_t h = 0; h < rep->n_hosts; h++)
        CHECK(rep->hosts[h]->n_ports == 0 && rep->hosts[h]->data_host[0] == '\0');
}

static void test_forms(void)
{
    uint64_t job = harness_submit_job(coord_rpc_url(coord), "forms", 4);
    struct joiner js[4];
    joiner_set(&js[0], job, 0, 4, "a", "127.0.0.1", "seg-a", true);
    joiner_set(&js[1], job, 1, 4, "b", "127.0.0.1", "", true);
    joiner_set(&js[2], job, 2, 4, "a", "127.0.0.1", "", true);
    joiner_set(&js[3], job, 3, 4, "b", "127.0.0.1", "seg-b", false); /* an older libkolo */
    js[3].kept = 0xb00;
    js[1].kept = 0xb01;
    /* the older libkolo's table goes out between compact replies (the
     * parked ones are answered in rank order, the last to join after) */
    static const int order[] = {3, 0, 1, 2};
    join_in_order(js, 4, order);
    for (int r = 0; r < 3; r++)
        check_compact(js[r].rep);
    check_table(js[3].rep, 4, true);
    REQUIRE(js[3].rep->n_hosts == 2); /* the topology alone */
    CHECK(js[3].rep->hosts[1]->ranks[0] == 3);
    free_all(js, 4);
}

/* Host a's ranks listen on two addresses; job 3's rank 1 names no tcp
 * address: both get the table though every rank asks for the compact
 * form. */
static void test_fallback(void)
{
    uint64_t job = harness_submit_job(coord_rpc_url(coord), "mixed", 3);
    struct joiner js[3];
    joiner_set(&js[0], job, 0, 3, "a", "127.0.0.1", "seg-m", true);
    joiner_set(&js[1], job, 1, 3, "a", "127.0.0.2", "", true);
    joiner_set(&js[2], job, 2, 3, "c", "127.0.0.1", "", true);
    join_all(js, 3);
    for (int r = 0; r < 3; r++)
        check_table(js[r].rep, 3, false);
    free_all(js, 3);

    job = harness_submit_job(coord_rpc_url(coord), "odd", 2);
    joiner_set(&js[0], job, 0, 2, "a", "127.0.0.1", "", true);
    joiner_set(&js[1], job, 1, 2, "c", "127.0.0.1", "", true);
    snprintf(js[1].addr, sizeof js[1].addr, "unix:/tmp/x");
    join_all(js, 2);
    for (int r = 0; r < 2; r++)
        check_table(js[r].rep, 2, false);
    free_all(js, 2);
}

/* 512 ranks on 64 hosts of 8: the compact reply grows with the ranks
 * (a few bytes a rank), the table with ranks times the bytes of a
 * PeerInfo; what every rank's reply costs the coordinator and the ranks
 * at 1,024 is O(ranks^2) in the table form. */
static void test_size(void)
{
    enum { N = 512, L = 8 };
    for (int compact = 1; compact >= 0; compact--) {
        uint64_t job = harness_submit_job(coord_rpc_url(coord), compact ? "big-c" : "big-t", N);
        struct joiner *js = calloc(N, sizeof *js);
        for (int r = 0; r < N; r++) {
            char host[32];
            snprintf(host, sizeof host, "sim-host-%d", r / L);
            joiner_set(&js[r], job, r, N, host, "127.0.0.1", r % L ? "" : "kolo-seg-xxxxxxxx",
                       compact);
        }
        join_all(js, N);
        size_t most = 0;
        for (int r = 0; r < N; r++)
            most = js[r].reply_bytes > most ? js[r].reply_bytes : most;
        fprintf(stderr, "   %s reply at %d ranks on %d hosts: %zu bytes\n",
                compact ? "compact" : "table", N, N / L, most);
        if (compact) {
            CHECK(most <= (size_t)N * 16); /* ~10 bytes a rank and ~30 a host */
            CHECK_EQ_INT((int)js[N - 1].rep->n_hosts, N / L);
            CHECK_EQ_INT(js[N - 1].rep->hosts[N / L - 1]->ports[L - 1], 20000 + N - 1);
        } else {
            CHECK(most >= (size_t)N * 30);
        }
        free_all(js, N);
        free(js);
    }
}

int main(void)
{
    char dir[] = "/tmp/kolo-test-rdv-XXXXXX", db[128];
    REQUIRE(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/c.db", dir);
    struct coord_config cfg = {
        .listen = "tcp://127.0.0.1:0", .db_path = db, .lease_ms = 60000, .heartbeat_ms = 1000};
    coord = harness_coord_start(&cfg);
    test_forms();
    test_fallback();
    test_size();
    coord_stop(coord);
    test_remove_db(db, dir);
    TEST_DONE();
}
