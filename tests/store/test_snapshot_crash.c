/*
 * test_snapshot_crash.c - an acknowledged snapshot survives kill -9, and a
 * snapshot is stored whole or not at all.
 *
 * Each round forks a writer that commits snapshots as the coordinator
 * does: in one transaction, the snapshot (1-3 MiB in 256 KiB chunks) and
 * the pruning of all but the newest KEEP. After each commit returned 0 it
 * sends the snapshot's number and id down a pipe. The parent kills it at
 * a random moment, reopens the store and checks: the file is intact; every
 * stored snapshot of the job reads back byte for byte and matches its
 * checksum (no torn snapshot); no more than KEEP are stored; and the
 * newest acknowledged ones are there - the last KEEP - 1 always, the last
 * KEEP unless the snapshot in flight at the kill also made it.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "hmac.h"
#include "store.h"
#include "test.h"

#define KEEP  4
#define CHUNK (256u << 10)

static char dir[] = "/tmp/kolo-test-snap-crash-XXXXXX";
static char db_path[256];

struct ack {
    uint64_t k, id;
};

static size_t size_of(uint64_t k)
{
    return (1u << 20) + (size_t)((k * 2654435761u) % (2u << 20));
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

/* ----------------------------------------------------------------- writer */

static int commit(struct store *st, uint64_t job, uint64_t k, uint8_t *buf, uint64_t *id)
{
    size_t len = size_of(k);
    fill(buf, len, k);
    size_t n = (len + CHUNK - 1) / CHUNK;
    struct store_blob c[64];
    for (size_t i = 0; i < n; i++) {
        c[i].data = buf + i * CHUNK;
        c[i].len = i + 1 < n ? CHUNK : len - i * CHUNK;
    }
    uint8_t sum[SHA256_LEN];
    char sumhex[2 * SHA256_LEN + 1], meta[64];
    sha256(buf, len, sum);
    hex(sum, SHA256_LEN, sumhex);
    snprintf(meta, sizeof meta, "{\"k\":%" PRIu64 "}", k);
    struct store_snapshot s = {.job_id = job,
                               .generation = 1,
                               .upload_id = k,
                               .created_ms = k,
                               .meta_json = meta,
                               .total_bytes = len,
                               .checksum = sumhex,
                               .nchunks = (uint32_t)n};
    int err = store_begin(st);
    if (err)
        return err;
    err = store_snapshot_put(st, &s, c, n);
    if (!err)
        err = store_snapshot_prune(st, job, KEEP, NULL);
    if (err) {
        store_rollback(st);
        return err;
    }
    err = store_commit(st);
    *id = s.id;
    return err;
}

static void writer(int ack_fd, uint64_t job, uint64_t first)
{
    struct store *st = NULL;
    char err[256];
    if (store_open(&st, db_path, err, sizeof err) != 0) {
        fprintf(stderr, "writer: store_open: %s\n", err);
        _exit(2);
    }
    uint8_t *buf = malloc(4u << 20);
    if (!buf)
        _exit(2);
    for (uint64_t k = first;; k++) {
        struct ack a = {k, 0};
        int rc = commit(st, job, k, buf, &a.id);
        if (rc != 0) {
            fprintf(stderr, "writer: commit %" PRIu64 ": %s: %s\n", k, abi_errname(rc),
                    store_last_error(st));
            _exit(2);
        }
        if (write(ack_fd, &a, sizeof a) != (ssize_t)sizeof a)
            _exit(3);
    }
}

/* ----------------------------------------------------------------- parent */

struct found {
    uint64_t k[KEEP * 4];
    uint64_t id[KEEP * 4];
    int n;
};

struct gather {
    uint8_t *buf;
    size_t len, cap;
};

static int gather_chunk(const void *data, size_t len, void *arg)
{
    struct gather *g = arg;
    if (g->len + len > g->cap)
        return KOLO_ETOOBIG;
    memcpy(g->buf + g->len, data, len);
    g->len += len;
    return 0;
}

struct verify_ctx {
    struct store *st;
    struct found *f;
    int torn;
};

/* verify_one reads a stored snapshot back and compares it with what the
 * writer made for its k. */
static int verify_one(const struct store_snapshot *s, void *arg)
{
    struct verify_ctx *v = arg;
    uint64_t k = strtoull(strchr(s->meta_json, ':') + 1, NULL, 10);
    size_t len = size_of(k);
    struct gather g = {malloc(len + 1), 0, len};
    uint8_t *want = malloc(len + 1);
    REQUIRE(g.buf && want);
    fill(want, len, k);
    int rc = 0;
    for (uint32_t i = 0; i < s->nchunks && rc == 0; i++)
        rc = store_snapshot_chunk(v->st, s->job_id, s->id, i, gather_chunk, &g);
    uint8_t sum[SHA256_LEN];
    char sumhex[2 * SHA256_LEN + 1];
    sha256(want, len, sum);
    hex(sum, SHA256_LEN, sumhex);
    if (rc != 0 || g.len != len || s->total_bytes != len || memcmp(g.buf, want, len) != 0 ||
        strcmp(s->checksum, sumhex) != 0) {
        fprintf(stderr, "snapshot %" PRIu64 " (k %" PRIu64 ") is torn or wrong\n", s->id, k);
        v->torn++;
    }
    if (v->f->n < KEEP * 4) {
        v->f->k[v->f->n] = k;
        v->f->id[v->f->n++] = s->id;
    }
    free(g.buf);
    free(want);
    return 0;
}

static bool stored(const struct found *f, uint64_t k, uint64_t id)
{
    for (int i = 0; i < f->n; i++)
        if (f->k[i] == k)
            return f->id[i] == id;
    return false;
}

static void verify_round(int round, uint64_t job, const struct ack *acks, size_t nacks)
{
    struct store *st = NULL;
    char err[256];
    int rc = store_open(&st, db_path, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "round %d: reopen: %s\n", round, err);
    REQUIRE(rc == 0);
    rc = store_integrity_check(st, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "round %d: %s\n", round, err);
    CHECK_EQ_INT(rc, 0);

    struct found f = {0};
    struct verify_ctx v = {st, &f, 0};
    CHECK_EQ_INT(store_snapshots_each(st, job, 0, verify_one, &v), 0);
    CHECK_EQ_INT(v.torn, 0);
    CHECK(f.n <= KEEP);

    /* Which acknowledged snapshots must be there: the newest KEEP - 1
     * always; the newest KEEP when the one in flight did not land. */
    bool inflight_landed = nacks > 0 && f.n > 0 && f.k[0] == acks[nacks - 1].k + 1;
    size_t must = inflight_landed ? KEEP - 1 : KEEP;
    size_t missing = 0;
    for (size_t i = nacks > must ? nacks - must : 0; i < nacks; i++)
        if (!stored(&f, acks[i].k, acks[i].id)) {
            fprintf(stderr,
                    "round %d: acknowledged snapshot %" PRIu64 " (k %" PRIu64 ") is missing\n",
                    round, acks[i].id, acks[i].k);
            missing++;
        }
    CHECK_EQ_INT(missing, 0);
    printf("round %d: %zu snapshots acknowledged, %d stored, in flight %s\n", round, nacks, f.n,
           inflight_landed ? "landed" : "lost");
    store_close(st);
}

static void run_round(int round, uint64_t job, uint64_t first, unsigned delay_ms, uint64_t *next)
{
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        writer(fds[1], job, first);
        _exit(0);
    }
    close(fds[1]);
    struct ack *acks = NULL;
    size_t n = 0, cap = 0;
    /* The writer runs for delay_ms; its acks wait in the pipe (16 bytes
     * each, far below the pipe's capacity in that time). */
    usleep((useconds_t)delay_ms * 1000);
    kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    struct ack a;
    ssize_t got;
    while ((got = read(fds[0], &a, sizeof a)) == (ssize_t)sizeof a) {
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            acks = realloc(acks, cap * sizeof *acks);
            REQUIRE(acks);
        }
        acks[n++] = a;
    }
    CHECK_EQ_INT(got, 0);
    close(fds[0]);
    for (size_t i = 0; i < n; i++)
        REQUIRE(acks[i].k == first + i);
    verify_round(round, job, acks, n);
    *next = first + n + 1;
    free(acks);
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(db_path, sizeof db_path, "%s/store.db", dir);
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("seed %u\n", seed);
    srand(seed);

    struct store *st = NULL;
    char err[256];
    REQUIRE(store_open(&st, db_path, err, sizeof err) == 0);
    struct store_job job = {.name = "crash", .state = "running", .np = 1};
    REQUIRE(store_job_insert(st, &job) == 0);
    store_close(st);

    /* Commit numbers (and upload ids) keep increasing across rounds; one
     * is skipped after each kill, since the one in flight may have landed. */
    uint64_t k = 1;
    for (int round = 0; round < 5; round++)
        run_round(round, job.id, k, 200 + (unsigned)(rand() % 301), &k);
    run_round(5, job.id, k, (unsigned)(rand() % 5), &k);

    test_remove_db(db_path, dir);
    TEST_DONE();
}
