/*
 * mismatch.c - see mismatch.h. The texts are Horovod's (its controller's
 * ConstructResponse), so a script that matches on them keeps working.
 */
#include "mismatch.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "abi.h"

/* Horovod's names of the element types in its mismatch texts */
static const char *const horovod_dtypes[KOLO_DTYPE_COUNT] = {
#define HOROVOD_DTYPE_(sym, value, bytes, name) [value] = "HOROVOD_" #sym,
    KOLO_DTYPES(HOROVOD_DTYPE_)
#undef HOROVOD_DTYPE_
};

const char *mismatch_coll_name(uint32_t coll)
{
    const char *s = abi_coll_symbol((int)coll);
    return s ? s : "UNKNOWN";
}

const char *mismatch_dtype_name(uint32_t dtype)
{
    return dtype < KOLO_DTYPE_COUNT ? horovod_dtypes[dtype] : "UNKNOWN";
}

const char *mismatch_op_name(uint32_t op)
{
    const char *s = abi_op_symbol((int)op);
    return s ? s : "?";
}

void mismatch_shutdown_text(char *out, size_t size, int rank, const char *reason)
{
    char who[32] = "a rank";
    if (rank >= 0)
        snprintf(who, sizeof who, "rank %d", rank);
    snprintf(out, size,
             "Horovod has been shut down: %s left the job (%s). This was caused by an exception "
             "on one of the ranks or an attempt to run a collective after one of the ranks "
             "finished execution.",
             who, reason && reason[0] ? reason : "shutdown");
}

void tensor_shape_text(char *out, size_t size, const struct tensor_req *t)
{
    size_t o = 0;
    o += (size_t)snprintf(out + o, size - o, "[");
    for (int i = 0; i < t->ndim && o < size; i++)
        o += (size_t)snprintf(out + o, size - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < size)
        snprintf(out + o, size - o, "]");
}

static bool same_shape(const struct tensor_req *a, const struct tensor_req *b)
{
    return a->ndim == b->ndim &&
           (a->ndim == 0 || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(int64_t)) == 0);
}

void mismatch_check(const char *name, const struct tensor_req *const *reqs, int size, int njoined,
                    char *err, size_t errlen)
{
    err[0] = '\0';
    const struct tensor_req *a = NULL;
    for (int r = 0; r < size && !a; r++)
        a = reqs[r];
    if (!a) {
        snprintf(err, errlen, "internal error: no request for %s", name);
        return;
    }
    const char *op = mismatch_coll_name(a->coll);
    if (a->dtype >= KOLO_DTYPE_COUNT || a->coll >= KOLO_COLL_COUNT ||
        (a->coll == KOLO_COLL_ALLREDUCE && a->op >= KOLO_OP_COUNT)) {
        snprintf(err, errlen, "Invalid request for tensor %s.", name);
        return;
    }
    for (int r = 0; r < size; r++) {
        const struct tensor_req *b = reqs[r];
        if (!b || b == a)
            continue;
        if (b->coll != a->coll) {
            snprintf(err, errlen,
                     "Mismatched operations: One rank did an %s, but another rank did an %s.", op,
                     mismatch_coll_name(b->coll));
            return;
        }
        if (b->dtype != a->dtype) {
            snprintf(err, errlen,
                     "Mismatched data types: One rank had type %s, but another rank had type %s.",
                     mismatch_dtype_name(a->dtype), mismatch_dtype_name(b->dtype));
            return;
        }
        if ((b->device < 0) != (a->device < 0)) {
            snprintf(err, errlen,
                     "Mismatched %s CPU/GPU device selection: One rank specified device %s, but "
                     "another rank specified device %s.",
                     op, a->device < 0 ? "CPU" : "GPU", b->device < 0 ? "CPU" : "GPU");
            return;
        }
        switch (a->coll) {
        case KOLO_COLL_ALLREDUCE:
        case KOLO_COLL_BROADCAST:
        case KOLO_COLL_REDUCESCATTER:
            if (!same_shape(a, b)) {
                char sa[256], sb[256];
                tensor_shape_text(sa, sizeof(sa), a);
                tensor_shape_text(sb, sizeof(sb), b);
                snprintf(err, errlen,
                         "Mismatched %s tensor shapes: One rank sent a tensor of shape %s, but "
                         "another rank sent a tensor of shape %s.",
                         op, sa, sb);
                return;
            }
            if (a->coll != KOLO_COLL_BROADCAST &&
                (a->prescale != b->prescale || a->postscale != b->postscale)) {
                snprintf(err, errlen,
                         "Mismatched prescale and/or postscale factors: One rank sent factors "
                         "%g, %g, but another rank sent factors %g, %g.",
                         a->prescale, a->postscale, b->prescale, b->postscale);
                return;
            }
            if (a->coll != KOLO_COLL_BROADCAST && a->op != b->op) {
                snprintf(err, errlen,
                         "Mismatched reduction operation: One rank requested op %s, but another "
                         "rank requested op %s.",
                         mismatch_op_name(a->op), mismatch_op_name(b->op));
                return;
            }
            if (a->coll == KOLO_COLL_BROADCAST && a->root != b->root) {
                snprintf(err, errlen,
                         "Mismatched BROADCAST root ranks: One rank specified root rank %d, but "
                         "another rank specified root rank %d.",
                         a->root, b->root);
                return;
            }
            break;
        case KOLO_COLL_ALLGATHER:
        case KOLO_COLL_ALLTOALL:
            if (a->ndim != b->ndim) {
                snprintf(err, errlen,
                         "Mismatched %s tensor shapes: One rank sent a tensor of rank %d, but "
                         "another rank sent a tensor of rank %d.",
                         op, a->ndim, b->ndim);
                return;
            }
            for (int d = 1; d < a->ndim; d++) {
                if (a->shape[d] != b->shape[d]) {
                    snprintf(err, errlen,
                             "Mismatched %s tensor shapes: One rank sent a tensor with dimension "
                             "%d equal to %lld, but another rank sent a tensor with dimension %d "
                             "equal to %lld.",
                             op, d, (long long)a->shape[d], d, (long long)b->shape[d]);
                    return;
                }
            }
            break;
        default:
            break;
        }
    }
    if ((a->coll == KOLO_COLL_ALLGATHER || a->coll == KOLO_COLL_ALLTOALL ||
         a->coll == KOLO_COLL_REDUCESCATTER) &&
        a->ndim == 0) {
        snprintf(err, errlen, "Process-set rank zero tried to %s a rank-zero tensor.", op);
        return;
    }
    if (a->coll == KOLO_COLL_BROADCAST && (a->root < 0 || a->root >= size)) {
        snprintf(err, errlen, "Invalid BROADCAST root rank %d for %d rank(s).", a->root, size);
        return;
    }
    if (njoined > 0) {
        if (a->coll == KOLO_COLL_ALLGATHER)
            snprintf(err, errlen,
                     "Allgather is not supported with Join at this time. Specify "
                     "sparse_as_dense=True if using DistributedOptimizer");
        else if (a->coll == KOLO_COLL_ALLTOALL || a->coll == KOLO_COLL_BROADCAST ||
                 a->coll == KOLO_COLL_REDUCESCATTER)
            snprintf(err, errlen, "%s is not supported with Join at this time.",
                     a->coll == KOLO_COLL_ALLTOALL    ? "Alltoall"
                     : a->coll == KOLO_COLL_BROADCAST ? "Broadcast"
                                                      : "Reducescatter");
    }
}

