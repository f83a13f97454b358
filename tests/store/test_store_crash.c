/*
 * test_store_crash.c - an acknowledged write survives kill -9.
 *
 * Each round forks a writer that opens the store and writes as fast as it
 * can: single events, job updates, output lines, and nested transactions
 * that touch all three. After every call that returned 0 it sends that
 * write's number down a pipe. The parent kills the writer with SIGKILL at
 * a random moment, reads every number the writer managed to send, reopens
 * the store and checks that the file is intact and that every acknowledged
 * write is there. A write that was in flight at the kill may or may not be
 * there, but a transaction must be all there or not at all.
 *
 * Write number k is of kind k % 4 (see enum write_kind); numbers start at
 * round * ROUND_SPAN + 1 so every round's writes are distinct and output
 * sequence numbers keep increasing across rounds.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
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
#include "store.h"
#include "test.h"

#define ROUND_SPAN 10000000ull

enum write_kind {
    WRITE_EVENT = 0,  /* store_event_add, message "k" */
    WRITE_JOB = 1,    /* store_job_update, generation = k */
    WRITE_OUTPUT = 2, /* store_output_append, seq = k */
    WRITE_TXN = 3,    /* all three above in nested transactions */
};

static char dir[] = "/tmp/kolo-test-store-crash-XXXXXX";
static char db_path[256];

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ----------------------------------------------------------------- writer */

static int write_event(struct store *st, uint64_t job, uint64_t k)
{
    char msg[32];
    snprintf(msg, sizeof msg, "%" PRIu64, k);
    struct store_event ev = {
        .ts_ms = k, .job_id = job, .host_id = "h", .kind = "tick", .message = msg};
    return store_event_add(st, &ev);
}

static int write_job(struct store *st, uint64_t job, uint64_t k)
{
    struct store_job j = {
        .id = job, .state = "running", .np = 2, .hosts = "h:2", .generation = k, .started_ms = k};
    return store_job_update(st, &j);
}

static int write_output(struct store *st, uint64_t job, uint64_t k)
{
    char text[48];
    int len = snprintf(text, sizeof text, "line %" PRIu64 "\n", k);
    struct store_output o = {.job_id = job,
                             .seq = k,
                             .rank = (int)(k % 2),
                             .stream = 1,
                             .text = text,
                             .text_len = (size_t)len,
                             .ts_ms = k};
    return store_output_append(st, &o, 1);
}

static int write_txn(struct store *st, uint64_t job, uint64_t k)
{
    int err = store_begin(st);
    if (err)
        return err;
    err = write_event(st, job, k);
    if (!err)
        err = write_output(st, job, k);
    if (!err) {
        err = store_begin(st);
        if (!err) {
            err = write_job(st, job, k);
            int end = err ? store_rollback(st) : store_commit(st);
            err = err ? err : end;
        }
    }
    if (err) {
        store_rollback(st);
        return err;
    }
    return store_commit(st);
}

/* writer runs in the child until it is killed. */
static void writer(int ack_fd, uint64_t job, uint64_t first)
{
    struct store *st = NULL;
    char err[256];
    int rc = store_open(&st, db_path, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "writer: store_open: %s\n", err);
        _exit(2);
    }
    for (uint64_t k = first;; k++) {
        switch ((enum write_kind)(k % 4)) {
        case WRITE_EVENT:
            rc = write_event(st, job, k);
            break;
        case WRITE_JOB:
            rc = write_job(st, job, k);
            break;
        case WRITE_OUTPUT:
            rc = write_output(st, job, k);
            break;
        case WRITE_TXN:
            rc = write_txn(st, job, k);
            break;
        }
        if (rc != 0) {
            fprintf(stderr, "writer: write %" PRIu64 ": %s: %s\n", k, abi_errname(rc),
                    store_last_error(st));
            _exit(2);
        }
        /* Only now is k acknowledged: the store call returned 0. */
        if (write(ack_fd, &k, sizeof k) != (ssize_t)sizeof k)
            _exit(3);
    }
}

/* ----------------------------------------------------------------- parent */

struct acks {
    uint64_t *k;
    size_t n, cap;
};

static void acks_push(struct acks *a, uint64_t k)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 1024;
        a->k = realloc(a->k, a->cap * sizeof *a->k);
        REQUIRE(a->k);
    }
    a->k[a->n++] = k;
}

/* read_acks takes whole 8-byte numbers from fd; a partial one waits in
 * carry for the next read. Returns 0 at end of file. */
static ssize_t read_acks(int fd, struct acks *a, unsigned char *carry, size_t *carried)
{
    unsigned char buf[4096];
    memcpy(buf, carry, *carried);
    ssize_t got = read(fd, buf + *carried, sizeof buf - *carried);
    if (got <= 0)
        return got;
    size_t total = *carried + (size_t)got;
    size_t whole = total / sizeof(uint64_t) * sizeof(uint64_t);
    for (size_t off = 0; off < whole; off += sizeof(uint64_t)) {
        uint64_t k;
        memcpy(&k, buf + off, sizeof k);
        acks_push(a, k);
    }
    *carried = total - whole;
    memcpy(carry, buf + whole, *carried);
    return got;
}

/* What one round's writes left in the store, indexed by k - first. */
struct found {
    uint64_t first;
    size_t span;
    unsigned char *event;
    unsigned char *output;
    uint64_t generation;
};

static int mark_event(const struct store_event *ev, void *arg)
{
    struct found *f = arg;
    uint64_t k = strtoull(ev->message, NULL, 10);
    if (k >= f->first && k - f->first < f->span)
        f->event[k - f->first] = 1;
    return 0;
}

static int mark_output(const struct store_output *o, void *arg)
{
    struct found *f = arg;
    char want[48];
    int len = snprintf(want, sizeof want, "line %" PRIu64 "\n", o->seq);
    CHECK(o->text_len == (size_t)len && memcmp(o->text, want, (size_t)len) == 0);
    if (o->seq >= f->first && o->seq - f->first < f->span)
        f->output[o->seq - f->first] = 1;
    return 0;
}

static int read_job(const struct store_job *j, void *arg)
{
    struct found *f = arg;
    f->generation = j->generation;
    return 0;
}

/* verify_round reopens the store after a kill and checks this round. */
static void verify_round(int round, uint64_t job, uint64_t first, const struct acks *a)
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

    uint64_t last_ack = a->n ? a->k[a->n - 1] : first - 1;
    /* One write beyond the last acknowledged one may have landed. */
    struct found f = {.first = first, .span = (size_t)(last_ack - first + 2)};
    f.event = calloc(f.span, 1);
    f.output = calloc(f.span, 1);
    REQUIRE(f.event && f.output);
    CHECK_EQ_INT(store_events_each(st, job, 0, 0, mark_event, &f), 0);
    CHECK_EQ_INT(store_output_each(st, job, first - 1, 0, mark_output, &f), 0);
    CHECK_EQ_INT(store_jobs_each(st, read_job, &f), 0);

    uint64_t last_job_ack = 0;
    size_t missing = 0;
    for (size_t i = 0; i < a->n; i++) {
        uint64_t k = a->k[i];
        REQUIRE(k == first + i); /* acknowledged in order, none skipped */
        size_t at = (size_t)(k - first);
        switch ((enum write_kind)(k % 4)) {
        case WRITE_EVENT:
            missing += !f.event[at];
            break;
        case WRITE_JOB:
            last_job_ack = k;
            break;
        case WRITE_OUTPUT:
            missing += !f.output[at];
            break;
        case WRITE_TXN:
            missing += !f.event[at] || !f.output[at];
            last_job_ack = k;
            break;
        }
    }
    if (missing)
        fprintf(stderr, "round %d: %zu acknowledged writes missing\n", round, missing);
    CHECK_EQ_INT(missing, 0);
    CHECK(f.generation >= last_job_ack);
    CHECK(f.generation <= last_ack + 1);

    /* The write in flight at the kill: a transaction is all or nothing. */
    uint64_t next = last_ack + 1;
    if (next % 4 == WRITE_TXN) {
        size_t at = (size_t)(next - first);
        int parts = f.event[at] + f.output[at] + (f.generation == next);
        CHECK(parts == 0 || parts == 3);
    }

    printf("round %d: %zu writes acknowledged, all present\n", round, a->n);
    free(f.event);
    free(f.output);
    store_close(st);
}

static void run_round(int round, uint64_t job, unsigned delay_ms)
{
    uint64_t first = (uint64_t)round * ROUND_SPAN + 1;
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

    struct acks a = {0};
    unsigned char carry[8];
    size_t carried = 0;
    uint64_t deadline = now_ms() + delay_ms;
    int writer_gone = 0;
    for (uint64_t now = now_ms(); now < deadline; now = now_ms()) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        int ready = poll(&p, 1, (int)(deadline - now));
        if (ready < 0 && errno == EINTR)
            continue;
        REQUIRE(ready >= 0);
        if (ready > 0 && read_acks(fds[0], &a, carry, &carried) == 0) {
            writer_gone = 1; /* it failed on its own; reported below */
            break;
        }
    }
    kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    /* Everything the writer sent before it died is still in the pipe. */
    while (read_acks(fds[0], &a, carry, &carried) > 0)
        ;
    close(fds[0]);
    if (writer_gone || !WIFSIGNALED(status))
        fprintf(stderr, "round %d: writer exited on its own (status %d)\n", round, status);
    CHECK(!writer_gone && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK_EQ_INT(carried, 0);

    verify_round(round, job, first, &a);
    free(a.k);
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(db_path, sizeof db_path, "%s/store.db", dir);
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("seed %u\n", seed);
    srand(seed);

    /* The parent prepares the job and closes the store before any fork:
     * an SQLite connection must not be carried across fork(). */
    struct store *st = NULL;
    char err[256];
    REQUIRE(store_open(&st, db_path, err, sizeof err) == 0);
    struct store_host h = {.id = "h", .name = "h", .state = "alive", .slots = 2};
    REQUIRE(store_host_put(st, &h) == 0);
    struct store_job job = {.name = "crash", .state = "running", .np = 2};
    REQUIRE(store_job_insert(st, &job) == 0);
    store_close(st);

    /* Five rounds killed 200-500 ms in, then one killed within the first
     * few milliseconds, likely while the writer is still opening. */
    for (int round = 0; round < 5; round++)
        run_round(round, job.id, 200 + (unsigned)(rand() % 301));
    run_round(5, job.id, (unsigned)(rand() % 5));

    test_remove_db(db_path, dir);
    TEST_DONE();
}
