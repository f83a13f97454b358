/*
 * plan.h - a response of the log as the executors run it (issue 17,
 * item 6). The arithmetic that the CPU executor (exec.c) and the GPU
 * executor (nccl_exec.c) share is done here, once: where each fused
 * tensor sits in the fusion buffer, what scales a reduction before and
 * after (AVERAGE folded in), Horovod's split of a reducescatter, and the
 * byte counts of an allgather or alltoall. The executors only move data.
 * Pure: no context, no I/O; tests/worker/test_plan.c checks it as a table.
 */
#ifndef KOLO_WORKER_PLAN_H
#define KOLO_WORKER_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kolo/abi.h"
#include "kolo.pb-c.h"

#define PLAN_INLINE 8

struct plan {
    kolo_coll coll;
    kolo_dtype dt;
    kolo_op op;
    size_t es; /* bytes per element */
    /* reductions (allreduce, reducescatter): x = x * pre before; after,
     * x = x / post_divisor * post_factor (an integer type's AVERAGE
     * divides by the ranks; a float type's folds 1 / ranks into the
     * factor). post is the user's postscale alone, for backends that
     * scale themselves (NCCL's ncclAvg and premultiplication). */
    double pre, post, post_factor;
    int post_divisor;
    /* allreduce: k tensors; tensor i is count[i] elements at element
     * offset[i] of the fusion buffer, total in all. fused: the data goes
     * through the fusion buffer (several tensors, or this rank joined
     * and contributes zeros). */
    size_t k, total;
    size_t *count, *offset;
    bool fused;
    /* count and offset point here when k <= PLAN_INLINE: the common
     * response (a few tensors) costs no allocation on the hot path */
    size_t count_inline[PLAN_INLINE], offset_inline[PLAN_INLINE];
    /* reducescatter: the elements each rank receives (Horovod's split:
     * rows / size rows each, the first rows % size ranks one more) */
    size_t *rank_count;
    /* allgather: bytes from each rank; alltoall: bytes this rank sends
     * to each (send_bytes) and receives from each (recv_bytes, with the
     * row counts in recv_rows); result_bytes and rows: the result's */
    size_t *send_bytes, *recv_bytes;
    int32_t *recv_rows;
    size_t result_bytes;
    int64_t rows;
};

/* plan_make fills p for response r at rank of size ranks; have_first:
 * this rank has the response's first tensor (false when it joined).
 * Returns 0, or KOLO_EPROTO (malformed response) / KOLO_ENOMEM with why
 * set. plan_free frees what it allocated (also after a failure). */
int plan_make(struct plan *p, const Kolo__Response *r, int rank, int size, bool have_first,
              char *why, size_t whylen);
void plan_free(struct plan *p);
/* plan_scales sets p's pre, post, post_factor and post_divisor for a
 * reduction p->op of p->dt over size ranks (prescale, postscale 0 = 1). */
void plan_scales(struct plan *p, double prescale, double postscale, int size);

#endif
