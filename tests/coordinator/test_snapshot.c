/*
 * test_snapshot.c - PutSnapshot and GetSnapshot against an in-process
 * coordinator over real RPC, with a real SQLite file: chunked upload and
 * read-back, retries and duplicates, every kind of bad chunk, fencing,
 * retention (coordinator default and per-job override), abandoned
 * uploads, a restart that loses a partial upload, the REST listing and
 * the metrics.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "coord.h"
#include "errors.h"
#include "hmac.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "test.h"
#include "coord_harness.h"
#include "util.h"

#define KEEP      2
#define MAX_BYTES (1u << 20)

static char dir[] = "/tmp/kolo-test-coord-snap-XXXXXX";
static char dbpath[256];
static struct coord *coord;
static uint64_t job_id;

static struct coord *start(void)
{
    struct coord_config cfg = {.listen = "tcp://127.0.0.1:0",
                               .http = "127.0.0.1:0",
                               .db_path = dbpath,
                               .lease_ms = 60000, /* no agent heartbeats here */
                               .heartbeat_ms = 1000,
                               .snapshot_keep = KEEP,
                               .snapshot_max_bytes = MAX_BYTES,
                               .snapshot_upload_ms = 400};
    return harness_coord_start(&cfg);
}

static struct rpc_client *client(uint64_t job, uint64_t gen, int rank)
{
    return harness_client(coord_rpc_url(coord), job, gen, rank);
}

/* make_job registers a host and submits a running 2-rank job. */
static void make_job(void)
{
    job_id = harness_submit_job(coord_rpc_url(coord), "snap-host", 2);
}

/* ---------------------------------------------------------------- put helpers */

struct blob {
    uint8_t *data;
    size_t len;
    uint8_t sum[SHA256_LEN];
};

static struct blob make_blob(size_t len, uint8_t seed)
{
    struct blob b = {malloc(len + 1), len, {0}};
    REQUIRE(b.data);
    for (size_t i = 0; i < len; i++)
        b.data[i] = (uint8_t)(seed + i * 7 + (i >> 8));
    sha256(b.data, len, b.sum);
    return b;
}

struct chunk_args {
    uint64_t upload;
    uint32_t index, total;
    uint64_t total_bytes;
    const uint8_t *sum;
    size_t sum_len;
    const char *meta;
    const uint8_t *data;
    size_t len;
    uint32_t keep;
};

/* put_chunk sends one chunk; on success *ack is the reply (caller frees). */
static int put_chunk(struct rpc_client *cli, const struct chunk_args *a, Kolo__SnapshotAck **ack,
                     char *err)
{
    Kolo__SnapshotChunk m = KOLO__SNAPSHOT_CHUNK__INIT;
    m.upload_id = a->upload;
    m.chunk_index = a->index;
    m.total_chunks = a->total;
    m.total_bytes = a->total_bytes;
    m.checksum.data = (uint8_t *)a->sum;
    m.checksum.len = a->sum_len;
    m.meta_json = (char *)(a->meta ? a->meta : "");
    m.data.data = (uint8_t *)a->data;
    m.data.len = a->len;
    m.keep = a->keep;
    size_t len = kolo__snapshot_chunk__get_packed_size(&m);
    uint8_t *buf = malloc(len + 1);
    kolo__snapshot_chunk__pack(&m, buf);
    void *out = NULL;
    size_t olen = 0;
    int rv =
        rpc_client_call(cli, "WorkerService.PutSnapshot", buf, len, &out, &olen, 5000, err, 512);
    free(buf);
    if (ack)
        *ack = NULL;
    if (rv == 0) {
        Kolo__SnapshotAck *r = kolo__snapshot_ack__unpack(NULL, olen, out);
        REQUIRE(r);
        if (ack)
            *ack = r;
        else
            kolo__snapshot_ack__free_unpacked(r, NULL);
    }
    free(out);
    return rv;
}

/* chunk_of describes chunk i of blob b cut into n chunks. */
static struct chunk_args chunk_of(const struct blob *b, uint64_t upload, uint32_t i, uint32_t n,
                                  const char *meta)
{
    size_t per = (b->len + n - 1) / n;
    size_t off = (size_t)i * per;
    size_t len = off >= b->len ? 0 : (b->len - off < per ? b->len - off : per);
    struct chunk_args a = {upload, i, n, b->len, b->sum, SHA256_LEN, meta, b->data + off, len, 0};
    return a;
}

/* put_all uploads b in n chunks and returns the snapshot id (0 on error). */
static uint64_t put_all(struct rpc_client *cli, const struct blob *b, uint64_t upload, uint32_t n,
                        const char *meta, uint32_t keep)
{
    char err[512];
    uint64_t id = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct chunk_args a = chunk_of(b, upload, i, n, meta);
        a.keep = keep;
        Kolo__SnapshotAck *ack = NULL;
        int rv = put_chunk(cli, &a, &ack, err);
        if (rv) {
            fprintf(stderr, "put chunk %u: %s: %s\n", i, abi_errname(rv), err);
            return 0;
        }
        if (i + 1 < n) {
            CHECK(!ack->committed);
            CHECK_EQ_INT(ack->next_chunk, i + 1);
        } else {
            CHECK(ack->committed);
            id = ack->snapshot_id;
        }
        kolo__snapshot_ack__free_unpacked(ack, NULL);
    }
    return id;
}

/* ---------------------------------------------------------------- get helper */

/* get_all reads snapshot id (0: latest) back; returns 0 and the bytes. */
static int get_all(struct rpc_client *cli, uint64_t id, uint8_t **data, size_t *len,
                   uint64_t *got_id, char *meta, size_t metalen)
{
    char err[512];
    *data = NULL;
    *len = 0;
    uint32_t n = 1;
    for (uint32_t k = 0; k < n; k++) {
        Kolo__GetSnapshotRequest q = KOLO__GET_SNAPSHOT_REQUEST__INIT;
        q.snapshot_id = k ? *got_id : id;
        q.chunk_index = k;
        uint8_t qb[32];
        size_t ql = kolo__get_snapshot_request__pack(&q, qb);
        void *out = NULL;
        size_t olen = 0;
        int rv = rpc_client_call(cli, "WorkerService.GetSnapshot", qb, ql, &out, &olen, 5000, err,
                                 sizeof err);
        if (rv) {
            free(*data);
            *data = NULL;
            return rv;
        }
        Kolo__GetSnapshotReply *r = kolo__get_snapshot_reply__unpack(NULL, olen, out);
        free(out);
        REQUIRE(r);
        if (k == 0) {
            n = r->total_chunks;
            *got_id = r->snapshot_id;
            *data = malloc(r->total_bytes + 1);
            if (meta)
                snprintf(meta, metalen, "%s", r->meta_json);
        }
        CHECK_EQ_INT(r->chunk_index, k);
        memcpy(*data + *len, r->data.data, r->data.len);
        *len += r->data.len;
        if (k + 1 == n) {
            uint8_t sum[SHA256_LEN];
            sha256(*data, *len, sum);
            CHECK(r->checksum.len == SHA256_LEN && memcmp(sum, r->checksum.data, SHA256_LEN) == 0);
            CHECK_EQ_INT(*len, r->total_bytes);
        }
        kolo__get_snapshot_reply__free_unpacked(r, NULL);
    }
    return 0;
}

/* ---------------------------------------------------------------- HTTP helper */

static char *http_get(const char *path)
{
    return harness_http_get(coord_http_url(coord), path, NULL);
}

/* ---------------------------------------------------------------- cases */

static void test_roundtrip(void)
{
    struct rpc_client *r0 = client(job_id, 1, 0), *r1 = client(job_id, 1, 1);
    uint8_t *data;
    size_t len;
    uint64_t id = 0;
    CHECK_EQ_INT(get_all(r1, 0, &data, &len, &id, NULL, 0), KOLO_ENOTFOUND);

    struct blob b = make_blob(10000, 1);
    char err[512];
    const char *meta = "{\"epoch\":3,\"batch\":7,\"note\":\"x\"}";
    /* chunk 0, then the same chunk again: harmless */
    struct chunk_args a = chunk_of(&b, 0xAB, 0, 3, meta);
    Kolo__SnapshotAck *ack;
    CHECK_EQ_INT(put_chunk(r0, &a, &ack, err), 0);
    CHECK_EQ_INT(ack->next_chunk, 1);
    kolo__snapshot_ack__free_unpacked(ack, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, &ack, err), 0);
    CHECK_EQ_INT(ack->next_chunk, 1);
    CHECK(!ack->committed);
    kolo__snapshot_ack__free_unpacked(ack, NULL);
    /* out of order */
    a = chunk_of(&b, 0xAB, 2, 3, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ESTATE);
    CHECK(strstr(err, "expects chunk 1") != NULL);
    a = chunk_of(&b, 0xAB, 1, 3, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), 0);
    a = chunk_of(&b, 0xAB, 2, 3, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, &ack, err), 0);
    CHECK(ack->committed);
    uint64_t sid = ack->snapshot_id;
    CHECK(sid > 0);
    CHECK_EQ_INT(ack->generation, 1);
    kolo__snapshot_ack__free_unpacked(ack, NULL);
    /* the final reply was "lost": the last chunk again, or the whole upload
     * from chunk 0, learn the same id */
    CHECK_EQ_INT(put_chunk(r0, &a, &ack, err), 0);
    CHECK(ack->committed && ack->snapshot_id == sid);
    kolo__snapshot_ack__free_unpacked(ack, NULL);
    a = chunk_of(&b, 0xAB, 0, 3, meta);
    CHECK_EQ_INT(put_chunk(r0, &a, &ack, err), 0);
    CHECK(ack->committed && ack->snapshot_id == sid);
    kolo__snapshot_ack__free_unpacked(ack, NULL);

    /* any rank reads it back, byte for byte */
    char got_meta[256];
    CHECK_EQ_INT(get_all(r1, 0, &data, &len, &id, got_meta, sizeof got_meta), 0);
    CHECK_EQ_INT(id, sid);
    CHECK(len == b.len && memcmp(data, b.data, len) == 0);
    CHECK_EQ_STR(got_meta, meta);
    free(data);
    CHECK_EQ_INT(get_all(r0, sid, &data, &len, &id, NULL, 0), 0);
    CHECK(len == b.len && memcmp(data, b.data, len) == 0);
    free(data);
    CHECK_EQ_INT(get_all(r0, sid + 1000, &data, &len, &id, NULL, 0), KOLO_ENOTFOUND);

    /* an empty snapshot is one empty chunk */
    struct blob e = make_blob(0, 0);
    uint64_t eid = put_all(r0, &e, 0xE, 1, NULL, 0);
    CHECK(eid > sid);
    CHECK_EQ_INT(get_all(r1, 0, &data, &len, &id, got_meta, sizeof got_meta), 0);
    CHECK_EQ_INT(len, 0);
    CHECK_EQ_INT(id, eid);
    CHECK_EQ_STR(got_meta, "{}");
    free(data);

    /* a chunk beyond the snapshot */
    Kolo__GetSnapshotRequest q = KOLO__GET_SNAPSHOT_REQUEST__INIT;
    q.snapshot_id = sid;
    q.chunk_index = 3;
    uint8_t qb[32];
    size_t ql = kolo__get_snapshot_request__pack(&q, qb);
    void *out = NULL;
    size_t olen;
    CHECK_EQ_INT(rpc_client_call(r1, "WorkerService.GetSnapshot", qb, ql, &out, &olen, 3000, err,
                                 sizeof err),
                 KOLO_EINVAL);
    free(out);
    free(b.data);
    free(e.data);
    rpc_client_close(r0);
    rpc_client_close(r1);
}

static void test_bad_chunks(void)
{
    struct rpc_client *r0 = client(job_id, 1, 0);
    char err[512];
    struct blob b = make_blob(3000, 2);
    uint8_t short_sum[5] = {0};
    struct chunk_args a;

    /* garbage instead of a message */
    void *out = NULL;
    size_t olen;
    CHECK_EQ_INT(rpc_client_call(r0, "WorkerService.PutSnapshot", "\xff\xff\xff\x01", 4, &out,
                                 &olen, 3000, err, sizeof err),
                 KOLO_EPROTO);
    free(out);
    a = chunk_of(&b, 0, 0, 2, NULL); /* upload id 0 */
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    a = chunk_of(&b, 1, 0, 2, NULL);
    a.sum = short_sum;
    a.sum_len = sizeof short_sum;
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    CHECK(strstr(err, "SHA-256") != NULL);
    a = chunk_of(&b, 1, 2, 2, NULL); /* index >= total */
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    a = chunk_of(&b, 1, 0, 2, NULL); /* no chunks */
    a.total = 0;
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    a = chunk_of(&b, 1, 0, 2, NULL);
    a.total_bytes = MAX_BYTES + 1ull; /* over the limit */
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ETOOBIG);
    CHECK(strstr(err, "--snapshot-max-bytes") != NULL);
    a = chunk_of(&b, 1, 0, 2, "[1,2]");
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    a = chunk_of(&b, 1, 0, 2, "{not json");
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    a = chunk_of(&b, 1, 0, 2, NULL);
    a.len = a.total_bytes + 1; /* more data than the snapshot */
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);

    /* a later chunk disagreeing with its upload */
    a = chunk_of(&b, 2, 0, 2, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), 0);
    a = chunk_of(&b, 2, 1, 2, NULL);
    a.total_bytes++;
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    /* the last chunk leaves bytes missing */
    a = chunk_of(&b, 2, 1, 2, NULL);
    a.len--;
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    /* ... which dropped the upload */
    a = chunk_of(&b, 2, 1, 2, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ENOTFOUND);

    /* the wrong checksum: refused at the end, nothing stored */
    struct blob other = make_blob(3000, 3);
    a = chunk_of(&b, 3, 0, 2, NULL);
    a.sum = other.sum;
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), 0);
    a = chunk_of(&b, 3, 1, 2, NULL);
    a.sum = other.sum;
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_EPROTO);
    CHECK(strstr(err, "checksum mismatch") != NULL);
    uint8_t *data;
    size_t len;
    uint64_t id;
    CHECK_EQ_INT(get_all(r0, 0, &data, &len, &id, NULL, 0), 0);
    CHECK(len != 3000); /* still the empty snapshot of test_roundtrip */
    free(data);

    /* a chunk for an upload this coordinator never saw start */
    a = chunk_of(&b, 4, 1, 2, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ENOTFOUND);
    CHECK(strstr(err, "chunk 0") != NULL);
    free(b.data);
    free(other.data);
    rpc_client_close(r0);
}

static void test_fencing(void)
{
    char err[512];
    struct blob b = make_blob(100, 4);
    struct chunk_args a = chunk_of(&b, 9, 0, 1, NULL);
    struct rpc_client *stale = client(job_id, 7, 0);
    CHECK_EQ_INT(put_chunk(stale, &a, NULL, err), KOLO_ESTALE);
    /* any generation may read */
    uint8_t *data;
    size_t len;
    uint64_t id;
    CHECK_EQ_INT(get_all(stale, 0, &data, &len, &id, NULL, 0), 0);
    free(data);
    rpc_client_close(stale);
    struct rpc_client *nojob = client(job_id + 50, 1, 0);
    CHECK_EQ_INT(put_chunk(nojob, &a, NULL, err), KOLO_EINVAL);
    CHECK_EQ_INT(get_all(nojob, 0, &data, &len, &id, NULL, 0), KOLO_EINVAL);
    rpc_client_close(nojob);
    struct rpc_client *badrank = client(job_id, 1, 5);
    CHECK_EQ_INT(put_chunk(badrank, &a, NULL, err), KOLO_EINVAL);
    rpc_client_close(badrank);
    free(b.data);
}

struct count_ctx {
    int snapshots;
    uint64_t newest;
};

static int count_snapshots(const char *body, struct count_ctx *cc)
{
    struct json *root = NULL;
    char err[200];
    if (json_parse(body, strlen(body), &root, err, sizeof err) != 0) {
        fprintf(stderr, "bad JSON: %s\n", body);
        return -1;
    }
    const struct json *arr = json_get(root, "snapshots");
    REQUIRE(arr && arr->type == JSON_ARRAY);
    cc->snapshots = (int)arr->count;
    if (arr->child) {
        int64_t v = 0;
        json_as_int(json_get(arr->child, "id"), &v);
        cc->newest = (uint64_t)v;
        const struct json *meta = json_get(arr->child, "meta");
        CHECK(meta && meta->type == JSON_OBJECT);
        CHECK(json_get(arr->child, "sha256") != NULL);
        CHECK(json_get(arr->child, "bytes") != NULL);
        CHECK(json_get(arr->child, "created_ms") != NULL);
    }
    json_free(root);
    return 0;
}

static void test_retention_and_rest(void)
{
    struct rpc_client *r0 = client(job_id, 1, 0);
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
        struct blob b = make_blob(2000 + (size_t)i, (uint8_t)(10 + i));
        char meta[64];
        snprintf(meta, sizeof meta, "{\"step\":%d}", i);
        ids[i] = put_all(r0, &b, 100 + (uint64_t)i, 3, meta, 0);
        CHECK(ids[i] > 0);
        free(b.data);
    }
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/snapshots", job_id);
    char *body = http_get(path);
    struct count_ctx cc = {0};
    CHECK_EQ_INT(count_snapshots(body, &cc), 0);
    CHECK_EQ_INT(cc.snapshots, KEEP);
    CHECK_EQ_INT(cc.newest, ids[3]);
    CHECK(strstr(body, "\"meta\":{\"step\":3}") != NULL);
    free(body);
    uint8_t *data;
    size_t len;
    uint64_t id;
    CHECK_EQ_INT(get_all(r0, ids[1], &data, &len, &id, NULL, 0), KOLO_ENOTFOUND);
    CHECK_EQ_INT(get_all(r0, ids[2], &data, &len, &id, NULL, 0), 0);
    CHECK_EQ_INT(len, 2002);
    free(data);

    /* a job asks to keep more */
    for (int i = 0; i < 3; i++) {
        struct blob b = make_blob(500, (uint8_t)(20 + i));
        CHECK(put_all(r0, &b, 200 + (uint64_t)i, 2, NULL, 4) > 0);
        free(b.data);
    }
    body = http_get(path);
    CHECK_EQ_INT(count_snapshots(body, &cc), 0);
    CHECK_EQ_INT(cc.snapshots, 4);
    free(body);
    body = http_get("/api/v1/jobs/999/snapshots");
    CHECK(strstr(body, "no such job") != NULL);
    free(body);
    rpc_client_close(r0);
}

static void test_abandoned_upload(void)
{
    struct rpc_client *r0 = client(job_id, 1, 0);
    char err[512];
    struct blob b = make_blob(1000, 5);
    struct chunk_args a = chunk_of(&b, 77, 0, 2, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), 0);
    char path[128];
    snprintf(path, sizeof path, "/api/v1/jobs/%" PRIu64 "/snapshots", job_id);
    char *body = http_get(path);
    CHECK(strstr(body, "\"chunks_received\":1") != NULL);
    free(body);
    usleep(900 * 1000); /* the coordinator drops it after 400 ms idle */
    a = chunk_of(&b, 77, 1, 2, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ENOTFOUND);
    /* a new upload supersedes an older one of the same job when both do
     * not fit in the job's memory budget */
    struct blob big = make_blob(MAX_BYTES * 3 / 4, 6);
    a = chunk_of(&big, 78, 0, 4, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), 0);
    uint64_t id = put_all(r0, &big, 79, 4, NULL, 0);
    CHECK(id > 0);
    a = chunk_of(&big, 78, 1, 4, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ENOTFOUND);
    free(big.data);
    free(b.data);
    rpc_client_close(r0);
}

/* metric returns the value of an unlabelled metric, -1 if absent. */
static long long metric(const char *text, const char *name)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr(text, pat);
    return p ? atoll(p + strlen(pat)) : -1;
}

static void test_metrics(void)
{
    char *m = http_get("/metrics");
    CHECK(strstr(m, "# TYPE kolo_snapshots_committed_total counter") != NULL);
    CHECK(strstr(m, "kolo_snapshot_bytes_total ") != NULL);
    CHECK(strstr(m, "kolo_snapshot_commit_seconds_bucket{le=\"+Inf\"}") != NULL);
    CHECK(strstr(m, "kolo_snapshot_commit_seconds_count ") != NULL);
    CHECK(strstr(m, "kolo_snapshot_write_seconds_sum ") != NULL);
    CHECK(strstr(m, "kolo_rpc_requests_total{method=\"WorkerService.PutSnapshot\"}") != NULL);
    CHECK(metric(m, "kolo_snapshots_committed_total") >= 8);
    CHECK(metric(m, "kolo_snapshot_commit_failures_total") >= 3);
    CHECK(metric(m, "kolo_snapshot_uploads_dropped_total") >= 2);
    CHECK(metric(m, "kolo_snapshot_bytes_total") > 10000);
    free(m);
}

/* A restarted coordinator still has every committed snapshot and has lost
 * the partial upload, which it says with KOLO_ENOTFOUND. */
static void test_restart(void)
{
    struct rpc_client *r0 = client(job_id, 1, 0);
    char err[512];
    struct blob b = make_blob(3000, 8);
    struct chunk_args a = chunk_of(&b, 500, 0, 3, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), 0);
    uint8_t *before;
    size_t before_len;
    uint64_t before_id;
    CHECK_EQ_INT(get_all(r0, 0, &before, &before_len, &before_id, NULL, 0), 0);
    rpc_client_close(r0);
    coord_stop(coord);
    coord = start();
    r0 = client(job_id, 1, 0);
    a = chunk_of(&b, 500, 1, 3, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ENOTFOUND);
    uint8_t *after;
    size_t after_len;
    uint64_t after_id;
    CHECK_EQ_INT(get_all(r0, 0, &after, &after_len, &after_id, NULL, 0), 0);
    CHECK_EQ_INT(after_id, before_id);
    CHECK(after_len == before_len && memcmp(before, after, after_len) == 0);
    /* and the upload goes through from chunk 0 */
    CHECK(put_all(r0, &b, 500, 3, NULL, 0) > after_id);
    free(before);
    free(after);

    /* a job that ended takes no snapshots (KOLO_ESTATE, which clients do
     * not retry), and its snapshots can still be read */
    Kolo__StopJobRequest stop = KOLO__STOP_JOB_REQUEST__INIT;
    stop.job_id = job_id;
    stop.reason = "test";
    uint8_t buf[64];
    size_t len = kolo__stop_job_request__pack(&stop, buf);
    void *out = NULL;
    size_t olen;
    struct rpc_client *admin = client(0, 0, 0);
    CHECK_EQ_INT(rpc_client_call(admin, "AdminService.StopJob", buf, len, &out, &olen, 3000, err,
                                 sizeof err),
                 0);
    free(out);
    rpc_client_close(admin);
    a = chunk_of(&b, 501, 0, 3, NULL);
    CHECK_EQ_INT(put_chunk(r0, &a, NULL, err), KOLO_ESTATE);
    CHECK(strstr(err, "takes no snapshots") != NULL);
    CHECK_EQ_INT(get_all(r0, 0, &after, &after_len, &after_id, NULL, 0), 0);
    free(after);
    free(b.data);
    rpc_client_close(r0);
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(dbpath, sizeof dbpath, "%s/coord.db", dir);
    coord = start();
    make_job();
    test_roundtrip();
    test_bad_chunks();
    test_fencing();
    test_retention_and_rest();
    test_abandoned_upload();
    test_metrics();
    test_restart();
    coord_stop(coord);
    test_remove_db(dbpath, dir);
    TEST_DONE();
}
