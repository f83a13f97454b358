/*
 * snap_writer.c - kolo-test-snap-writer, the worker program of
 * tests/integration/test_snapshots.sh (run with kolo run -np 2).
 *
 *   kolo-test-snap-writer ACKLOG STOPFILE GOFILE
 *
 * Rank 0 commits snapshots of 4-16 MiB (bytes made from the commit number
 * i, metadata {"i":i}) one after the other until STOPFILE exists, and for
 * each acknowledged one appends "acked ID SHA256 BYTES I" to ACKLOG
 * (flushed and fsynced before the next commit starts). Then it reads every
 * acknowledged snapshot back by id and compares it byte for byte, writes
 * "phase1 N", waits for GOFILE, commits two more (with KOLO_SNAPSHOT_KEEP=3)
 * and writes "phase2". Rank 1 reads the latest snapshot over and over
 * meanwhile, checking each against the bytes its metadata names, until
 * STOPFILE exists; then it waits for rank 0's "phase2".
 * Exit status 0 when every check held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hmac.h"
#include "kolo.h"

#define MAX_ACKS 4096

static size_t size_of(uint64_t i)
{
    return (4u << 20) + (size_t)((i * 2654435761u) % (12u << 20));
}

static uint8_t *make(uint64_t i, size_t *len)
{
    *len = size_of(i);
    uint8_t *p = malloc(*len + 1);
    if (!p)
        exit(3);
    uint64_t x = i * 0x9E3779B97F4A7C15ull + 7;
    for (size_t k = 0; k + 8 <= *len; k += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + k, &x, 8);
    }
    memset(p + (*len & ~(size_t)7), (int)i, *len & 7);
    return p;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int file_has(const char *path, const char *word)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strncmp(line, word, strlen(word)) == 0;
    fclose(f);
    return found;
}

static void log_line(const char *path, const char *line)
{
    FILE *f = fopen(path, "a");
    if (!f || fputs(line, f) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        perror(path);
        exit(3);
    }
    fclose(f);
}

struct ack {
    uint64_t id, i;
};

static int commit(kolo_ctx *ctx, const char *acklog, uint64_t i, struct ack *a)
{
    size_t len;
    uint8_t *data = make(i, &len);
    uint8_t sum[SHA256_LEN];
    sha256(data, len, sum);
    char meta[64], hex[2 * SHA256_LEN + 1], line[256];
    snprintf(meta, sizeof meta, "{\"i\":%" PRIu64 ",\"epoch\":%" PRIu64 "}", i, i / 10);
    for (int k = 0; k < SHA256_LEN; k++)
        sprintf(hex + 2 * k, "%02x", sum[k]);
    uint64_t id = 0;
    int rc = kolo_snapshot_put(ctx, data, len, meta, 120000, &id);
    free(data);
    if (rc) {
        printf("rank 0: commit %" PRIu64 " failed: %s: %s\n", i, kolo_errname(rc),
               kolo_last_error(ctx));
        return rc;
    }
    snprintf(line, sizeof line, "acked %" PRIu64 " %s %zu %" PRIu64 "\n", id, hex, len, i);
    log_line(acklog, line);
    a->id = id;
    a->i = i;
    return 0;
}

static int verify(kolo_ctx *ctx, uint64_t id, uint64_t *i_out)
{
    void *data = NULL;
    size_t len = 0;
    char *meta = NULL;
    uint64_t got = 0;
    int rc = kolo_snapshot_get(ctx, id, &data, &len, &meta, &got, 120000);
    if (rc == KOLO_ENOTFOUND && id == 0)
        return 0;
    if (rc) {
        printf("rank %d: reading snapshot %" PRIu64 ": %s: %s\n", kolo_rank(ctx), id,
               kolo_errname(rc), kolo_last_error(ctx));
        return rc;
    }
    uint64_t i = 0;
    const char *p = meta ? strstr(meta, "\"i\":") : NULL;
    if (p)
        i = strtoull(p + 4, NULL, 10);
    size_t want_len;
    uint8_t *want = make(i, &want_len);
    int bad = !p || (id && got != id) || len != want_len || memcmp(data, want, len) != 0;
    if (bad)
        printf("rank %d: snapshot %" PRIu64 " (meta %s) does not hold what was committed\n",
               kolo_rank(ctx), got, meta ? meta : "(none)");
    if (i_out)
        *i_out = i;
    free(want);
    kolo_snapshot_free(data);
    kolo_snapshot_free(meta);
    return bad ? KOLO_EPROTO : 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s ACKLOG STOPFILE GOFILE\n", argv[0]);
        return 2;
    }
    const char *acklog = argv[1], *stop = argv[2], *go = argv[3];
    setvbuf(stdout, NULL, _IOLBF, 0);
    kolo_ctx *ctx = NULL;
    int rc = kolo_init(&ctx, NULL);
    if (rc) {
        printf("kolo_init: %s\n", kolo_strerror(rc));
        return 1;
    }
    int rank = kolo_rank(ctx);
    int failed = 0;
    if (rank == 0) {
        static struct ack acks[MAX_ACKS];
        int n = 0;
        for (uint64_t i = 1; !exists(stop) && n < MAX_ACKS - 2; i++) {
            if (commit(ctx, acklog, i, &acks[n]) != 0) {
                failed = 1;
                break;
            }
            n++;
        }
        int verified = 0;
        for (int k = 0; k < n && !failed; k++) {
            uint64_t i = 0;
            if (verify(ctx, acks[k].id, &i) != 0 || i != acks[k].i)
                failed = 1;
            else
                verified++;
        }
        printf("rank 0: phase 1: %d snapshots acknowledged, %d read back intact\n", n, verified);
        char line[64];
        snprintf(line, sizeof line, "phase1 %d\n", verified);
        log_line(acklog, line);
        for (int t = 0; t < 1200 && !exists(go); t++)
            usleep(100 * 1000);
        if (!exists(go)) {
            printf("rank 0: no go file\n");
            failed = 1;
        }
        setenv("KOLO_SNAPSHOT_KEEP", "3", 1);
        for (uint64_t i = 100001; i < 100003 && !failed; i++)
            if (commit(ctx, acklog, i, &acks[n++]) != 0)
                failed = 1;
        log_line(acklog, "phase2\n");
    } else {
        int reads = 0;
        while (!exists(stop) && !failed) {
            failed = verify(ctx, 0, NULL) != 0;
            reads++;
            usleep(50 * 1000);
        }
        printf("rank %d: %d reads of the latest snapshot, %s\n", rank, reads,
               failed ? "FAILED" : "all intact");
        for (int t = 0; t < 1200 && !file_has(acklog, "phase2"); t++)
            usleep(100 * 1000);
    }
    kolo_fini(ctx);
    return failed;
}
