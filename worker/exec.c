/*
 * exec.c - executing one response of the negotiated log on the data plane.
 *
 * Runs on the background thread, in log order, identically on every rank.
 * A fused allreduce copies its tensors into the fusion buffer, applies the
 * prescale, reduces once, applies average/postscale and copies back; a
 * single tensor skips the buffer. A rank that joined has no tensor of its
 * own and contributes zeros (Horovod's join). A data-plane failure fails
 * the operations of this response and, because the connection state is
 * now unknown, every other pending operation too (sticky). Responses
 * whose tensors live on a GPU go to the NCCL backend (gpu.h,
 * nccl_exec.c), which follows the same rules on the device.
 */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "gpu.h"
#include "log.h"
#include "reduce.h"
#include "util.h"

static int ensure(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1 << 20;
    while (n < need)
        n *= 2;
    void *b = realloc(*buf, n);
    if (!b)
        return KOLO_ENOMEM;
    *buf = b;
    *cap = n;
    return 0;
}

/* Completes the ops of a response; a failure becomes sticky. Cache ids
 * are recorded first: once complete, an op may be freed by its waiter. */
void exec_finish(struct kolo_ctx *c, struct op **ops, size_t n, int rc, const char *why,
                 const uint32_t *cache_ids, size_t ncache)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n && i < ncache && rc == 0 && !c->exec_stale; i++)
        if (ops[i] && cache_ids[i])
            ops_cache_put(c, ops[i], cache_ids[i]);
    for (size_t i = 0; i < n; i++)
        if (ops[i])
            ops_complete(c, ops[i], rc, why);
    if (rc && !c->sticky) {
        c->sticky = rc;
        snprintf(c->sticky_msg, sizeof(c->sticky_msg), "%s", why ? why : kolo_strerror(rc));
        ops_fail_all(c, c->sticky, c->sticky_msg);
        LOGW("kolo", "rank %d: data plane failed: %s", c->rank, c->sticky_msg);
    }
    pthread_mutex_unlock(&c->mu);
}

static void finish(struct kolo_ctx *c, struct op **ops, size_t n, int rc, const char *why)
{
    exec_finish(c, ops, n, rc, why, NULL, 0);
}

/* AVERAGE and postscale, after the reduction. */
static void post_scale(struct kolo_ctx *c, kolo_dtype dt, kolo_op op, double postscale, void *buf,
                       size_t count)
{
    bool is_float = dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16 || dt == KOLO_FLOAT32 ||
                    dt == KOLO_FLOAT64;
    if (op == KOLO_AVERAGE) {
        if (is_float) {
            reduce_scale(dt, buf, count, postscale / c->size);
            return;
        }
        reduce_divide(dt, buf, count, c->size);
    }
    if (postscale != 1.0)
        reduce_scale(dt, buf, count, postscale);
}

static const char *why_of(struct kolo_ctx *c, int rc)
{
    return c->coll->why[0] ? c->coll->why : kolo_strerror(rc);
}

static void exec_allreduce(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops,
                           uint64_t deadline)
{
    size_t k = r->n_names;
    kolo_dtype dt = (kolo_dtype)r->dtype;
    kolo_op op = (kolo_op)r->op;
    size_t es = kolo_dtype_size(dt);
    double pre = r->prescale == 0 ? 1.0 : r->prescale;
    double post = r->postscale == 0 ? 1.0 : r->postscale;
    int rc;
    if (k == 1 && ops[0] && r->n_sizes >= 1) {
        size_t count = (size_t)r->sizes[0];
        const void *in = ops[0]->req.sendbuf;
        void *out = ops[0]->req.recvbuf;
        if (pre != 1.0) {
            if (in != out)
                memcpy(out, in, count * es);
            reduce_scale(dt, out, count, pre);
            in = out;
        }
        rc = c->coll->ops->allreduce(c->coll, dt, op, in, out, count, deadline);
        if (rc == 0)
            post_scale(c, dt, op, post, out, count);
        exec_finish(c, ops, 1, rc, rc ? why_of(c, rc) : NULL, r->cache_ids, r->n_cache_ids);
        return;
    }
    size_t total = 0;
    for (size_t i = 0; i < k; i++)
        total += (size_t)(i < r->n_sizes ? r->sizes[i] : 0);
    if (ensure(&c->fusion, &c->fusion_cap, total * es + 1) != 0) {
        finish(c, ops, k, KOLO_ENOMEM, "cannot allocate the fusion buffer");
        return;
    }
    char *buf = c->fusion;
    size_t off = 0;
    for (size_t i = 0; i < k; i++) {
        size_t bytes = (size_t)r->sizes[i] * es;
        if (ops[i])
            memcpy(buf + off, ops[i]->req.sendbuf, bytes);
        else
            memset(buf + off, 0, bytes); /* joined: contribute zeros */
        off += bytes;
    }
    if (pre != 1.0)
        reduce_scale(dt, buf, total, pre);
    rc = c->coll->ops->allreduce(c->coll, dt, op, buf, buf, total, deadline);
    if (rc == 0) {
        post_scale(c, dt, op, post, buf, total);
        off = 0;
        for (size_t i = 0; i < k; i++) {
            size_t bytes = (size_t)r->sizes[i] * es;
            if (ops[i])
                memcpy(ops[i]->req.recvbuf, buf + off, bytes);
            off += bytes;
        }
    }
    exec_finish(c, ops, k, rc, rc ? why_of(c, rc) : NULL, r->cache_ids, r->n_cache_ids);
}

static void exec_allgather(struct kolo_ctx *c, const Kolo__Response *r, struct op *op,
                           uint64_t deadline)
{
    size_t es = kolo_dtype_size((kolo_dtype)r->dtype);
    size_t row = (size_t)(r->n_row_elems ? r->row_elems[0] : 1) * es;
    size_t *bytes = calloc((size_t)c->size, sizeof(size_t));
    int64_t rows = 0;
    size_t total = 0;
    if (!bytes || r->n_sizes < (size_t)c->size) {
        free(bytes);
        finish(c, &op, 1, KOLO_EPROTO, "malformed allgather response");
        return;
    }
    for (int i = 0; i < c->size; i++) {
        bytes[i] = (size_t)r->sizes[i] * row;
        rows += r->sizes[i];
        total += bytes[i];
    }
    void *out = malloc(total + 1);
    int rc = out ? c->coll->ops->allgatherv(c->coll, op->req.sendbuf, out, bytes, deadline)
                 : KOLO_ENOMEM;
    free(bytes);
    if (rc == 0) {
        op->result = out;
        op->result_bytes = total;
        op->result_rows = rows;
        op->has_result = true;
    } else {
        free(out);
    }
    finish(c, &op, 1, rc, rc ? why_of(c, rc) : NULL);
}

static void exec_alltoall(struct kolo_ctx *c, const Kolo__Response *r, struct op *op,
                          uint64_t deadline)
{
    int n = c->size, me = c->rank;
    size_t es = kolo_dtype_size((kolo_dtype)r->dtype);
    size_t row = (size_t)(r->n_row_elems ? r->row_elems[0] : 1) * es;
    if (r->n_sizes < (size_t)n * (size_t)n) {
        finish(c, &op, 1, KOLO_EPROTO, "malformed alltoall response");
        return;
    }
    size_t *sb = calloc((size_t)n, sizeof(size_t)), *rb = calloc((size_t)n, sizeof(size_t));
    int32_t *splits = calloc((size_t)n, sizeof(int32_t));
    size_t total = 0;
    int64_t rows = 0;
    if (!sb || !rb || !splits) {
        free(sb);
        free(rb);
        free(splits);
        finish(c, &op, 1, KOLO_ENOMEM, "out of memory");
        return;
    }
    for (int d = 0; d < n; d++) {
        sb[d] = (size_t)r->sizes[(size_t)me * (size_t)n + (size_t)d] * row;
        int64_t from = r->sizes[(size_t)d * (size_t)n + (size_t)me];
        rb[d] = (size_t)from * row;
        splits[d] = (int32_t)from;
        rows += from;
        total += rb[d];
    }
    void *out = malloc(total + 1);
    int rc = out ? c->coll->ops->alltoallv(c->coll, op->req.sendbuf, sb, out, rb, deadline)
                 : KOLO_ENOMEM;
    free(sb);
    free(rb);
    if (rc == 0) {
        op->result = out;
        op->result_bytes = total;
        op->result_rows = rows;
        op->recv_splits = splits;
        op->has_result = true;
    } else {
        free(out);
        free(splits);
    }
    finish(c, &op, 1, rc, rc ? why_of(c, rc) : NULL);
}

static void exec_reducescatter(struct kolo_ctx *c, const Kolo__Response *r, struct op *op,
                               uint64_t deadline)
{
    kolo_dtype dt = (kolo_dtype)r->dtype;
    size_t es = kolo_dtype_size(dt);
    int64_t total = r->n_sizes ? r->sizes[0] : 0;
    int64_t row = r->n_row_elems && r->row_elems[0] > 0 ? r->row_elems[0] : 1;
    int64_t rows = total / row;
    size_t *counts = calloc((size_t)c->size, sizeof(size_t));
    if (!counts) {
        finish(c, &op, 1, KOLO_ENOMEM, "out of memory");
        return;
    }
    /* Horovod's split: every rank gets rows / size rows, the first
     * rows % size ranks one more. */
    for (int i = 0; i < c->size; i++)
        counts[i] = (size_t)((rows / c->size + (i < rows % c->size ? 1 : 0)) * row);
    double pre = r->prescale == 0 ? 1.0 : r->prescale;
    const void *in = op->req.sendbuf;
    if (pre != 1.0) {
        if (ensure(&c->fusion, &c->fusion_cap, (size_t)total * es + 1) != 0) {
            free(counts);
            finish(c, &op, 1, KOLO_ENOMEM, "out of memory");
            return;
        }
        memcpy(c->fusion, in, (size_t)total * es);
        reduce_scale(dt, c->fusion, (size_t)total, pre);
        in = c->fusion;
    }
    int rc = c->coll->ops->reducescatter(c->coll, dt, KOLO_SUM, in, op->req.recvbuf, counts,
                                         deadline);
    if (rc == 0)
        post_scale(c, dt, (kolo_op)r->op, r->postscale == 0 ? 1.0 : r->postscale,
                   op->req.recvbuf, counts[c->rank]);
    free(counts);
    finish(c, &op, 1, rc, rc ? why_of(c, rc) : NULL);
}

/* Runs response r on the ops found for it (mu held on entry, released on
 * return). */
static void exec_locked(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops)
{
    uint64_t deadline = now_mono_ms() + (uint64_t)c->timeout_ms;
    size_t k = r->n_names;
    bool on_gpu = gpu_response_is_gpu(c, r, ops, k);
    /* Pinned while the data plane has them: a failure on another thread
     * (the generation closed, an abort) leaves them to this executor,
     * which completes every op it runs. Allreduce and barrier run all k
     * ops, the others ops[0]. GPU ops are completed by their finaliser. */
    size_t run = r->coll == KOLO_COLL_ALLREDUCE || r->coll == KOLO_COLL_BARRIER ? k : 1;
    for (size_t i = 0; i < k; i++)
        if (ops[i])
            ops[i]->pinned = !on_gpu && i < run;
    pthread_mutex_unlock(&c->mu);

    /* GPU tensors: the NCCL backend queues the work and returns; the
     * finaliser completes the ops (gpu.h). */
    if (on_gpu) {
        gpu_exec_response(c, r, ops, deadline);
        return;
    }

    switch (r->coll) {
    case KOLO_COLL_ALLREDUCE:
        exec_allreduce(c, r, ops, deadline);
        break;
    case KOLO_COLL_ALLGATHER:
        if (ops[0])
            exec_allgather(c, r, ops[0], deadline);
        break;
    case KOLO_COLL_ALLTOALL:
        if (ops[0])
            exec_alltoall(c, r, ops[0], deadline);
        break;
    case KOLO_COLL_REDUCESCATTER:
        if (ops[0])
            exec_reducescatter(c, r, ops[0], deadline);
        break;
    case KOLO_COLL_BROADCAST: {
        struct op *op = ops[0];
        size_t bytes = (size_t)(r->n_sizes ? r->sizes[0] : 0) * kolo_dtype_size(r->dtype);
        if (!op)
            break;
        if (c->rank == r->root && op->req.sendbuf != op->req.recvbuf && bytes)
            memcpy(op->req.recvbuf, op->req.sendbuf, bytes);
        int rc = c->coll->ops->broadcast(c->coll, op->req.recvbuf, bytes, r->root, deadline);
        finish(c, &op, 1, rc, rc ? why_of(c, rc) : NULL);
        break;
    }
    case KOLO_COLL_BARRIER: {
        int rc = c->coll->ops->barrier(c->coll, deadline);
        finish(c, ops, k, rc, rc ? why_of(c, rc) : NULL);
        break;
    }
    default:
        finish(c, ops, k, KOLO_EPROTO, "unknown collective in the response log");
        break;
    }
}

void exec_response(struct kolo_ctx *c, const Kolo__Response *r)
{
    if (r->shutdown) {
        pthread_mutex_lock(&c->mu);
        if (!c->sticky) {
            c->sticky = r->error_code ? r->error_code : KOLO_ESHUTDOWN;
            snprintf(c->sticky_msg, sizeof(c->sticky_msg), "%s", r->error);
        }
        ops_fail_all(c, c->sticky, c->sticky_msg);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    size_t k = r->n_names;
    struct op **ops = calloc(k + 1, sizeof(*ops));
    if (!ops)
        return;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < k; i++)
        ops[i] = ops_by_name(c, r->names[i]);
    if (r->coll == KOLO_COLL_JOIN) {
        for (uint32_t s = 0; s < c->nslots; s++) {
            struct op *o = c->slots[s];
            if (o && o->state == OP_SENT && o->req.coll == KOLO_COLL_JOIN) {
                o->value = r->last_joined;
                o->has_result = true;
                ops_complete(c, o, 0, NULL);
            }
        }
        c->joined = false;
        c->join_mode = false; /* the same log entry on every rank: rounds resume */
        c->gpu_join_device = -1;
        pthread_mutex_unlock(&c->mu);
        free(ops);
        return;
    }
    if (r->error_code) {
        for (size_t i = 0; i < k; i++)
            if (ops[i])
                ops_complete(c, ops[i], r->error_code, r->error);
        pthread_mutex_unlock(&c->mu);
        free(ops);
        return;
    }
    exec_locked(c, r, ops);
    free(ops);
}

void exec_pinned(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops)
{
    pthread_mutex_lock(&c->mu);
    exec_locked(c, r, ops);
}
