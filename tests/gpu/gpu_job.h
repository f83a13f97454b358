/*
 * gpu_job.h - an in-process coordinator and N threads as the ranks of a
 * job, for the GPU tests (each thread its own kolo_ctx, as in
 * tests/worker/test_api.c). Header-only: each test is one file.
 */
#ifndef KOLO_TESTS_GPU_JOB_H
#define KOLO_TESTS_GPU_JOB_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord.h"
#include "kolo.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "test.h"
#include "coord_harness.h"
#include "util.h"

static struct coord *job_coord;
static char job_dir[64];
static uint64_t job_id;
static int job_np;
static int job_seq;

static void job_coord_start(void)
{
    char db[128], err[512];
    snprintf(job_dir, sizeof(job_dir), "/tmp/kolo-test-gpu-XXXXXX");
    REQUIRE(mkdtemp(job_dir));
    snprintf(db, sizeof(db), "%s/c.db", job_dir);
    /* fake hosts never heartbeat: a long lease keeps their jobs alive */
    struct coord_config cfg = {
        .listen = "tcp://127.0.0.1:0", .db_path = db, .lease_ms = 3600000, .heartbeat_ms = 1000};
    REQUIRE(coord_start(&job_coord, &cfg, err, sizeof(err)) == 0);
}

static void job_coord_stop(void)
{
    coord_stop(job_coord);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", job_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", job_dir);
}

/* Registers a host with np slots and submits an np-rank job on it. */
static void job_make(int np)
{
    char id[32];
    snprintf(id, sizeof(id), "gpuhost-%d", ++job_seq);
    job_id = harness_submit_job(coord_rpc_url(job_coord), id, np);
    job_np = np;
}

typedef void (*job_rank_fn)(kolo_ctx *ctx, int rank, int size);

struct job_thread {
    int rank;
    job_rank_fn fn;
};

static void *job_rank_main(void *p)
{
    struct job_thread *a = p;
    char host[32];
    snprintf(host, sizeof(host), "gpuhost-%d", job_seq);
    kolo_config cfg = {0};
    cfg.coordinator = coord_rpc_url(job_coord);
    cfg.job_id = job_id;
    cfg.generation = 1;
    cfg.rank = a->rank;
    cfg.size = job_np;
    cfg.local_rank = a->rank;
    cfg.local_size = job_np;
    cfg.host_id = host;
    cfg.data_addr = "127.0.0.1";
    cfg.timeout_ms = 20000;
    kolo_ctx *ctx = NULL;
    int rv = kolo_init(&ctx, &cfg);
    if (rv)
        fprintf(stderr, "rank %d: kolo_init: %s\n", a->rank, kolo_strerror(rv));
    REQUIRE(rv == 0);
    a->fn(ctx, a->rank, job_np);
    CHECK_EQ_INT(kolo_fini(ctx), 0);
    return NULL;
}

/* Runs fn on np threads, one fresh job (generation) each time. */
static void job_run(int np, job_rank_fn fn)
{
    job_make(np);
    pthread_t t[8];
    struct job_thread args[8];
    REQUIRE(np <= 8);
    for (int r = 0; r < np; r++) {
        args[r] = (struct job_thread){r, fn};
        pthread_create(&t[r], NULL, job_rank_main, &args[r]);
    }
    for (int r = 0; r < np; r++)
        pthread_join(t[r], NULL);
}

#endif
