/*
 * store_check.c - kolo-test-store-check: checks a coordinator's database
 * from outside, for the integration tests (no sqlite3 command needed).
 *
 *   kolo-test-store-check DB [--acks FILE] [--job ID --count N]
 *
 * Runs PRAGMA integrity_check, then reads every stored snapshot of every
 * job back chunk by chunk and checks its size and SHA-256. With --acks,
 * every line "acked ID SHA256HEX BYTES" of FILE must name a stored
 * snapshot with that checksum and size (other lines are ignored). With
 * --job and --count, that job must hold exactly N snapshots. Prints one
 * summary line; exits 0 when everything holds, 1 otherwise.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "hmac.h"
#include "store.h"

static struct store *st;
static int bad;
static uint64_t nsnaps;

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

struct reading {
    struct sha256 sha;
    uint64_t bytes;
};

static int hash_chunk(const void *data, size_t len, void *arg)
{
    struct reading *r = arg;
    sha256_update(&r->sha, data, len);
    r->bytes += len;
    return 0;
}

static int check_snapshot(const struct store_snapshot *s, void *arg)
{
    struct reading r = {.bytes = 0};
    sha256_init(&r.sha);
    for (uint32_t i = 0; i < s->nchunks; i++) {
        int rc = store_snapshot_chunk(st, s->job_id, s->id, i, hash_chunk, &r);
        if (rc) {
            printf("snapshot %" PRIu64 ": chunk %u: %s\n", s->id, i, abi_errname(rc));
            bad++;
            return 0;
        }
    }
    uint8_t sum[SHA256_LEN];
    char sumhex[2 * SHA256_LEN + 1];
    sha256_final(&r.sha, sum);
    hex(sum, SHA256_LEN, sumhex);
    if (r.bytes != s->total_bytes || strcmp(sumhex, s->checksum) != 0) {
        printf("snapshot %" PRIu64 " of job %" PRIu64 ": %" PRIu64 " bytes read, %" PRIu64
               " stored; checksum %s, stored %s\n",
               s->id, s->job_id, r.bytes, s->total_bytes, sumhex, s->checksum);
        bad++;
    }
    nsnaps++;
    return 0;
}

static int check_job(const struct store_job *j, void *arg)
{
    int rc = store_snapshots_each(st, j->id, 0, check_snapshot, NULL);
    if (rc) {
        printf("job %" PRIu64 ": %s\n", j->id, store_last_error(st));
        bad++;
    }
    return 0;
}

struct want {
    const char *checksum;
    uint64_t bytes;
    int found;
};

static int match_ack(const struct store_snapshot *s, void *arg)
{
    struct want *w = arg;
    w->found = 1;
    if (strcmp(s->checksum, w->checksum) != 0 || s->total_bytes != w->bytes)
        w->found = -1;
    return 0;
}

struct find_ctx {
    uint64_t id;
    struct want *w;
};

static int find_in_job(const struct store_job *j, void *arg)
{
    struct find_ctx *f = arg;
    store_snapshot_get(st, j->id, f->id, match_ack, f->w);
    return f->w->found != 0;
}

static int count_one(const struct store_snapshot *s, void *arg)
{
    (*(int *)arg)++;
    return 0;
}

int main(int argc, char **argv)
{
    const char *db = NULL, *acks = NULL;
    uint64_t job = 0;
    int want_count = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--acks") == 0 && i + 1 < argc)
            acks = argv[++i];
        else if (strcmp(argv[i], "--job") == 0 && i + 1 < argc)
            job = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
            want_count = atoi(argv[++i]);
        else if (!db && argv[i][0] != '-')
            db = argv[i];
        else {
            fprintf(stderr, "usage: %s DB [--acks FILE] [--job ID --count N]\n", argv[0]);
            return 2;
        }
    }
    if (!db) {
        fprintf(stderr, "usage: %s DB [--acks FILE] [--job ID --count N]\n", argv[0]);
        return 2;
    }
    char err[512];
    if (store_open(&st, db, err, sizeof err) != 0) {
        printf("cannot open %s: %s\n", db, err);
        return 1;
    }
    if (store_integrity_check(st, err, sizeof err) != 0) {
        printf("%s\n", err);
        bad++;
    }
    store_jobs_each(st, check_job, NULL);

    int nacks = 0, missing = 0;
    if (acks) {
        FILE *f = fopen(acks, "r");
        if (!f) {
            printf("cannot read %s\n", acks);
            return 1;
        }
        char line[512];
        while (fgets(line, sizeof line, f)) {
            uint64_t id = 0, bytes = 0;
            char sum[80];
            if (sscanf(line, "acked %" SCNu64 " %79s %" SCNu64, &id, sum, &bytes) != 3)
                continue;
            nacks++;
            struct want w = {sum, bytes, 0};
            struct find_ctx fc = {id, &w};
            store_jobs_each(st, find_in_job, &fc);
            if (w.found != 1) {
                printf("acknowledged snapshot %" PRIu64 " is %s\n", id,
                       w.found ? "different from what was acknowledged" : "missing");
                missing++;
            }
        }
        fclose(f);
    }
    int count = 0;
    if (job && want_count >= 0) {
        store_snapshots_each(st, job, 0, count_one, &count);
        if (count != want_count) {
            printf("job %" PRIu64 " holds %d snapshots, expected %d\n", job, count, want_count);
            bad++;
        }
    }
    store_close(st);
    printf("%s: integrity %s, %" PRIu64 " snapshots verified, %d acknowledged, %d lost\n",
           bad || missing ? "FAIL" : "ok", bad ? "problems" : "ok", nsnaps, nacks, missing);
    return bad || missing ? 1 : 0;
}
