/*
 * coord_snap.c - elastic-state snapshots: PutSnapshot, GetSnapshot, their
 * REST listing and metrics.
 *
 * DESIGN
 *
 * A snapshot is what `state.commit()` makes durable: an opaque blob and a
 * small JSON object of metadata, uploaded by one rank of the job's current
 * generation in chunks (the fencing of every worker request applies: a
 * stale generation cannot commit). Chunks arrive in order, one RPC each,
 * and are kept in memory, as the unpacked messages themselves, until the
 * last one; then the SHA-256 of the whole blob is checked against the one
 * the client sent and the snapshot, every chunk, and the pruning of the
 * job's older snapshots go to SQLite in one transaction. Only after that
 * transaction committed (synchronous=FULL: it is on disk) does the last
 * chunk get its reply, which is the acknowledgement. So an acknowledged
 * snapshot survives a kill -9 of the coordinator, and a snapshot is in the
 * store whole or not at all.
 *
 * Partial uploads are memory only: a restarted coordinator has lost them,
 * answers a later chunk with KOLO_ENOTFOUND, and the client sends the
 * upload again from chunk 0 under the same upload id. A client whose
 * final reply was lost (the coordinator died between its commit and the
 * reply) asks again and is told the upload was committed - the snapshot
 * row records (job, upload id) uniquely - instead of storing it twice.
 *
 * Bounds: a snapshot may be at most --snapshot-max-bytes, which is also
 * what one job's partial uploads may hold in memory together (a new
 * upload first drops the job's older ones to fit); a chunk carries at
 * most SNAP_MAX_CHUNK bytes and an upload at most SNAP_MAX_CHUNKS chunks;
 * at most SNAP_MAX_UPLOADS uploads are in flight in all; an upload that
 * makes no progress for --snapshot-upload-timeout, or whose job stopped
 * running, is dropped by the tick.
 *
 * Cost. Handlers run under the state lock like every other (see
 * coord_model.h), with two exceptions, so that negotiation is not held
 * up by a commit: hashing a chunk runs with the lock released, the upload
 * marked busy meanwhile; and the final transaction (about 5-10 ms per MiB
 * on a local disk, mostly the fsync) runs on the snapshot writer thread,
 * over its own SQLite connection to the same file, the upload still
 * marked busy. WAL lets the coordinator's own connection read meanwhile;
 * one of its writes (an event, output lines) waits for the snapshot's
 * transaction (busy_timeout). The writer then takes the state lock only to
 * answer the last chunk and record the commit. Reads (GetSnapshot) go
 * chunk by chunk, one SQLite read each.
 */
#include "coord_snap.h"
#include "coord_core.h"
#include "coord_jobs.h"
#include "coord_writer.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "hmac.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "util.h"

#define SNAP_DEFAULT_KEEP      3
#define SNAP_DEFAULT_MAX_BYTES (2ll << 30)
#define SNAP_DEFAULT_UPLOAD_MS 60000
#define SNAP_MAX_KEEP          100000
#define SNAP_MAX_CHUNK         RPC_MAX_REQUEST /* no request is larger (rpc.h) */
#define SNAP_MAX_CHUNKS        (1u << 20)
#define SNAP_MAX_META          (64u << 10)

/* One partial upload. chunks[i] is the unpacked message of chunk i; its
 * data stays in it until the snapshot is stored. */
struct snap_upload {
    struct snap_upload *next;
    uint64_t job_id;
    uint64_t upload_id;
    uint64_t seq;
    uint64_t generation;
    int rank;
    uint32_t total_chunks;
    uint32_t next_chunk;
    uint64_t total_bytes;
    uint64_t received;
    uint8_t checksum[SHA256_LEN];
    bool has_checksum; /* the client sent it (at the latest with the last chunk) */
    char *meta_json;
    uint32_t keep; /* 0: the coordinator's */
    Kolo__SnapshotChunk **chunks;
    uint32_t chunks_cap;
    struct sha256 sha;
    bool busy; /* a handler hashes a chunk without the state lock */
    uint64_t started_mono, touched_mono;
};

/* ---------------------------------------------------------------- config */

static int64_t snap_keep(const struct coord *c)
{
    return c->cfg.snapshot_keep > 0 ? c->cfg.snapshot_keep : SNAP_DEFAULT_KEEP;
}

static int64_t snap_max_bytes(const struct coord *c)
{
    return c->cfg.snapshot_max_bytes > 0 ? c->cfg.snapshot_max_bytes : SNAP_DEFAULT_MAX_BYTES;
}

static int64_t snap_upload_ms(const struct coord *c)
{
    return c->cfg.snapshot_upload_ms > 0 ? c->cfg.snapshot_upload_ms : SNAP_DEFAULT_UPLOAD_MS;
}

/* ---------------------------------------------------------------- uploads */

static void upload_free(struct snap_upload *u)
{
    if (!u)
        return;
    for (uint32_t i = 0; i < u->next_chunk && i < u->chunks_cap; i++)
        if (u->chunks[i])
            kolo__snapshot_chunk__free_unpacked(u->chunks[i], NULL);
    free(u->chunks);
    free(u->meta_json);
    free(u);
}

static struct snap_upload *upload_find(struct coord *c, uint64_t job_id, uint64_t upload_id)
{
    for (struct snap_upload *u = c->snap_uploads; u; u = u->next)
        if (u->job_id == job_id && u->upload_id == upload_id)
            return u;
    return NULL;
}

static void upload_drop(struct coord *c, struct snap_upload *u, const char *why)
{
    for (struct snap_upload **p = &c->snap_uploads; *p; p = &(*p)->next) {
        if (*p == u) {
            *p = u->next;
            break;
        }
    }
    if (why) {
        c->m.snap.uploads_dropped++;
        LOGI("coord",
             "job %" PRIu64 ": snapshot upload %016" PRIx64 " dropped (%s) after %u of "
             "%u chunks",
             u->job_id, u->upload_id, why, u->next_chunk, u->total_chunks);
    }
    upload_free(u);
}

static uint64_t job_upload_bytes(struct coord *c, uint64_t job_id)
{
    uint64_t sum = 0;
    for (struct snap_upload *u = c->snap_uploads; u; u = u->next)
        if (u->job_id == job_id)
            sum += u->total_bytes;
    return sum;
}

static int uploads_count(struct coord *c)
{
    int n = 0;
    for (struct snap_upload *u = c->snap_uploads; u; u = u->next)
        n++;
    return n;
}

/* oldest_upload_of returns the job's idle upload touched longest ago. */
static struct snap_upload *oldest_upload_of(struct coord *c, uint64_t job_id)
{
    struct snap_upload *best = NULL;
    for (struct snap_upload *u = c->snap_uploads; u; u = u->next)
        if (u->job_id == job_id && !u->busy && (!best || u->touched_mono < best->touched_mono))
            best = u;
    return best;
}

/* ---------------------------------------------------------------- helpers */

static void hex(const uint8_t *d, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static int unhex(const char *s, uint8_t *out, size_t n)
{
    if (!s || strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* fail answers a put with an error and counts it. */
static void put_fail(struct coord *c, struct rpc_call *call, bool counts_as_commit_failure,
                     int code, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void put_fail(struct coord *c, struct rpc_call *call, bool counts_as_commit_failure,
                     int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->m.rpc_errors[M_WORKER_PUT_SNAPSHOT]++;
    if (counts_as_commit_failure)
        c->m.snap.commit_failures++;
    LOGD("coord", "PutSnapshot refused: %s", msg);
    rpc_call_error(call, code, "%s", msg);
}

static void ack(struct rpc_call *call, uint32_t next_chunk, bool committed, uint64_t id,
                uint64_t generation)
{
    Kolo__SnapshotAck rep = KOLO__SNAPSHOT_ACK__INIT;
    rep.next_chunk = next_chunk;
    rep.committed = committed;
    rep.snapshot_id = id;
    rep.generation = generation;
    coord_send_pb(call, &rep.base);
}

struct found {
    bool found;
    uint64_t id, generation, total_bytes;
    int rank;
    uint64_t created_ms;
    uint32_t nchunks;
    char checksum[2 * SHA256_LEN + 1];
    char *meta_json;
};

static int copy_found(const struct store_snapshot *s, void *arg)
{
    struct found *f = arg;
    f->found = true;
    f->id = s->id;
    f->generation = s->generation;
    f->total_bytes = s->total_bytes;
    f->rank = s->rank;
    f->created_ms = s->created_ms;
    f->nchunks = s->nchunks;
    str_copy(f->checksum, s->checksum ? s->checksum : "", sizeof f->checksum);
    f->meta_json = strdup(s->meta_json ? s->meta_json : "{}");
    return f->meta_json ? 0 : KOLO_ENOMEM;
}

/* ---------------------------------------------------------------- commit */

/* A complete upload on its way to the writer thread (coord_writer.h),
 * marked busy meanwhile, so that no handler touches it. */
struct snap_write {
    struct writer_job job;
    struct coord *c;
    struct rpc_call *call;
    struct snap_upload *u;
    char sumhex[2 * SHA256_LEN + 1];
    int64_t keep;
    /* filled by snap_write below */
    struct store_snapshot s;
    int pruned;
    char why[300];
    uint64_t t0, t1;
    uint64_t job_id, duration_ms;
    bool failed;
};

int coord_snap_start(struct coord *c, char *err, size_t errlen)
{
    return coord_writer_start(&c->snap_writer, "snapshot", c->db_path, &c->mtx, err, errlen);
}

void coord_snap_stop(struct coord *c)
{
    coord_writer_stop(c->snap_writer); /* it answers the commits it still writes */
    c->snap_writer = NULL;
}

/* Writer thread, no lock: one transaction stores the new snapshot and the
 * retention of the job's older ones, with one fsync. */
static int snap_write(struct writer_job *job, struct store *st)
{
    struct snap_write *sw = (struct snap_write *)job;
    struct snap_upload *u = sw->u;
    struct store_blob *blobs = calloc(u->total_chunks, sizeof *blobs);
    sw->s = (struct store_snapshot){.job_id = u->job_id,
                                    .generation = u->generation,
                                    .rank = u->rank,
                                    .upload_id = u->upload_id,
                                    .created_ms = now_wall_ms(),
                                    .meta_json = u->meta_json ? u->meta_json : "{}",
                                    .total_bytes = u->total_bytes,
                                    .checksum = sw->sumhex,
                                    .nchunks = u->total_chunks};
    int err = blobs ? 0 : KOLO_ENOMEM;
    str_copy(sw->why, "out of memory", sizeof(sw->why));
    sw->t0 = now_mono_ms();
    /* The row gets the duration up to the transaction; the whole one is
     * known only after it and replaces it in snap_after. */
    sw->s.duration_ms = sw->t0 - u->started_mono;
    if (!err) {
        for (uint32_t i = 0; i < u->total_chunks; i++) {
            blobs[i].data = u->chunks[i]->data.data;
            blobs[i].len = u->chunks[i]->data.len;
        }
        err = store_begin(st);
        if (!err) {
            err = store_snapshot_put(st, &sw->s, blobs, u->total_chunks);
            if (!err)
                err = store_snapshot_prune(st, u->job_id, (int)sw->keep, &sw->pruned);
            if (err)
                store_rollback(st);
            else
                err = store_commit(st);
        }
        if (err)
            str_copy(sw->why, store_last_error(st), sizeof(sw->why));
    }
    sw->t1 = now_mono_ms();
    free(blobs);
    return err;
}

/* Writer thread, state lock held: answers the last chunk and records the
 * commit. */
static void snap_done(struct writer_job *job, int err)
{
    struct snap_write *sw = (struct snap_write *)job;
    struct coord *c = sw->c;
    struct snap_upload *u = sw->u;
    coord_hist_observe(&c->m.snap.write, (double)(sw->t1 - sw->t0) / 1000.0);
    u->busy = false;
    if (err) {
        c->m.store_errors++;
        c->m.last_store_error_ms = now_wall_ms();
        put_fail(c, sw->call, true, err == KOLO_ENOMEM ? KOLO_ENOMEM : KOLO_ESTORE,
                 "the snapshot could not be stored: %s", sw->why);
        upload_drop(c, u, NULL);
        sw->u = NULL;
        sw->failed = true;
        return;
    }
    c->m.snap.commits++;
    c->m.snap.commit_bytes += u->total_bytes;
    c->m.snap.pruned += (uint64_t)sw->pruned;
    sw->duration_ms = sw->t1 - u->started_mono;
    coord_hist_observe(&c->m.snap.commit, (double)sw->duration_ms / 1000.0);
    ack(sw->call, u->total_chunks, true, sw->s.id, u->generation);
    char meta[160];
    str_copy(meta, sw->s.meta_json, sizeof meta);
    coord_event(c, u->job_id, NULL, "snapshot.committed",
                "snapshot %" PRIu64 " from rank %d of generation %" PRIu64 ": %" PRIu64
                " bytes in %u chunks, written in %" PRIu64 " ms, meta %s%s",
                sw->s.id, u->rank, u->generation, u->total_bytes, u->total_chunks,
                sw->t1 - sw->t0, meta, sw->pruned ? " (older snapshots pruned)" : "");
    sw->job_id = u->job_id;
    sw->s.meta_json = NULL; /* the upload's, dropped now */
    sw->s.checksum = NULL;
    upload_drop(c, u, NULL);
    sw->u = NULL;
}

/* Writer thread, no lock, after the acknowledgement so that the client
 * does not wait for it: the first chunk to the commit, as
 * kolo_snapshot_commit_seconds. Should this small write fail, the row
 * keeps the shorter figure. */
static void snap_after(struct writer_job *job, struct store *st)
{
    struct snap_write *sw = (struct snap_write *)job;
    if (!sw->failed && store_snapshot_set_duration(st, sw->job_id, sw->s.id, sw->duration_ms) != 0)
        LOGW("coord", "snapshot %" PRIu64 ": cannot record its commit duration: %s", sw->s.id,
             store_last_error(st));
    free(sw);
}

/* commit checks the complete upload u and hands it to the writer thread,
 * which answers the call once the snapshot is on disk. */
static void commit(struct coord *c, struct rpc_call *call, struct snap_upload *u)
{
    uint8_t sum[SHA256_LEN];
    char sumhex[2 * SHA256_LEN + 1], want[2 * SHA256_LEN + 1];
    sha256_final(&u->sha, sum);
    hex(sum, SHA256_LEN, sumhex);
    if (!ct_equal(sum, u->checksum, SHA256_LEN)) {
        hex(u->checksum, SHA256_LEN, want);
        put_fail(c, call, true, KOLO_EPROTO,
                 "snapshot checksum mismatch: the %" PRIu64 " bytes received hash to SHA-256 %s, "
                 "the client sent %s; the upload is dropped",
                 u->received, sumhex, want);
        upload_drop(c, u, NULL);
        return;
    }
    struct snap_write *sw = calloc(1, sizeof(*sw));
    if (!sw || !c->snap_writer) {
        free(sw);
        put_fail(c, call, true, sw ? KOLO_ESHUTDOWN : KOLO_ENOMEM,
                 sw ? "the snapshot writer is not running" : "out of memory");
        upload_drop(c, u, NULL);
        return;
    }
    sw->job = (struct writer_job){.write = snap_write, .done = snap_done, .after = snap_after};
    sw->c = c;
    sw->call = call;
    sw->u = u;
    str_copy(sw->sumhex, sumhex, sizeof(sw->sumhex));
    sw->keep = u->keep ? (int64_t)u->keep : snap_keep(c);
    u->busy = true; /* the writer's until it answers */
    coord_writer_submit(c->snap_writer, &sw->job);
}

/* ---------------------------------------------------------------- put */

/* check_chunk validates a chunk on its own: sizes and fields. */
static bool check_chunk(struct coord *c, const Kolo__SnapshotChunk *m, char *why, size_t whylen,
                        int *code)
{
    *code = KOLO_EPROTO;
    if (m->upload_id == 0)
        snprintf(why, whylen, "upload_id must be non-zero");
    else if (m->total_chunks == 0 || m->total_chunks > SNAP_MAX_CHUNKS)
        snprintf(why, whylen, "total_chunks %u is not between 1 and %u", m->total_chunks,
                 SNAP_MAX_CHUNKS);
    else if (m->chunk_index >= m->total_chunks)
        snprintf(why, whylen, "chunk %u of an upload of %u chunks", m->chunk_index,
                 m->total_chunks);
    else if (m->checksum.len != SHA256_LEN &&
             (m->checksum.len != 0 || m->chunk_index + 1 == m->total_chunks))
        snprintf(why, whylen, "checksum must be a SHA-256 (32 bytes), not %zu bytes%s",
                 m->checksum.len, m->checksum.len ? "" : ", on the last chunk at least");
    else if (m->data.len > SNAP_MAX_CHUNK)
        snprintf(why, whylen, "chunk of %zu bytes exceeds %u", m->data.len, SNAP_MAX_CHUNK);
    else if (m->data.len > m->total_bytes)
        snprintf(why, whylen, "chunk of %zu bytes in a snapshot of %" PRIu64 " bytes", m->data.len,
                 m->total_bytes);
    else if (m->total_bytes > (uint64_t)snap_max_bytes(c)) {
        *code = KOLO_ETOOBIG;
        snprintf(why, whylen,
                 "snapshot of %" PRIu64 " bytes exceeds the coordinator's limit of %" PRId64
                 " bytes (kolo coordinator --snapshot-max-bytes)",
                 m->total_bytes, snap_max_bytes(c));
    } else if (m->keep > SNAP_MAX_KEEP)
        snprintf(why, whylen, "keep %u exceeds %d", m->keep, SNAP_MAX_KEEP);
    else
        return true;
    return false;
}

/* upload_start makes room for and creates the upload of chunk 0. */
static struct snap_upload *upload_start(struct coord *c, struct rpc_call *call,
                                        const Kolo__SnapshotChunk *m, const struct job *j)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    char why[300];
    if (!json_object_ok(m->meta_json, SNAP_MAX_META, "meta_json", why, sizeof why)) {
        put_fail(c, call, true, KOLO_EPROTO, "%s", why);
        return NULL;
    }
    /* Make room: the job's older uploads give way (a client that started
     * a new upload has most likely given up on them). */
    uint64_t cap = (uint64_t)snap_max_bytes(c);
    struct snap_upload *old;
    while (job_upload_bytes(c, j->id) + m->total_bytes > cap && (old = oldest_upload_of(c, j->id)))
        upload_drop(c, old, "superseded by a newer upload");
    if (uploads_count(c) >= SNAP_MAX_UPLOADS) {
        put_fail(c, call, false, KOLO_EBUSY,
                 "%d snapshot uploads are in flight on this coordinator; retry later",
                 SNAP_MAX_UPLOADS);
        return NULL;
    }
    struct snap_upload *u = calloc(1, sizeof *u);
    if (!u || !(u->meta_json = strdup(m->meta_json[0] ? m->meta_json : "{}"))) {
        free(u);
        put_fail(c, call, false, KOLO_ENOMEM, "out of memory");
        return NULL;
    }
    u->job_id = j->id;
    u->upload_id = m->upload_id;
    u->seq = m->seq;
    u->generation = j->generation;
    u->rank = f->rank;
    u->total_chunks = m->total_chunks;
    u->total_bytes = m->total_bytes;
    u->keep = m->keep;
    sha256_init(&u->sha);
    u->started_mono = u->touched_mono = now_mono_ms();
    u->next = c->snap_uploads;
    c->snap_uploads = u;
    return u;
}

static void rpc_put(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    /* A job that ended is KOLO_ESTATE here, not the fence's
     * KOLO_ESHUTDOWN: clients retry that one, which is also what a
     * coordinator that is shutting down answers. */
    struct job *ended = coord_job_find(c, f->job_id);
    if (ended && ended->state != JOB_RUNNING) {
        put_fail(c, call, false, KOLO_ESTATE, "job %" PRIu64 " is %s: it takes no snapshots",
                 ended->id, coord_job_state_name(ended->state));
        return;
    }
    struct job *j = coord_worker_fence(c, call, M_WORKER_PUT_SNAPSHOT);
    if (!j)
        return;
    Kolo__SnapshotChunk *m = kolo__snapshot_chunk__unpack(NULL, f->body_len, f->body);
    if (!m) {
        put_fail(c, call, false, KOLO_EPROTO, "malformed SnapshotChunk");
        return;
    }
    char why[400];
    int code;
    if (!check_chunk(c, m, why, sizeof why, &code)) {
        put_fail(c, call, true, code, "%s", why);
        kolo__snapshot_chunk__free_unpacked(m, NULL);
        return;
    }
    struct snap_upload *u = upload_find(c, j->id, m->upload_id);
    if (!u) {
        /* Unknown upload: committed already (the client lost the reply),
         * a new upload (chunk 0), or one this coordinator never saw the
         * start of (it restarted, or dropped the upload). */
        struct found fd = {0};
        int rc = store_snapshot_by_upload(c->store, j->id, m->upload_id, copy_found, &fd);
        free(fd.meta_json);
        if (rc == 0 && fd.found) {
            ack(call, m->total_chunks, true, fd.id, fd.generation);
            kolo__snapshot_chunk__free_unpacked(m, NULL);
            return;
        }
        if (rc != 0 && rc != KOLO_ENOTFOUND) {
            coord_store_failed(c, "snapshot lookup");
            put_fail(c, call, false, KOLO_ESTORE, "snapshot lookup failed: %s",
                     store_last_error(c->store));
            kolo__snapshot_chunk__free_unpacked(m, NULL);
            return;
        }
        if (m->chunk_index != 0) {
            put_fail(c, call, false, KOLO_ENOTFOUND,
                     "snapshot upload %016" PRIx64 " is not known to this coordinator (it "
                     "restarted, or dropped the upload): send it again from chunk 0",
                     m->upload_id);
            kolo__snapshot_chunk__free_unpacked(m, NULL);
            return;
        }
        if (!(u = upload_start(c, call, m, j))) {
            kolo__snapshot_chunk__free_unpacked(m, NULL);
            return;
        }
    } else if (m->total_chunks != u->total_chunks || m->total_bytes != u->total_bytes ||
               (m->checksum.len && u->has_checksum &&
                memcmp(m->checksum.data, u->checksum, SHA256_LEN) != 0)) {
        put_fail(c, call, true, KOLO_EPROTO,
                 "chunk %u disagrees with its upload %016" PRIx64
                 " (total_chunks, total_bytes or checksum changed)",
                 m->chunk_index, m->upload_id);
        kolo__snapshot_chunk__free_unpacked(m, NULL);
        return;
    }
    if (u->busy) {
        put_fail(c, call, false, KOLO_EBUSY,
                 "chunk %u of upload %016" PRIx64 " is being received; retry", u->next_chunk,
                 m->upload_id);
        kolo__snapshot_chunk__free_unpacked(m, NULL);
        return;
    }
    if (m->chunk_index < u->next_chunk) {
        /* A retry of a chunk already taken (its reply was lost). */
        ack(call, u->next_chunk, false, 0, u->generation);
        kolo__snapshot_chunk__free_unpacked(m, NULL);
        return;
    }
    if (m->chunk_index > u->next_chunk) {
        put_fail(c, call, true, KOLO_ESTATE,
                 "snapshot chunk %u out of order: upload %016" PRIx64 " expects chunk %u",
                 m->chunk_index, m->upload_id, u->next_chunk);
        kolo__snapshot_chunk__free_unpacked(m, NULL);
        return;
    }
    bool last = m->chunk_index + 1 == u->total_chunks;
    uint64_t received = u->received + m->data.len;
    if (received > u->total_bytes || (last && received != u->total_bytes)) {
        put_fail(c, call, true, KOLO_EPROTO,
                 "snapshot chunks add up to %" PRIu64 " bytes by chunk %u; the upload declared "
                 "%" PRIu64,
                 received, m->chunk_index, u->total_bytes);
        upload_drop(c, u, NULL);
        kolo__snapshot_chunk__free_unpacked(m, NULL);
        return;
    }
    if (u->next_chunk >= u->chunks_cap) {
        uint32_t cap = u->chunks_cap ? u->chunks_cap * 2 : 16;
        if (cap > u->total_chunks)
            cap = u->total_chunks;
        Kolo__SnapshotChunk **nc = realloc(u->chunks, cap * sizeof *nc);
        if (!nc) {
            put_fail(c, call, false, KOLO_ENOMEM, "out of memory");
            kolo__snapshot_chunk__free_unpacked(m, NULL);
            return;
        }
        u->chunks = nc;
        u->chunks_cap = cap;
    }
    /* A client may hash in parallel with its upload and send the checksum
     * only with the last chunk; the first one sent is the upload's. */
    if (m->checksum.len && !u->has_checksum) {
        memcpy(u->checksum, m->checksum.data, SHA256_LEN);
        u->has_checksum = true;
    }
    /* Hashing is the one slow step of a chunk (about 6 ms per MiB) and
     * needs nothing but the upload: it runs without the state lock, so
     * negotiation goes on meanwhile. The busy mark keeps everyone else
     * off the upload: a chunk for it gets KOLO_EBUSY, the tick and newer
     * uploads do not drop it. (coord_stop closes the RPC server, which
     * waits for this handler, before it frees anything.) */
    u->busy = true;
    pthread_mutex_unlock(&c->mtx);
    sha256_update(&u->sha, m->data.data, m->data.len);
    pthread_mutex_lock(&c->mtx);
    u->busy = false;
    /* Fencing again: the generation may have moved on meanwhile. */
    struct job *now = coord_job_find(c, u->job_id);
    if (!now || now->state != JOB_RUNNING || now->generation != u->generation) {
        c->m.stale_generation++;
        put_fail(c, call, true, KOLO_ESTALE,
                 "job %" PRIu64 " left generation %" PRIu64 " during the upload", u->job_id,
                 u->generation);
        upload_drop(c, u, NULL);
        kolo__snapshot_chunk__free_unpacked(m, NULL);
        return;
    }
    u->chunks[u->next_chunk++] = m; /* the upload owns the message now */
    u->received = received;
    u->touched_mono = now_mono_ms();
    if (last)
        commit(c, call, u);
    else
        ack(call, u->next_chunk, false, 0, u->generation);
}

/* ---------------------------------------------------------------- get */

/* The chunk is sent from SQLite's own buffer, which is valid only inside
 * store_snapshot_chunk's callback: the reply is packed there. */
struct chunk_out {
    struct coord *c;
    struct rpc_call *call;
    Kolo__GetSnapshotReply *rep;
};

static int send_chunk(const void *data, size_t len, void *arg)
{
    struct chunk_out *o = arg;
    o->rep->data.data = (uint8_t *)data;
    o->rep->data.len = len;
    o->c->m.snap.gets++;
    o->c->m.snap.get_bytes += len;
    coord_send_pb(o->call, &o->rep->base);
    return 0;
}

static void rpc_get(struct coord *c, struct rpc_call *call)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    struct job *j = coord_job_find(c, f->job_id);
    /* Any rank of the job may read, in any state and generation: a new
     * worker, or a job restarted after all its workers died, restores
     * from here. */
    if (!j || f->rank < 0 || f->rank >= COORD_MAX_NP) {
        c->m.rpc_errors[M_WORKER_GET_SNAPSHOT]++;
        rpc_call_error(call, KOLO_EINVAL, "%s (job %llu, rank %d)",
                       j ? "rank out of range" : "no such job", (unsigned long long)f->job_id,
                       f->rank);
        return;
    }
    Kolo__GetSnapshotRequest *req = kolo__get_snapshot_request__unpack(NULL, f->body_len, f->body);
    if (!req) {
        c->m.rpc_errors[M_WORKER_GET_SNAPSHOT]++;
        rpc_call_error(call, KOLO_EPROTO, "malformed GetSnapshotRequest");
        return;
    }
    struct found fd = {0};
    int rc = req->snapshot_id
                 ? store_snapshot_get(c->store, j->id, req->snapshot_id, copy_found, &fd)
                 : store_snapshot_latest(c->store, j->id, copy_found, &fd);
    uint32_t index = req->chunk_index;
    uint64_t asked = req->snapshot_id;
    kolo__get_snapshot_request__free_unpacked(req, NULL);
    if (rc == KOLO_ENOTFOUND) {
        c->m.rpc_errors[M_WORKER_GET_SNAPSHOT]++;
        if (asked)
            rpc_call_error(call, KOLO_ENOTFOUND,
                           "job %" PRIu64 " has no snapshot %" PRIu64
                           " (never committed, or pruned)",
                           j->id, asked);
        else
            rpc_call_error(call, KOLO_ENOTFOUND, "job %" PRIu64 " has no snapshot", j->id);
        return;
    }
    if (rc != 0) {
        free(fd.meta_json);
        coord_store_failed(c, "snapshot read");
        c->m.rpc_errors[M_WORKER_GET_SNAPSHOT]++;
        rpc_call_error(call, KOLO_ESTORE, "snapshot read failed: %s", store_last_error(c->store));
        return;
    }
    if (index >= fd.nchunks) {
        free(fd.meta_json);
        c->m.rpc_errors[M_WORKER_GET_SNAPSHOT]++;
        rpc_call_error(call, KOLO_EINVAL, "snapshot %" PRIu64 " has %u chunks, not chunk %u", fd.id,
                       fd.nchunks, index);
        return;
    }
    uint8_t sum[SHA256_LEN];
    if (unhex(fd.checksum, sum, SHA256_LEN) != 0) {
        free(fd.meta_json);
        c->m.rpc_errors[M_WORKER_GET_SNAPSHOT]++;
        rpc_call_error(call, KOLO_ESTORE, "snapshot %" PRIu64 " has a malformed checksum", fd.id);
        return;
    }
    Kolo__GetSnapshotReply rep = KOLO__GET_SNAPSHOT_REPLY__INIT;
    rep.snapshot_id = fd.id;
    rep.generation = fd.generation;
    rep.rank = fd.rank;
    rep.created_ms = fd.created_ms;
    rep.meta_json = fd.meta_json;
    rep.total_bytes = fd.total_bytes;
    rep.checksum.data = sum;
    rep.checksum.len = SHA256_LEN;
    rep.chunk_index = index;
    rep.total_chunks = fd.nchunks;
    struct chunk_out o = {c, call, &rep};
    rc = store_snapshot_chunk(c->store, j->id, fd.id, index, send_chunk, &o);
    if (rc != 0) {
        c->m.rpc_errors[M_WORKER_GET_SNAPSHOT]++;
        rpc_call_error(call, rc == KOLO_ENOTFOUND ? KOLO_ENOTFOUND : KOLO_ESTORE,
                       "chunk %u of snapshot %" PRIu64 " cannot be read: %s", index, fd.id,
                       store_last_error(c->store));
    }
    free(fd.meta_json);
}

void coord_rpc_snapshot(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    if (m == M_WORKER_PUT_SNAPSHOT)
        rpc_put(c, call);
    else
        rpc_get(c, call);
}

/* ---------------------------------------------------------------- tick, shutdown */

void coord_snap_cron(struct coord *c, uint64_t now)
{
    uint64_t idle = (uint64_t)snap_upload_ms(c);
    struct snap_upload *u = c->snap_uploads;
    while (u) {
        struct snap_upload *next = u->next;
        struct job *j = coord_job_find(c, u->job_id);
        if (u->busy)
            ; /* its handler is hashing a chunk; looked at next tick */
        else if (!j || j->state != JOB_RUNNING)
            upload_drop(c, u, "the job is not running");
        else if (j->generation != u->generation)
            upload_drop(c, u, "the job moved to a new generation");
        else if (now > u->touched_mono + idle)
            upload_drop(c, u, "abandoned");
        u = next;
    }
}

void coord_snap_free(struct coord *c)
{
    while (c->snap_uploads)
        upload_drop(c, c->snap_uploads, NULL);
}

/* ---------------------------------------------------------------- queries, metrics */

static int collect_snapshot(const struct store_snapshot *s, void *arg)
{
    struct snap_list *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct store_snapshot *nv = realloc(l->v, cap * sizeof(*nv));
        if (!nv) {
            l->oom = true;
            return 1;
        }
        l->v = nv;
        l->cap = cap;
    }
    struct store_snapshot *d = &l->v[l->n];
    *d = *s;
    d->meta_json = strdup(s->meta_json ? s->meta_json : "{}");
    d->checksum = strdup(s->checksum ? s->checksum : "");
    if (!d->meta_json || !d->checksum) {
        free((char *)d->meta_json);
        free((char *)d->checksum);
        l->oom = true;
        return 1;
    }
    l->n++;
    return 0;
}

int coord_snap_list(struct coord *c, uint64_t job_id, struct snap_list *l)
{
    int rv = store_snapshots_each(c->store, job_id, 0, collect_snapshot, l);
    if (l->oom) {
        LOGW("coord", "job %" PRIu64 ": out of memory listing its snapshots", job_id);
        return KOLO_ENOMEM;
    }
    if (rv != 0) {
        coord_store_failed(c, "snapshots read");
        return KOLO_ESTORE;
    }
    return 0;
}

void coord_snap_list_free(struct snap_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free((char *)l->v[i].meta_json);
        free((char *)l->v[i].checksum);
    }
    free(l->v);
    memset(l, 0, sizeof(*l));
}

int64_t coord_snap_keep(const struct coord *c)
{
    return snap_keep(c);
}

size_t coord_snap_uploads(struct coord *c, uint64_t job_id, struct snap_upload_info *out,
                          size_t max)
{
    uint64_t now = now_mono_ms();
    size_t n = 0;
    for (struct snap_upload *u = c->snap_uploads; u && n < max; u = u->next) {
        if (u->job_id != job_id)
            continue;
        out[n++] = (struct snap_upload_info){.upload_id = u->upload_id,
                                             .rank = u->rank,
                                             .chunks_received = u->next_chunk,
                                             .chunks = u->total_chunks,
                                             .bytes_received = u->received,
                                             .bytes = u->total_bytes,
                                             .age_ms = now - u->started_mono};
    }
    return n;
}

void coord_snap_render_metrics(struct coord *c, struct buf *b)
{
    const struct coord_snap_metrics *s = &c->m.snap;
    uint64_t held = 0;
    int uploads = 0;
    for (struct snap_upload *u = c->snap_uploads; u; u = u->next) {
        held += u->received;
        uploads++;
    }
    buf_printf(b,
               "# HELP kolo_snapshots_committed_total Elastic-state snapshots acknowledged "
               "(durable in the store).\n# TYPE kolo_snapshots_committed_total counter\n"
               "kolo_snapshots_committed_total %llu\n"
               "# HELP kolo_snapshot_bytes_total Bytes of acknowledged snapshots.\n"
               "# TYPE kolo_snapshot_bytes_total counter\nkolo_snapshot_bytes_total %llu\n"
               "# HELP kolo_snapshot_commit_failures_total Snapshot uploads refused or failed "
               "(bad chunk, checksum, size, store error).\n"
               "# TYPE kolo_snapshot_commit_failures_total counter\n"
               "kolo_snapshot_commit_failures_total %llu\n"
               "# HELP kolo_snapshot_uploads_dropped_total Partial uploads dropped (abandoned, "
               "superseded, job ended).\n# TYPE kolo_snapshot_uploads_dropped_total counter\n"
               "kolo_snapshot_uploads_dropped_total %llu\n"
               "# HELP kolo_snapshots_pruned_total Snapshots deleted by retention.\n"
               "# TYPE kolo_snapshots_pruned_total counter\nkolo_snapshots_pruned_total %llu\n"
               "# HELP kolo_snapshot_reads_total Snapshot chunks served by GetSnapshot.\n"
               "# TYPE kolo_snapshot_reads_total counter\nkolo_snapshot_reads_total %llu\n"
               "# HELP kolo_snapshot_read_bytes_total Bytes served by GetSnapshot.\n"
               "# TYPE kolo_snapshot_read_bytes_total counter\n"
               "kolo_snapshot_read_bytes_total %llu\n"
               "# HELP kolo_snapshot_uploads Partial snapshot uploads in memory.\n"
               "# TYPE kolo_snapshot_uploads gauge\nkolo_snapshot_uploads %d\n"
               "# HELP kolo_snapshot_upload_bytes Bytes held by partial uploads.\n"
               "# TYPE kolo_snapshot_upload_bytes gauge\nkolo_snapshot_upload_bytes %llu\n",
               (unsigned long long)s->commits, (unsigned long long)s->commit_bytes,
               (unsigned long long)s->commit_failures, (unsigned long long)s->uploads_dropped,
               (unsigned long long)s->pruned, (unsigned long long)s->gets,
               (unsigned long long)s->get_bytes, uploads, (unsigned long long)held);
    coord_hist_render(b, "kolo_snapshot_commit_seconds",
                      "Time from a snapshot's first chunk to its acknowledgement.", &s->commit);
    coord_hist_render(b, "kolo_snapshot_write_seconds",
                "Time of the store transaction that commits a snapshot (the state lock is "
                "held meanwhile).",
                      &s->write);
}
