/*
 * snapshot.c - durable elastic-state snapshots: kolo_snapshot_put and
 * kolo_snapshot_get.
 *
 * DESIGN
 *
 * A put uploads an opaque blob and a JSON metadata text to the
 * coordinator in chunks (PutSnapshot, see proto/kolo.proto) and returns
 * once the coordinator acknowledged it, which it does only after the
 * snapshot is durable in its store. It is made for a background thread of
 * the training process (Python's state.commit()), so it does not touch
 * the data plane or the background thread: it has its own coordinator
 * connection per context, opened on first use, and needs from the context
 * only its identity (job, generation, rank) and the coordinator's address.
 * rpc_client_call is thread-safe, so puts and gets on one context may run
 * in several threads at once.
 *
 * Retries. Every call is bounded by the caller's timeout. A coordinator
 * that is down, restarting, busy or shutting down gets the same chunk
 * again after a short back-off (nng itself re-sends a request whose
 * connection dropped). A coordinator that restarted has lost the partial
 * upload and answers KOLO_ENOTFOUND: the upload starts again from chunk 0
 * under the same upload id, so an upload whose commit landed just before
 * a crash is recognised instead of stored twice. Anything else (a stale
 * generation, a refused chunk, a checksum mismatch, a snapshot too large)
 * fails the call at once with the coordinator's message in
 * kolo_last_error().
 *
 * kolo_fini. A put or get in flight when the context is finalised fails
 * with KOLO_ESHUTDOWN: kolo_fini shuts the snapshot connection down (which
 * ends a call in flight at once) and waits for the calls to leave before
 * it frees the context.
 */
#include "snapshot.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "settings.h"
#include "hmac.h"
#include "log.h"
#include "util.h"

/* A chunk, SNAP_MAX_META bytes of meta and the frame's headers fit in one
 * request (RPC_MAX_REQUEST, 1 MiB: what bounds a server's memory before
 * it authenticates anything, common/rpc.h). */
#define SNAP_CHUNK_DEFAULT (768u << 10)
#define SNAP_CHUNK_MIN     4096u
#define SNAP_CHUNK_MAX     (896u << 10)
#define SNAP_MAX_CHUNKS    (1u << 20)
#define SNAP_MAX_META      (64u << 10)
#define SNAP_CALL_MAX_MS   60000
#define SNAP_TIMEOUT_MS    300000
#define SNAP_BACKOFF_MS    50
#define SNAP_BACKOFF_MAX   1000

/* ---------------------------------------------------------------- context */

/* snap_enter checks the context is alive, opens or updates the snapshot
 * connection and counts the call in (kolo_fini waits for it to leave). */
static int snap_enter(struct kolo_ctx *c, struct rpc_client **rpc, uint64_t *seq)
{
    int code = 0;
    pthread_mutex_lock(&c->mu);
    if (c->solo) {
        ctx_set_error(c, "kolo_snapshot: snapshots need a coordinator: start the program with "
                         "`kolo run`");
        pthread_mutex_unlock(&c->mu);
        return KOLO_ENOTSUP;
    }
    if (c->stopping || c->snap_closed || !c->coord_url) {
        code = KOLO_ESHUTDOWN;
        ctx_set_error(c, "kolo_snapshot: the context is shutting down");
        pthread_mutex_unlock(&c->mu);
        return code;
    }
    char ident[64];
    struct rpc_client_config rc;
    ctx_rpc_config(c, ident, sizeof ident, &rc);
    if (!c->snap_rpc) {
        code = rpc_client_open(&c->snap_rpc, &rc);
        if (code)
            ctx_set_error(c, "kolo_snapshot: cannot open a connection to %s", c->coord_url);
    } else {
        /* an elastic context may have moved to a new generation */
        rpc_client_set_identity(c->snap_rpc, ident, c->job, c->generation, c->rank);
    }
    if (!code) {
        c->snap_calls++;
        *rpc = c->snap_rpc;
        if (seq)
            *seq = ++c->snap_seq;
    }
    pthread_mutex_unlock(&c->mu);
    return code;
}

/* snap_leave counts the call out and records its error detail. */
static int snap_leave(struct kolo_ctx *c, int code, const char *detail)
{
    pthread_mutex_lock(&c->mu);
    c->snap_calls--;
    if (code)
        ctx_set_error(c, "%s", detail);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    return code;
}

/* snap_sleep waits ms, or less when the context starts shutting down;
 * returns false then. */
static bool snap_sleep(struct kolo_ctx *c, uint64_t ms)
{
    struct timespec ts;
    mono_deadline(&ts, ms);
    pthread_mutex_lock(&c->mu);
    while (!c->stopping && !c->snap_closed && pthread_cond_timedwait(&c->done, &c->mu, &ts) == 0)
        ;
    bool alive = !c->stopping && !c->snap_closed;
    pthread_mutex_unlock(&c->mu);
    return alive;
}

int kolo_snapshot_cancel(kolo_ctx *c)
{
    if (!c)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    c->snap_closed = true;
    pthread_mutex_unlock(&c->mu);
    snapshot_ctx_stop(c);
    return 0;
}

void snapshot_ctx_stop(struct kolo_ctx *c)
{
    pthread_mutex_lock(&c->mu);
    struct rpc_client *rpc = c->snap_rpc;
    pthread_cond_broadcast(&c->done); /* wakes calls in their back-off */
    pthread_mutex_unlock(&c->mu);
    if (rpc)
        rpc_client_shutdown(rpc); /* calls in flight end with KOLO_ECLOSED */
    pthread_mutex_lock(&c->mu);
    while (c->snap_calls > 0)
        pthread_cond_wait(&c->done, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void snapshot_ctx_free(struct kolo_ctx *c)
{
    rpc_client_close(c->snap_rpc);
    c->snap_rpc = NULL;
    free(c->coord_url);
    if (c->coord_token) {
        memset(c->coord_token, 0, strlen(c->coord_token));
        free(c->coord_token);
    }
    c->coord_url = c->coord_token = NULL;
}

/* ---------------------------------------------------------------- helpers */

/* A coordinator that is away, restarting or busy: try the same call
 * again. KOLO_ESHUTDOWN is a coordinator that is shutting down (a job
 * that ended answers KOLO_ESTATE). */
static bool transient(int code)
{
    return code == KOLO_ETIMEDOUT || code == KOLO_ECONNREFUSED || code == KOLO_EIO ||
           code == KOLO_EBUSY || code == KOLO_ESHUTDOWN;
}

static uint64_t deadline_of(int timeout_ms)
{
    return now_mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : SNAP_TIMEOUT_MS);
}

static int call_timeout(uint64_t deadline)
{
    return (int)deadline_left(deadline, SNAP_CALL_MAX_MS);
}

/* backoff sleeps before a retry; false when the context is stopping. */
static bool backoff(struct kolo_ctx *c, uint64_t *delay, uint64_t deadline)
{
    uint64_t ms = deadline_left(deadline, *delay);
    *delay = *delay * 2 > SNAP_BACKOFF_MAX ? SNAP_BACKOFF_MAX : *delay * 2;
    return snap_sleep(c, ms);
}

/* ---------------------------------------------------------------- put */

/* The SHA-256 of a large snapshot is computed by a helper thread while
 * the chunks go out (the coordinator needs it only with the last one):
 * hashing costs about as much as the upload. */
#define SNAP_HASH_THREAD_MIN (8u << 20)

struct hasher {
    const void *data;
    size_t len;
    uint8_t sum[SHA256_LEN];
    pthread_t thread;
    bool running, done;
};

static void *hasher_main(void *arg)
{
    thread_name("kolo-snaphash");
    struct hasher *h = arg;
    sha256(h->data, h->len, h->sum);
    return NULL;
}

static void hasher_start(struct hasher *h, const void *data, size_t len)
{
    h->data = data;
    h->len = len;
    h->running =
        len >= SNAP_HASH_THREAD_MIN && pthread_create(&h->thread, NULL, hasher_main, h) == 0;
    if (!h->running) {
        sha256(data, len, h->sum);
        h->done = true;
    }
}

/* hasher_finish waits for the checksum (every path out of a put calls it:
 * the thread reads the caller's data). */
static const uint8_t *hasher_finish(struct hasher *h)
{
    if (h->running) {
        pthread_join(h->thread, NULL);
        h->running = false;
        h->done = true;
    }
    return h->sum;
}

int kolo_snapshot_put(kolo_ctx *c, const void *data, size_t len, const char *meta_json,
                      int timeout_ms, uint64_t *snapshot_id)
{
    if (snapshot_id)
        *snapshot_id = 0;
    if (!c || (!data && len > 0))
        return KOLO_EINVAL;
    if (!meta_json)
        meta_json = "";
    size_t meta_len = strlen(meta_json);
    if (meta_len > SNAP_MAX_META) {
        pthread_mutex_lock(&c->mu);
        ctx_set_error(c, "kolo_snapshot_put: meta_json of %zu bytes exceeds %u", meta_len,
                      SNAP_MAX_META);
        pthread_mutex_unlock(&c->mu);
        return KOLO_EINVAL;
    }
    size_t chunk = (size_t)settings_int(SET_SNAPSHOT_CHUNK_BYTES, SNAP_CHUNK_DEFAULT);
    uint64_t nchunks = len ? ((uint64_t)len + chunk - 1) / chunk : 1;
    if (nchunks > SNAP_MAX_CHUNKS) {
        pthread_mutex_lock(&c->mu);
        ctx_set_error(c, "kolo_snapshot_put: a snapshot of %zu bytes is too large", len);
        pthread_mutex_unlock(&c->mu);
        return KOLO_ETOOBIG;
    }
    uint32_t keep = (uint32_t)settings_int(SET_SNAPSHOT_KEEP, 0);
    uint64_t deadline = deadline_of(timeout_ms);

    struct rpc_client *rpc = NULL;
    uint64_t seq = 0;
    int code = snap_enter(c, &rpc, &seq);
    if (code)
        return code;
    struct hasher hash = {0};
    hasher_start(&hash, data, len);
    uint64_t upload_id = 0;
    while (upload_id == 0)
        random_bytes(&upload_id, sizeof upload_id);
    size_t cap = chunk + meta_len + 256;
    uint8_t *buf = malloc(cap);
    char err[1024] = "";
    char detail[1200] = "";
    if (!buf) {
        hasher_finish(&hash);
        snprintf(detail, sizeof detail, "kolo_snapshot_put: out of memory");
        return snap_leave(c, KOLO_ENOMEM, detail);
    }
    uint64_t t0 = now_mono_ms(), delay = SNAP_BACKOFF_MS;
    uint32_t k = 0;
    int restarts = 0;
    for (;;) {
        int wait = call_timeout(deadline);
        if (wait <= 0) {
            code = KOLO_ETIMEDOUT;
            snprintf(detail, sizeof detail,
                     "kolo_snapshot_put: no acknowledgement within %d ms%s%s", timeout_ms,
                     err[0] ? "; last error: " : "", err);
            break;
        }
        Kolo__SnapshotChunk m = KOLO__SNAPSHOT_CHUNK__INIT;
        m.upload_id = upload_id;
        m.seq = seq;
        m.chunk_index = k;
        m.total_chunks = (uint32_t)nchunks;
        m.total_bytes = len;
        if (hash.done || k + 1 == nchunks) {
            m.checksum.data = (uint8_t *)hasher_finish(&hash);
            m.checksum.len = SHA256_LEN;
        }
        m.meta_json = (char *)(k == 0 ? meta_json : "");
        m.keep = keep;
        size_t off = (size_t)k * chunk;
        m.data.data = (uint8_t *)data + off;
        m.data.len = len - off < chunk ? len - off : chunk;
        size_t plen = kolo__snapshot_chunk__pack(&m, buf);
        void *out = NULL;
        size_t olen = 0;
        code = rpc_client_call(rpc, "WorkerService.PutSnapshot", buf, plen, &out, &olen, wait, err,
                               sizeof err);
        if (code == 0) {
            Kolo__SnapshotAck *a = kolo__snapshot_ack__unpack(NULL, olen, out);
            free(out);
            if (!a) {
                code = KOLO_EPROTO;
                snprintf(detail, sizeof detail, "kolo_snapshot_put: malformed reply");
                break;
            }
            bool done = a->committed;
            uint64_t id = a->snapshot_id;
            uint32_t next = a->next_chunk;
            kolo__snapshot_ack__free_unpacked(a, NULL);
            if (done) {
                if (snapshot_id)
                    *snapshot_id = id;
                LOGD("kolo",
                     "rank %d: snapshot %" PRIu64 " (%zu bytes) acknowledged in %" PRIu64 " ms",
                     c->rank, id, len, now_mono_ms() - t0);
                break;
            }
            if (next >= nchunks || next == 0) {
                code = KOLO_EPROTO;
                snprintf(detail, sizeof detail,
                         "kolo_snapshot_put: the coordinator asked for chunk %u of %" PRIu64, next,
                         nchunks);
                break;
            }
            k = next;
            delay = SNAP_BACKOFF_MS;
            continue;
        }
        if (code == KOLO_ENOTFOUND && k > 0) {
            /* The coordinator restarted (or dropped the upload). */
            restarts++;
            LOGI("kolo",
                 "rank %d: the coordinator lost snapshot upload %016" PRIx64
                 " at chunk %u; sending it again",
                 c->rank, upload_id, k);
            k = 0;
            continue;
        }
        if (transient(code)) {
            LOGD("kolo", "rank %d: snapshot chunk %u: %s; retrying", c->rank, k, err);
            if (backoff(c, &delay, deadline))
                continue;
            code = KOLO_ESHUTDOWN;
            snprintf(detail, sizeof detail, "kolo_snapshot_put: the context is shutting down");
            break;
        }
        if (code == KOLO_ECLOSED) {
            code = KOLO_ESHUTDOWN;
            snprintf(err, sizeof err, "the context was finalised during the upload");
        }
        snprintf(detail, sizeof detail, "kolo_snapshot_put: %s", err);
        break;
    }
    hasher_finish(&hash);
    free(buf);
    if (code == 0 && restarts)
        LOGI("kolo", "rank %d: snapshot acknowledged after %d restart(s) of its upload", c->rank,
             restarts);
    return snap_leave(c, code, detail);
}

/* ---------------------------------------------------------------- get */

struct reading {
    uint64_t id;
    uint64_t total;
    uint32_t nchunks;
    uint8_t checksum[SHA256_LEN];
    uint8_t *buf;
    size_t got;
    char *meta;
};

static void reading_reset(struct reading *r)
{
    free(r->buf);
    free(r->meta);
    memset(r, 0, sizeof *r);
}

/* reading_take adds chunk k of a reply; 0, or an error with detail. */
static int reading_take(struct reading *r, const Kolo__GetSnapshotReply *p, uint32_t k,
                        char *detail, size_t dlen)
{
    if (k == 0) {
        reading_reset(r);
        if (p->total_bytes > (uint64_t)SIZE_MAX - 1 || p->checksum.len != SHA256_LEN ||
            p->total_chunks == 0) {
            snprintf(detail, dlen, "kolo_snapshot_get: snapshot %" PRIu64 " is malformed",
                     p->snapshot_id);
            return KOLO_EPROTO;
        }
        r->id = p->snapshot_id;
        r->total = p->total_bytes;
        r->nchunks = p->total_chunks;
        memcpy(r->checksum, p->checksum.data, SHA256_LEN);
        r->buf = malloc((size_t)r->total + 1);
        r->meta = strdup(p->meta_json ? p->meta_json : "{}");
        if (!r->buf || !r->meta) {
            snprintf(detail, dlen, "kolo_snapshot_get: out of memory for %" PRIu64 " bytes",
                     r->total);
            return KOLO_ENOMEM;
        }
    } else if (p->snapshot_id != r->id || p->total_bytes != r->total ||
               p->total_chunks != r->nchunks || p->checksum.len != SHA256_LEN ||
               memcmp(p->checksum.data, r->checksum, SHA256_LEN) != 0) {
        snprintf(detail, dlen, "kolo_snapshot_get: snapshot %" PRIu64 " changed while read", r->id);
        return KOLO_EPROTO;
    }
    if (p->chunk_index != k || p->data.len > r->total - r->got) {
        snprintf(detail, dlen, "kolo_snapshot_get: snapshot %" PRIu64 ": bad chunk %u", r->id,
                 p->chunk_index);
        return KOLO_EPROTO;
    }
    if (p->data.len)
        memcpy(r->buf + r->got, p->data.data, p->data.len);
    r->got += p->data.len;
    return 0;
}

int kolo_snapshot_get(kolo_ctx *c, uint64_t snapshot_id, void **data, size_t *len, char **meta_json,
                      uint64_t *id_out, int timeout_ms)
{
    if (data)
        *data = NULL;
    if (len)
        *len = 0;
    if (meta_json)
        *meta_json = NULL;
    if (id_out)
        *id_out = 0;
    if (!c || !data || !len)
        return KOLO_EINVAL;
    uint64_t deadline = deadline_of(timeout_ms);
    struct rpc_client *rpc = NULL;
    int code = snap_enter(c, &rpc, NULL);
    if (code)
        return code;
    struct reading r = {0};
    char err[1024] = "", detail[1200] = "";
    uint64_t delay = SNAP_BACKOFF_MS;
    uint32_t k = 0;
    for (;;) {
        int wait = call_timeout(deadline);
        if (wait <= 0) {
            code = KOLO_ETIMEDOUT;
            snprintf(detail, sizeof detail, "kolo_snapshot_get: no answer within %d ms%s%s",
                     timeout_ms, err[0] ? "; last error: " : "", err);
            break;
        }
        Kolo__GetSnapshotRequest q = KOLO__GET_SNAPSHOT_REQUEST__INIT;
        /* Once the first chunk named the snapshot, ask for that one: a
         * newer commit meanwhile must not mix two snapshots. */
        q.snapshot_id = k > 0 ? r.id : snapshot_id;
        q.chunk_index = k;
        uint8_t qbuf[32];
        size_t qlen = kolo__get_snapshot_request__pack(&q, qbuf);
        void *out = NULL;
        size_t olen = 0;
        code = rpc_client_call(rpc, "WorkerService.GetSnapshot", qbuf, qlen, &out, &olen, wait, err,
                               sizeof err);
        if (code == 0) {
            Kolo__GetSnapshotReply *p = kolo__get_snapshot_reply__unpack(NULL, olen, out);
            free(out);
            if (!p) {
                code = KOLO_EPROTO;
                snprintf(detail, sizeof detail, "kolo_snapshot_get: malformed reply");
                break;
            }
            code = reading_take(&r, p, k, detail, sizeof detail);
            kolo__get_snapshot_reply__free_unpacked(p, NULL);
            if (code)
                break;
            delay = SNAP_BACKOFF_MS;
            if (++k < r.nchunks)
                continue;
            uint8_t sum[SHA256_LEN];
            sha256(r.buf, r.got, sum);
            if (r.got != r.total || !ct_equal(sum, r.checksum, SHA256_LEN)) {
                code = KOLO_EPROTO;
                snprintf(detail, sizeof detail,
                         "kolo_snapshot_get: snapshot %" PRIu64 " does not match its checksum",
                         r.id);
            }
            break;
        }
        if (code == KOLO_ENOTFOUND && k > 0 && snapshot_id == 0) {
            /* The latest snapshot was pruned while read: read the new latest. */
            k = 0;
            continue;
        }
        if (transient(code)) {
            if (backoff(c, &delay, deadline))
                continue;
            code = KOLO_ESHUTDOWN;
            snprintf(detail, sizeof detail, "kolo_snapshot_get: the context is shutting down");
            break;
        }
        if (code == KOLO_ECLOSED) {
            code = KOLO_ESHUTDOWN;
            snprintf(err, sizeof err, "the context was finalised during the read");
        }
        snprintf(detail, sizeof detail, "kolo_snapshot_get: %s", err);
        break;
    }
    if (code == 0) {
        *data = r.buf;
        *len = r.got;
        if (id_out)
            *id_out = r.id;
        if (meta_json)
            *meta_json = r.meta;
        else
            free(r.meta);
        r.buf = NULL;
        r.meta = NULL;
    }
    reading_reset(&r);
    return snap_leave(c, code, detail);
}

int kolo_snapshot_get_latest(kolo_ctx *c, void **data, size_t *len, char **meta_json,
                             uint64_t *snapshot_id, int timeout_ms)
{
    return kolo_snapshot_get(c, 0, data, len, meta_json, snapshot_id, timeout_ms);
}

void kolo_snapshot_free(void *p)
{
    free(p);
}
