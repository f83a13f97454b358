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
 * whose tensors live on a GPU go to the NCCL backend (nccl_exec.h,
 * nccl_exec.c), which follows the same rules on the device.
 */
#include "exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "log.h"
#include "plan.h"
#include "reduce.h"
#include "util.h"
#include "nccl_exec.h"
#include "ops.h"

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

static void finish(struct kolo_ctx *c, struct op **ops, size_t n, int rc, const char *why)
{
    ops_finish(c, ops, n, rc, why, NULL, 0);
}

void exec_post_scale(const struct plan *p, void *buf, size_t count)
{
    if (p->post_divisor != 1)
        reduce_divide(p->dt, buf, count, p->post_divisor);
    if (p->post_factor != 1.0)
        reduce_scale(p->dt, buf, count, p->post_factor);
}

static const char *why_of(struct kolo_ctx *c, int rc)
{
    return c->coll->why[0] ? c->coll->why : kolo_strerror(rc);
}

static void exec_allreduce(struct kolo_ctx *c, const Kolo__Response *r, const struct plan *p,
                           struct op **ops, uint64_t deadline)
{
    int rc;
    if (!p->fused) {
        const void *in = ops[0]->req.sendbuf;
        void *out = ops[0]->req.recvbuf;
        if (p->pre != 1.0) {
            if (in != out)
                memcpy(out, in, p->total * p->es);
            reduce_scale(p->dt, out, p->total, p->pre);
            in = out;
        }
        rc = c->coll->ops->allreduce(c->coll, p->dt, p->op, in, out, p->total, deadline);
        if (rc == 0)
            exec_post_scale(p, out, p->total);
        ops_finish(c, ops, 1, rc, rc ? why_of(c, rc) : NULL, r->cache_ids, r->n_cache_ids);
        return;
    }
    if (ensure(&c->fusion, &c->fusion_cap, p->total * p->es + 1) != 0) {
        finish(c, ops, p->k, KOLO_ENOMEM, "cannot allocate the fusion buffer");
        return;
    }
    char *buf = c->fusion;
    for (size_t i = 0; i < p->k; i++) {
        char *at = buf + p->offset[i] * p->es;
        if (ops[i])
            memcpy(at, ops[i]->req.sendbuf, p->count[i] * p->es);
        else
            memset(at, 0, p->count[i] * p->es); /* joined: contribute zeros */
    }
    if (p->pre != 1.0)
        reduce_scale(p->dt, buf, p->total, p->pre);
    rc = c->coll->ops->allreduce(c->coll, p->dt, p->op, buf, buf, p->total, deadline);
    if (rc == 0) {
        exec_post_scale(p, buf, p->total);
        for (size_t i = 0; i < p->k; i++)
            if (ops[i])
                memcpy(ops[i]->req.recvbuf, buf + p->offset[i] * p->es, p->count[i] * p->es);
    }
    ops_finish(c, ops, p->k, rc, rc ? why_of(c, rc) : NULL, r->cache_ids, r->n_cache_ids);
}

/* The result of an allgather or alltoall: a buffer of p->result_bytes. */
static void set_result(struct kolo_ctx *c, struct op *op, struct plan *p, void *out, int rc)
{
    if (rc == 0) {
        op->result = out;
        op->result_bytes = p->result_bytes;
        op->result_rows = p->rows;
        op->recv_splits = p->recv_rows; /* the op's now (alltoall) */
        p->recv_rows = NULL;
        op->has_result = true;
    } else {
        free(out);
    }
    finish(c, &op, 1, rc, rc ? why_of(c, rc) : NULL);
}

static void exec_allgather(struct kolo_ctx *c, struct plan *p, struct op *op, uint64_t deadline)
{
    void *out = malloc(p->result_bytes + 1);
    int rc = out ? c->coll->ops->allgatherv(c->coll, op->req.sendbuf, out, p->recv_bytes, deadline)
                 : KOLO_ENOMEM;
    set_result(c, op, p, out, rc);
}

static void exec_alltoall(struct kolo_ctx *c, struct plan *p, struct op *op, uint64_t deadline)
{
    void *out = malloc(p->result_bytes + 1);
    int rc = out ? c->coll->ops->alltoallv(c->coll, op->req.sendbuf, p->send_bytes, out,
                                           p->recv_bytes, deadline)
                 : KOLO_ENOMEM;
    set_result(c, op, p, out, rc);
}

static void exec_reducescatter(struct kolo_ctx *c, const struct plan *p, struct op *op,
                               uint64_t deadline)
{
    const void *in = op->req.sendbuf;
    if (p->pre != 1.0) {
        if (ensure(&c->fusion, &c->fusion_cap, p->total * p->es + 1) != 0) {
            finish(c, &op, 1, KOLO_ENOMEM, "out of memory");
            return;
        }
        memcpy(c->fusion, in, p->total * p->es);
        reduce_scale(p->dt, c->fusion, p->total, p->pre);
        in = c->fusion;
    }
    int rc = c->coll->ops->reducescatter(c->coll, p->dt, KOLO_SUM, in, op->req.recvbuf,
                                         p->rank_count, deadline);
    if (rc == 0)
        exec_post_scale(p, op->req.recvbuf, p->rank_count[c->rank]);
    finish(c, &op, 1, rc, rc ? why_of(c, rc) : NULL);
}

/* A host collective ended on this rank's data plane (mu not held): where
 * its time goes (time_split.h; exec_locked marked the start). */
static void split_run_end(struct kolo_ctx *c)
{
    if (!c->telemetry)
        return;
    pthread_mutex_lock(&c->mu);
    time_split_running(&c->split, now_mono_us(), -1);
    pthread_mutex_unlock(&c->mu);
}

/* Runs response r on the ops found for it (mu held on entry, released on
 * return). */
static void exec_locked(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops)
{
    uint64_t deadline = ctx_deadline(c);
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
    if (!on_gpu && c->telemetry) /* GPU ops: NCCL's streams, not measured here */
        time_split_running(&c->split, now_mono_us(), +1);
    pthread_mutex_unlock(&c->mu);

    /* GPU tensors: the NCCL backend queues the work and returns; the
     * finaliser completes the ops (nccl_exec.h). */
    if (on_gpu) {
        gpu_exec_response(c, r, ops, deadline);
        return;
    }

    struct plan p;
    char why[128];
    int rc = plan_make(&p, r, c->rank, c->size, ops[0] != NULL, why, sizeof(why));
    if (rc) {
        finish(c, ops, run, rc, why);
        plan_free(&p);
        split_run_end(c);
        return;
    }
    switch (r->coll) {
    case KOLO_COLL_ALLREDUCE:
        exec_allreduce(c, r, &p, ops, deadline);
        break;
    case KOLO_COLL_ALLGATHER:
        if (ops[0])
            exec_allgather(c, &p, ops[0], deadline);
        break;
    case KOLO_COLL_ALLTOALL:
        if (ops[0])
            exec_alltoall(c, &p, ops[0], deadline);
        break;
    case KOLO_COLL_REDUCESCATTER:
        if (ops[0])
            exec_reducescatter(c, &p, ops[0], deadline);
        break;
    case KOLO_COLL_BROADCAST: {
        struct op *op = ops[0];
        size_t bytes = (size_t)(r->n_sizes ? r->sizes[0] : 0) * kolo_dtype_size(r->dtype);
        if (!op)
            break;
        if (c->rank == r->root && op->req.sendbuf != op->req.recvbuf && bytes)
            memcpy(op->req.recvbuf, op->req.sendbuf, bytes);
        int rc = c->coll->ops->broadcast(c->coll, op->req.recvbuf, bytes, r->root, deadline);
        ops_finish(c, &op, 1, rc, rc ? why_of(c, rc) : NULL, r->cache_ids, r->n_cache_ids);
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
    plan_free(&p);
    split_run_end(c);
}

/* Unnamed barriers are named by a per-rank counter (kolo.barrier.N, ops.c).
 * A rank that joined takes part in the barriers its peers run meanwhile
 * without submitting them: it counts them here, as it runs them, so its
 * next barrier has the name its peers' next one has (it waited forever
 * for a partner otherwise: Horovod's join with barrier, issue 30). */
static void barrier_catch_up(struct kolo_ctx *c, const Kolo__Response *r)
{
    for (size_t i = 0; i < r->n_names; i++) {
        unsigned long long n;
        char end;
        if (sscanf(r->names[i], "kolo.barrier.%llu%c", &n, &end) == 1 && n > c->barriers)
            c->barriers = n;
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
    if (r->cache_reset)
        return; /* ctx_run_log_entry cleared the caches (fast_cache_reset) */
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
    if (r->coll == KOLO_COLL_BARRIER)
        barrier_catch_up(c, r);
    exec_locked(c, r, ops);
    free(ops);
}

void exec_pinned(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops)
{
    pthread_mutex_lock(&c->mu);
    exec_locked(c, r, ops);
}
