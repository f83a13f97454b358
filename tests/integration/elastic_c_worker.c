/*
 * elastic_c_worker.c - a light elastic worker in C for the elastic tests
 * that run many ranks on a small machine (test_elastic_hosts.sh: 64 ranks
 * on 16 simulated hosts), where 64 Python+torch processes would not fit.
 *
 *   kolo-test-elastic-worker --tag MARK [--stop-file PATH] [--steps N]
 *                            [--commit K] [--delay-ms D | --delay S] [--big N]
 *                            [--kills '[[step, rank], ...]' --marks DIR]
 *
 * It does what kolo.torch.elastic's run() does, with libkolo's C API: its
 * state is (step, acc); a commit (every K steps) saves it in memory; a
 * failed collective restores the last commit, leaves the generation
 * (kolo_fini) and asks for its place in the next one (kolo_init: the
 * environment holds KOLO_ELASTIC=1 and KOLO_WORKER_ID); each generation
 * starts by broadcasting the state from its rank 0. A membership update
 * the coordinator announced (capacity came back) is acted on at a commit,
 * by every rank at the same step (rank 0's view travels in the step's
 * allreduce), without a rollback: HostsUpdatedInterrupt.
 *
 * Every step runs two allreduces (sums) whose results it checks exactly,
 * whatever the size:
 *   "small", int64[4 + 64]: [0] the step on every rank (sum n * step),
 *     [1] 1 (sum n), [2] rank 0's stop flag (the stop file exists),
 *     [3] rank 0's newest unseen host-update stamp, [4 + r] r + 1 on rank
 *     r only (each rank's contribution at its place); under
 *     KOLO_HIER_LANES: the hosts' leaders' path.
 *   "big", float32[N] (40,960: 160 KiB, above KOLO_HIER_LANES: every
 *     lane's path): rank r gives (7 step + i) % 1000 + (r + i) % 64 at i;
 *     every sum is an integer below 2^24, exact in any order.
 * A wrong element prints "WRONG ..." and the worker exits 2. Outside an
 * elastic job (KOLO_ELASTIC unset) a failed collective ends the worker
 * (exit 1), as a program without hvd.elastic would.
 *
 * acc adds each step's number once (taken from the allreduce: sum / n),
 * so a run that ends at step S has acc = S (S - 1) / 2 exactly when every
 * step from 0 to S - 1 counted once in the committed lineage, whatever
 * the rollbacks.
 *
 * Lines (stdout, flushed; t is the wall clock), in the format
 * tests/integration/elastic_report.py reads:
 *   STEP <step> size <n> gen <g> wid <w> host <h> t <t>   rank 0 every step,
 *        the others the first 3 steps of each generation and every 10th
 *   RESET size <n> step <s> gen <g> wid <w> t <t>         after a reset
 *   FAIL gen <g> rank <r> wid <w> t <t> <error>           a collective failed
 *   KILL <i> step <s> rank <r> wid <w> t <t>               before a planned kill
 *   FINAL <step> {"acc": A, "resets": R, "checked": C, "wid": W}
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo.h"

#define SLOTS 64
#define SMALL (4 + SLOTS)
#define WAIT_MS 90000 /* a collective that takes longer is a hang */

static const char *wid = "0";
static char host[9] = "-";

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* 0, or the code of a failed operation (its detail printed as FAIL). */
static int wait_op(kolo_ctx *ctx, kolo_handle h, const char *what)
{
    int rc = kolo_wait(ctx, h, WAIT_MS);
    if (rc == KOLO_ETIMEDOUT) {
        printf("HANG gen %" PRIu64 " rank %d wid %s t %.3f %s not done after %d ms\n",
               kolo_generation(ctx), kolo_rank(ctx), wid, wall(), what, WAIT_MS);
        fflush(stdout);
        exit(3);
    }
    if (rc) {
        printf("FAIL gen %" PRIu64 " rank %d wid %s t %.3f %s: %s: %s\n", kolo_generation(ctx),
               kolo_rank(ctx), wid, wall(), what, kolo_errname(rc), kolo_last_error(ctx));
        fflush(stdout);
    }
    return rc;
}

static void wrong(kolo_ctx *ctx, int64_t step, const char *what, long i, double got, double want)
{
    printf("WRONG gen %" PRIu64 " rank %d size %d wid %s step %" PRId64
           " %s[%ld] = %.1f, want %.1f\n",
           kolo_generation(ctx), kolo_rank(ctx), kolo_size(ctx), wid, step, what, i, got, want);
    fflush(stdout);
    exit(2);
}

/* Planned kills (--kills '[[step, rank], ...]' --marks DIR), as
 * elastic_worker.py's: the worker that holds rank (modulo the size) at
 * that step SIGKILLs itself, once: a marker file, linked into DIR (link
 * fails when it exists), outlives the rollback that replays the step. */
#define MAX_KILLS 256
static long kill_step[MAX_KILLS], kill_rank[MAX_KILLS];
static int nkills;
static const char *marks;

static int parse_kills(const char *v)
{
    long nums[2 * MAX_KILLS];
    int n = 0;
    for (const char *p = v; *p && n < 2 * MAX_KILLS;) {
        if ((*p >= '0' && *p <= '9') || (*p == '-' && p[1] >= '0' && p[1] <= '9')) {
            char *end;
            nums[n++] = strtol(p, &end, 10);
            p = end;
        } else {
            p++;
        }
    }
    if (n % 2)
        return -1;
    for (int i = 0; i < n / 2; i++) {
        kill_step[i] = nums[2 * i];
        kill_rank[i] = nums[2 * i + 1];
    }
    nkills = n / 2;
    return 0;
}

static void maybe_die(kolo_ctx *ctx, int64_t step)
{
    int rank = kolo_rank(ctx), n = kolo_size(ctx);
    for (int i = 0; i < nkills; i++) {
        if (kill_step[i] != step || kill_rank[i] < 0 || rank != kill_rank[i] % n)
            continue;
        char tmp[4096], tag[4096];
        snprintf(tmp, sizeof tmp, "%s/.kill%d.%d", marks, i, (int)getpid());
        snprintf(tag, sizeof tag, "%s/kill%d", marks, i);
        FILE *f = fopen(tmp, "w");
        if (!f)
            continue;
        fprintf(f, "%" PRIu64, kolo_generation(ctx));
        fclose(f);
        int mine = link(tmp, tag) == 0;
        unlink(tmp);
        if (!mine)
            continue;
        printf("KILL %d step %" PRId64 " rank %d wid %s t %.3f\n", i, step, rank, wid, wall());
        fflush(stdout);
        kill(getpid(), SIGKILL);
    }
}

static int join(kolo_ctx **ctx)
{
    int rc = kolo_init(ctx, NULL);
    if (rc) {
        printf("INITFAIL wid %s t %.3f %s: %s\n", wid, wall(), kolo_errname(rc),
               kolo_last_error(NULL));
        fflush(stdout);
        exit(1);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *stop_file = NULL;
    int64_t steps = 1000000;
    int commit = 5, delay_ms = 10;
    long nbig = 40960;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: %s --tag MARK [--stop-file P] [--steps N] [--commit K] "
                            "[--delay-ms D | --delay S] [--big N]\n", argv[0]);
            return 64;
        }
        if (!strcmp(a, "--tag"))
            ; /* a marker for pgrep */
        else if (!strcmp(a, "--stop-file"))
            stop_file = v;
        else if (!strcmp(a, "--steps"))
            steps = atoll(v);
        else if (!strcmp(a, "--commit"))
            commit = atoi(v);
        else if (!strcmp(a, "--delay-ms"))
            delay_ms = atoi(v);
        else if (!strcmp(a, "--delay")) /* seconds, as elastic_worker.py's */
            delay_ms = (int)(atof(v) * 1000 + 0.5);
        else if (!strcmp(a, "--big"))
            nbig = atol(v);
        else if (!strcmp(a, "--kills") && parse_kills(v) == 0)
            ;
        else if (!strcmp(a, "--marks"))
            marks = v;
        else {
            fprintf(stderr, "unknown flag %s\n", a);
            return 64;
        }
        i++;
    }
    if (commit < 1 || nbig < 1 || steps < 0 || (nkills && !marks))
        return 64;
    const char *el = getenv("KOLO_ELASTIC");
    int elastic = el && !strcmp(el, "1");
    if (getenv("KOLO_WORKER_ID"))
        wid = getenv("KOLO_WORKER_ID");
    if (getenv("KOLO_HOST_ID"))
        snprintf(host, sizeof host, "%s", getenv("KOLO_HOST_ID"));

    int64_t small[SMALL], sres[SMALL];
    float *big = malloc(sizeof(float) * (size_t)nbig), *bres = malloc(sizeof(float) * (size_t)nbig);
    if (!big || !bres)
        return 1;
    /* cur: the state; saved: the last commit */
    int64_t cur_step = 0, cur_acc = 0, saved_step = 0, saved_acc = 0;
    int64_t checked = 0;
    uint64_t seen_stamp = 0; /* the newest host update acted on */
    int resets = 0, stop = 0;
    kolo_ctx *ctx;
    join(&ctx);

    while (!stop) {
        /* one pass per generation: sync the state from rank 0 */
        int rank = kolo_rank(ctx), n = kolo_size(ctx);
        uint64_t gen = kolo_generation(ctx);
        int failed = 0, updated = 0;
        kolo_handle h;
        int64_t st[3] = {cur_step, cur_acc, (int64_t)seen_stamp};
        int rc = kolo_broadcast_async(ctx, "elastic.sync", st, 3, KOLO_INT64, 0, &h);
        if (rc || wait_op(ctx, h, "sync"))
            failed = 1;
        if (!failed) {
            cur_step = saved_step = st[0];
            cur_acc = saved_acc = st[1];
            if ((uint64_t)st[2] > seen_stamp)
                seen_stamp = (uint64_t)st[2];
            if (resets) {
                printf("RESET size %d step %" PRId64 " gen %" PRIu64 " wid %s t %.3f\n", n,
                       cur_step, gen, wid, wall());
                fflush(stdout);
            }
            /* sum over r < n of (r + j) % 64, for the big tensor's check */
            double tab[SLOTS];
            for (int j = 0; j < SLOTS; j++) {
                tab[j] = 0;
                for (int r = 0; r < n; r++)
                    tab[j] += (r + j) % SLOTS;
            }
            int in_gen = 0;
            while (cur_step < steps) {
                int64_t s = cur_step;
                maybe_die(ctx, s);
                memset(small, 0, sizeof small);
                small[0] = s;
                small[1] = 1;
                if (rank == 0) {
                    if (stop_file && access(stop_file, F_OK) == 0)
                        small[2] = 1;
                    if ((s + 1) % commit == 0) {
                        uint64_t stamp = 0;
                        int kind = 0;
                        kolo_hosts_updated(ctx, &stamp, &kind);
                        if (stamp > seen_stamp)
                            small[3] = (int64_t)stamp;
                    }
                }
                if (rank < SLOTS)
                    small[4 + rank] = rank + 1;
                for (long i = 0; i < nbig; i++)
                    big[i] = (float)((7 * s + i) % 1000 + (rank + i) % SLOTS);
                kolo_handle hs, hb;
                if (kolo_allreduce_async(ctx, "small", small, sres, SMALL, KOLO_INT64, KOLO_SUM,
                                         &hs) ||
                    kolo_allreduce_async(ctx, "big", big, bres, (size_t)nbig, KOLO_FLOAT32,
                                         KOLO_SUM, &hb)) {
                    printf("FAIL gen %" PRIu64 " rank %d wid %s t %.3f submit: %s\n", gen, rank,
                           wid, wall(), kolo_last_error(ctx));
                    fflush(stdout);
                    failed = 1;
                    break;
                }
                int e1 = wait_op(ctx, hs, "allreduce small");
                int e2 = wait_op(ctx, hb, "allreduce big");
                if (e1 || e2) {
                    failed = 1;
                    break;
                }
                if (sres[0] != (int64_t)n * s)
                    wrong(ctx, s, "small", 0, (double)sres[0], (double)n * (double)s);
                if (sres[1] != n)
                    wrong(ctx, s, "small", 1, (double)sres[1], n);
                if (sres[2] != 0 && sres[2] != 1)
                    wrong(ctx, s, "small", 2, (double)sres[2], 1);
                if (sres[3] < 0)
                    wrong(ctx, s, "small", 3, (double)sres[3], 0);
                for (int j = 0; j < SLOTS; j++)
                    if (sres[4 + j] != (j < n ? j + 1 : 0))
                        wrong(ctx, s, "small", 4 + j, (double)sres[4 + j], j < n ? j + 1 : 0);
                for (long i = 0; i < nbig; i++) {
                    double want = (double)n * (double)((7 * s + i) % 1000) + tab[i % SLOTS];
                    if ((double)bres[i] != want)
                        wrong(ctx, s, "big", i, bres[i], want);
                }
                checked++;
                cur_acc += sres[0] / n;
                cur_step++;
                in_gen++;
                if (rank == 0 || in_gen <= 3 || cur_step % 10 == 0) {
                    printf("STEP %" PRId64 " size %d gen %" PRIu64 " wid %s host %s t %.3f\n",
                           cur_step, n, gen, wid, host, wall());
                    fflush(stdout);
                }
                if (cur_step % commit == 0) { /* commit */
                    saved_step = cur_step;
                    saved_acc = cur_acc;
                }
                if (sres[2]) {
                    stop = 1;
                    break;
                }
                if (sres[3] > 0 && (uint64_t)sres[3] > seen_stamp) {
                    /* a host update, at a commit: every rank sees it here */
                    seen_stamp = (uint64_t)sres[3];
                    updated = 1;
                    break;
                }
                if (delay_ms > 0)
                    usleep((useconds_t)delay_ms * 1000);
            }
            if (!failed && !updated)
                break; /* stopped, or all the steps done */
        }
        if (failed && !elastic) {
            printf("FAILED wid %s t %.3f: not an elastic job, no reset\n", wid, wall());
            fflush(stdout);
            kolo_fini(ctx);
            return 1;
        }
        if (failed) { /* roll back to the last commit */
            cur_step = saved_step;
            cur_acc = saved_acc;
        }
        double left = wall();
        kolo_fini(ctx);
        double finied = wall();
        resets++;
        join(&ctx);
        /* where a reset's time goes: the failure (FAIL's t), this rank's
         * kolo_fini, its kolo_init into the next generation */
        printf("REJOINED wid %s fini %.3f-%.3f init-done %.3f\n", wid, left, finied, wall());
        fflush(stdout);
    }
    printf("FINAL %" PRId64 " {\"acc\": %" PRId64 ", \"resets\": %d, \"checked\": %" PRId64
           ", \"wid\": %s}\n",
           cur_step, cur_acc, resets, checked, wid);
    fflush(stdout);
    kolo_fini(ctx);
    free(big);
    free(bres);
    return 0;
}
