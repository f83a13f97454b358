/*
 * solo.c - the one-rank context: a process started without kolo run.
 *
 * A program started alone (no coordinator configured) runs as rank 0 of
 * 1, as Horovod's programs do without a launcher. Its context is a job
 * context of one rank without the parts that need others: no RPC client,
 * no rendezvous, no listener, no readiness rounds. Everything else is the
 * same code as in a job of one rank started by kolo run: the submit
 * queue and handles (ops.c), the response log and the executor token
 * (ctx.c), the executor with its scaling and fusion rules (exec.c), a
 * ring of one rank as the data plane (ring.c) and the GPU backend
 * (nccl_exec.c, a communicator of one rank).
 *
 * Only the negotiation is local. With one rank, a request is ready the
 * moment it is submitted, so solo_negotiate answers the queue at once
 * with the log entry the coordinator writes for a job of one rank
 * (coord_negot.c: the same mismatch rules, the same sizes; one entry per
 * tensor, no cache ids, a join answered at once) and appends it to the
 * log, where the background thread or a waiting user thread runs it.
 */
#include "solo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "mismatch.h"
#include "ops.h"

int solo_config(const kolo_config *given, kolo_config *cfg, char *err, size_t errlen)
{
    if (given->size > 1)
        return errf(err, errlen, KOLO_EINVAL,
                    "this process was not started by kolo (KOLO_COORDINATOR is not set) but a "
                    "size of %d was asked for; launch it with `kolo run -np %d ...`",
                    given->size, given->size);
    /* The topology of one rank, whatever else the environment says; the
     * knobs that still mean something here are kept. */
    *cfg = (kolo_config){.size = 1,
                         .local_size = 1,
                         .cross_size = 1,
                         .timeout_ms = given->timeout_ms,
                         .fusion_threshold = given->fusion_threshold,
                         .process_set = given->process_set};
    return 0;
}

int solo_setup(struct kolo_ctx *c)
{
    struct xport *self = NULL;
    return ring_create(0, 1, &self, &c->coll);
}

/* The log entry the coordinator writes for op when its rank is the only
 * one (coord_negot.c: emit_ready, fill_sizes, the join), as a message the
 * log owns: packed and unpacked, so it is freed like one that arrived. */
static Kolo__Response *solo_response(const struct kolo_ctx *c, const struct op *op)
{
    const kolo_request *r = &op->req;
    char *names[1] = {op->name};
    char err[1024] = "";
    int64_t rows = r->ndim > 0 ? r->shape[0] : 1, row_elems = 1;
    for (int i = 1; i < r->ndim; i++)
        row_elems *= r->shape[i];
    int64_t size = request_elems(r);
    if (r->coll == KOLO_COLL_ALLGATHER)
        size = rows;
    else if (r->coll == KOLO_COLL_ALLTOALL)
        size = op->splits ? op->splits[0] : rows;
    Kolo__Response x = KOLO__RESPONSE__INIT;
    x.coll = (uint32_t)r->coll;
    if (r->coll == KOLO_COLL_JOIN) {
        x.last_joined = c->rank; /* every rank (this one) joined */
    } else {
        struct tensor_req t = {.coll = (uint32_t)r->coll,
                               .dtype = (uint32_t)r->dtype,
                               .op = (uint32_t)r->op,
                               .ndim = r->ndim,
                               .shape = op->shape,
                               .prescale = r->prescale,
                               .postscale = r->postscale,
                               .root = r->root,
                               .device = r->device,
                               .splits = op->splits,
                               .nsplits = op->splits ? r->nsplits : 0};
        const struct tensor_req *reqs[1] = {&t};
        mismatch_check(op->name, reqs, 1, 0, err, sizeof err);
        x.names = names;
        x.n_names = 1;
    }
    if (err[0]) {
        x.error_code = KOLO_EMISMATCH;
        x.error = err;
    } else if (r->coll != KOLO_COLL_JOIN) {
        x.dtype = (uint32_t)r->dtype;
        x.op = (uint32_t)r->op;
        x.prescale = r->prescale;
        x.postscale = r->postscale;
        x.root = r->root;
        x.sizes = &size;
        x.n_sizes = 1;
        x.row_elems = &row_elems;
        x.n_row_elems = 1;
    }
    size_t len = kolo__response__get_packed_size(&x);
    uint8_t *buf = malloc(len + 1);
    if (!buf)
        return NULL;
    kolo__response__pack(&x, buf);
    Kolo__Response *owned = kolo__response__unpack(NULL, len, buf);
    free(buf);
    return owned;
}

void solo_negotiate(struct kolo_ctx *c)
{
    struct op *op;
    while ((op = op_queue_pop(&c->q_head, &c->q_tail)) != NULL) {
        op->state = OP_SENT;
        c->inflight++;
        Kolo__Response *x = solo_response(c, op);
        if (!x) {
            ops_complete(c, op, KOLO_ENOMEM, "out of memory");
            continue;
        }
        x->index = c->cursor++;
        ctx_log_put(c, x);
    }
    pthread_cond_signal(&c->wake);
    pthread_cond_broadcast(&c->done); /* a waiter may run the entry itself */
}
