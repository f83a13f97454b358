/*
 * nccl_coll.c - struct coll on the GPU: NCCL, and staged through the CPU.
 *
 * NCCL. The communicators are non-blocking (ncclConfig.blocking = 0), so
 * no call can hang: a call that answers ncclInProgress is polled with
 * ncclCommGetAsyncError until it is done, an error, or past the deadline
 * (then the communicator is aborted). A poll also stops when another
 * thread aborts the communicator (nccl_coll_abort sets a flag before it
 * takes the lock that every call holds). Types: reductions use NCCL's
 * type of the dtype (no int16: the executor sends those to the staged
 * backend); data movement moves bytes (ncclUint8), so every dtype works.
 *
 * Uneven shapes: allgather of unequal contributions is a group of
 * ncclBroadcast, one per rank (NCCL's allgather wants equal counts);
 * Horovod's uneven reducescatter split is a group of ncclReduce, one per
 * rank as root; alltoall is a group of ncclSend/ncclRecv.
 *
 * Hierarchical allreduce (local and cross communicators present): the
 * buffer is padded to a multiple of the local size L and copied into a
 * scratch buffer; a reduce-scatter inside the host leaves each local rank
 * one shard of the host's sum; an allreduce across hosts (the ranks with
 * the same local rank) sums the shards; an allgather inside the host
 * gives every rank the whole result. Inter-host traffic is 1/L of the
 * flat ring's, which pays on hosts with several GPUs and a slower network.
 *
 * Staged. Device to pinned host memory on the stream, wait for it (with
 * the deadline), run the CPU backend's collective on host memory, queue
 * the copy back. Host buffers are reused: the next call waits for its
 * own device-to-host copy, which the stream orders after the previous
 * call's copy back, before the CPU writes them again.
 */
#include "cuda_coll.h"

#if KOLO_HAVE_NCCL

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reduce.h"
#include "util.h"

/* ---------------------------------------------------------------- waiting */

static void nap(unsigned iter)
{
    /* A GPU op of a few microseconds should be seen at once; a long one
     * should not burn a core. */
    if (iter < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, iter < 1024 ? 20000 : 200000};
    nanosleep(&ts, NULL);
}

int gpu_event_wait(const struct gpu_libs *g, cudaEvent_t ev, uint64_t deadline,
                   const volatile bool *abort, char *why, size_t n)
{
    for (unsigned iter = 0;; iter++) {
        cudaError_t e = g->rt.EventQuery(ev);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady) {
            snprintf(why, n, "CUDA error while waiting for the GPU: %s", gpu_cuda_str(e));
            return KOLO_EIO;
        }
        if (abort && *abort) {
            snprintf(why, n, "the GPU communicator was aborted");
            return KOLO_ESHUTDOWN;
        }
        if ((iter & 63) == 63 && deadline && now_mono_ms() >= deadline) {
            snprintf(why, n, "a GPU operation did not finish before the deadline");
            return KOLO_ETIMEDOUT;
        }
        nap(iter);
    }
}

/* ---------------------------------------------------------------- NCCL */

struct nccl_coll {
    struct coll base;
    const struct gpu_libs *g;
    ncclComm_t comm, local, cross;
    int local_size, local_rank;
    cudaStream_t stream;
    pthread_mutex_t mu; /* one NCCL call sequence at a time; abort takes it */
    volatile bool aborting;
    bool aborted;
    void *scratch; /* hierarchical: the padded buffer */
    size_t scratch_cap;
};

static int nc_fail(struct nccl_coll *nc, int code, const char *fmt, const char *detail)
{
    if (!nc->base.failed) {
        nc->base.failed = code;
        snprintf(nc->base.why, sizeof(nc->base.why), fmt, detail);
    }
    return nc->base.failed;
}

static void nc_abort_locked(struct nccl_coll *nc)
{
    if (nc->aborted)
        return;
    nc->aborted = true;
    ncclComm_t all[3] = {nc->comm, nc->local, nc->cross};
    for (int i = 0; i < 3; i++)
        if (all[i])
            nc->g->nccl.CommAbort(all[i]);
}

/* Settles the result of a NCCL call on comm: ncclInProgress is polled
 * until the call completed (non-blocking communicators), bounded by the
 * deadline and by an abort from another thread. */
static int nc_settle(struct nccl_coll *nc, ncclComm_t comm, ncclResult_t r, uint64_t deadline)
{
    for (unsigned iter = 0; r == ncclInProgress; iter++) {
        if (nc->aborting)
            return nc_fail(nc, KOLO_ESHUTDOWN, "%s", "the GPU communicator was aborted");
        if ((iter & 63) == 63 && deadline && now_mono_ms() >= deadline) {
            nc_abort_locked(nc);
            return nc_fail(nc, KOLO_ETIMEDOUT, "%s",
                           "NCCL did not finish queueing an operation before the deadline "
                           "(a peer may be gone)");
        }
        nap(iter);
        ncclResult_t st = ncclSuccess;
        if (nc->g->nccl.CommGetAsyncError(comm, &st) != ncclSuccess)
            st = ncclInternalError;
        r = st;
    }
    if (r != ncclSuccess) {
        const char *last = nc->g->nccl.GetLastError ? nc->g->nccl.GetLastError(comm) : NULL;
        char msg[160];
        snprintf(msg, sizeof(msg), "%s%s%s", gpu_nccl_str(r), last && last[0] ? ": " : "",
                 last ? last : "");
        nc_abort_locked(nc);
        return nc_fail(nc, r == ncclRemoteError || r == ncclSystemError ? KOLO_EPEER : KOLO_EIO,
                       "NCCL failed: %.140s", msg);
    }
    return 0;
}

static int nc_enter(struct nccl_coll *nc)
{
    pthread_mutex_lock(&nc->mu);
    if (nc->base.failed || nc->aborted) {
        pthread_mutex_unlock(&nc->mu);
        return nc_fail(nc, KOLO_ESHUTDOWN, "%s", "the GPU communicator was aborted");
    }
    return 0;
}

static int nc_leave(struct nccl_coll *nc, int rc)
{
    pthread_mutex_unlock(&nc->mu);
    return rc;
}

static ncclRedOp_t nccl_op(kolo_op op)
{
    switch (op) {
    case KOLO_MIN:
        return ncclMin;
    case KOLO_MAX:
        return ncclMax;
    case KOLO_PRODUCT:
        return ncclProd;
    default:
        return ncclSum; /* AVERAGE too: the caller divides */
    }
}

static int ensure_scratch(struct nccl_coll *nc, size_t need)
{
    if (need <= nc->scratch_cap)
        return 0;
    size_t cap = nc->scratch_cap ? nc->scratch_cap : 1 << 20;
    while (cap < need)
        cap *= 2;
    if (nc->scratch)
        nc->g->rt.FreeAsync(nc->scratch, nc->stream);
    nc->scratch = NULL;
    nc->scratch_cap = 0;
    if (nc->g->rt.MallocAsync(&nc->scratch, cap, nc->stream) != cudaSuccess) {
        nc->g->rt.GetLastError();
        return KOLO_ENOMEM;
    }
    nc->scratch_cap = cap;
    return 0;
}

/* The hierarchical allreduce (see the top of the file); op1 reduces
 * inside the host, op2 across hosts. Lock held. */
static int hier_allreduce(struct nccl_coll *nc, ncclDataType_t t, size_t es, ncclRedOp_t op1,
                          ncclRedOp_t op2, const void *in, void *out, size_t count,
                          uint64_t deadline)
{
    const struct nccl_fns *f = &nc->g->nccl;
    size_t L = (size_t)nc->local_size;
    size_t per = (count + L - 1) / L;
    if (count == 0)
        return 0;
    if (ensure_scratch(nc, per * L * es) != 0)
        return nc_fail(nc, KOLO_ENOMEM, "%s", "cannot allocate the hierarchical buffer");
    char *buf = nc->scratch, *shard = buf + (size_t)nc->local_rank * per * es;
    if (nc->g->rt.MemcpyAsync(buf, in, count * es, cudaMemcpyDeviceToDevice, nc->stream) !=
        cudaSuccess)
        return nc_fail(nc, KOLO_EIO, "%s", "device copy failed");
    int rc = nc_settle(nc, nc->local,
                       f->ReduceScatter(buf, shard, per, t, op1, nc->local, nc->stream), deadline);
    if (!rc)
        rc = nc_settle(nc, nc->cross,
                       f->AllReduce(shard, shard, per, t, op2, nc->cross, nc->stream), deadline);
    if (!rc)
        rc = nc_settle(nc, nc->local, f->AllGather(shard, buf, per, t, nc->local, nc->stream),
                       deadline);
    if (!rc && nc->g->rt.MemcpyAsync(out, buf, count * es, cudaMemcpyDeviceToDevice, nc->stream) !=
                   cudaSuccess)
        rc = nc_fail(nc, KOLO_EIO, "%s", "device copy failed");
    return rc;
}

static int nc_allreduce(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in, void *out,
                        size_t count, uint64_t deadline)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    int t = gpu_nccl_type(dtype);
    if (t < 0) {
        snprintf(c->why, sizeof(c->why), "NCCL cannot reduce %s", kolo_dtype_name(dtype));
        return KOLO_ENOTSUP;
    }
    int rc = nc_enter(nc);
    if (rc)
        return rc;
    if (nc->local && nc->cross)
        rc = hier_allreduce(nc, (ncclDataType_t)t, kolo_dtype_size(dtype), nccl_op(op), nccl_op(op),
                            in, out, count, deadline);
    else
        rc = nc_settle(nc, nc->comm,
                       nc->g->nccl.AllReduce(in, out, count, (ncclDataType_t)t, nccl_op(op),
                                             nc->comm, nc->stream),
                       deadline);
    return nc_leave(nc, rc);
}

/* A premultiplier for NCCL: factor in the type's own representation. */
static int make_premul(struct nccl_coll *nc, ncclComm_t comm, kolo_dtype dt, double factor,
                       ncclRedOp_t *op)
{
    union {
        uint16_t h;
        float f;
    } v;
    switch (dt) {
    case KOLO_FLOAT16:
        v.h = f32_to_f16((float)factor);
        break;
    case KOLO_BFLOAT16:
        v.h = f32_to_bf16((float)factor);
        break;
    case KOLO_FLOAT32:
        v.f = (float)factor;
        break;
    default:
        /* float64 too: NCCL 2.28's premultiplied sum of doubles left the
         * last element of a one-rank 4099-element reduction unwritten
         * (tests/gpu); the scaling kernels do it right. */
        return KOLO_ENOTSUP;
    }
    if (!nc->g->nccl.RedOpCreatePreMulSum)
        return KOLO_ENOTSUP;
    ncclResult_t r = nc->g->nccl.RedOpCreatePreMulSum(op, &v, (ncclDataType_t)gpu_nccl_type(dt),
                                                      ncclScalarHostImmediate, comm);
    /* non-blocking communicator: settle it (a local call, quick) */
    for (int i = 0; r == ncclInProgress && i < 100000; i++) {
        nap((unsigned)i);
        if (nc->g->nccl.CommGetAsyncError(comm, &r) != ncclSuccess)
            r = ncclInternalError;
    }
    return r == ncclSuccess ? 0 : KOLO_ENOTSUP;
}

static bool is_float(kolo_dtype dt)
{
    return dt == KOLO_FLOAT16 || dt == KOLO_BFLOAT16 || dt == KOLO_FLOAT32 || dt == KOLO_FLOAT64;
}

/*
 * How NCCL can do "sum, times factor, divided by size if average" in one
 * reduction: *op for the first (or only) stage, with *custom set when
 * it is a premultiplier to destroy after the call. Integers only
 * without a factor: NCCL's average of integers divides the sum exactly
 * (toward zero, as reduce_divide), but a premultiplier would have to be
 * an integer too. flat: no second stage, which could not divide again.
 */
static int fold(struct nccl_coll *nc, ncclComm_t comm, kolo_dtype dt, bool average, double factor,
                bool flat, ncclRedOp_t *op, bool *custom)
{
    *custom = false;
    if (!is_float(dt)) {
        if (factor != 1.0 || (average && !flat) || gpu_nccl_type(dt) < 0)
            return KOLO_ENOTSUP;
        *op = average ? ncclAvg : ncclSum;
        return 0;
    }
    double f = average ? factor / nc->base.size : factor;
    if (f == 1.0) {
        *op = ncclSum;
        return 0;
    }
    if (dt == KOLO_FLOAT64)
        return KOLO_ENOTSUP; /* see make_premul; ncclAvg of floats is a premultiplier too */
    if (average && factor == 1.0 && flat) {
        *op = ncclAvg;
        return 0;
    }
    int rc = make_premul(nc, comm, dt, f, op);
    *custom = rc == 0;
    return rc;
}

int nccl_coll_allreduce_scaled(struct coll *c, kolo_dtype dt, bool average, double factor,
                               const void *in, void *out, size_t count, uint64_t deadline)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    bool hier = nc->local && nc->cross;
    ncclRedOp_t op;
    bool custom;
    int rc = nc_enter(nc);
    if (rc)
        return rc;
    if (fold(nc, hier ? nc->local : nc->comm, dt, average, factor, !hier, &op, &custom) != 0)
        return nc_leave(nc, KOLO_ENOTSUP);
    ncclDataType_t t = (ncclDataType_t)gpu_nccl_type(dt);
    if (hier)
        rc = hier_allreduce(nc, t, kolo_dtype_size(dt), op, ncclSum, in, out, count, deadline);
    else
        rc =
            nc_settle(nc, nc->comm,
                      nc->g->nccl.AllReduce(in, out, count, t, op, nc->comm, nc->stream), deadline);
    if (custom && !nc->aborted)
        nc->g->nccl.RedOpDestroy(op, hier ? nc->local : nc->comm);
    return nc_leave(nc, rc);
}

static bool all_equal(const size_t *v, int n)
{
    for (int i = 1; i < n; i++)
        if (v[i] != v[0])
            return false;
    return true;
}

/* reducescatter with NCCL op, lock held. */
static int rs_locked(struct nccl_coll *nc, ncclDataType_t t, size_t es, ncclRedOp_t op,
                     const void *in, void *out, const size_t *counts, uint64_t deadline)
{
    const struct nccl_fns *f = &nc->g->nccl;
    int n = nc->base.size;
    if (all_equal(counts, n))
        return nc_settle(nc, nc->comm,
                         f->ReduceScatter(in, out, counts[0], t, op, nc->comm, nc->stream),
                         deadline);
    /* Horovod's uneven split: one reduction per rank, to that rank. */
    f->GroupStart();
    size_t off = 0;
    ncclResult_t r = ncclSuccess;
    for (int root = 0; root < n && r == ncclSuccess; root++) {
        if (counts[root])
            r = f->Reduce((const char *)in + off * es, out, counts[root], t, op, root, nc->comm,
                          nc->stream);
        off += counts[root];
    }
    ncclResult_t e = f->GroupEnd();
    return nc_settle(nc, nc->comm, r != ncclSuccess ? r : e, deadline);
}

static int nc_reducescatter(struct coll *c, kolo_dtype dtype, kolo_op op, const void *in, void *out,
                            const size_t *counts, uint64_t deadline)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    int t = gpu_nccl_type(dtype);
    if (t < 0) {
        snprintf(c->why, sizeof(c->why), "NCCL cannot reduce %s", kolo_dtype_name(dtype));
        return KOLO_ENOTSUP;
    }
    int rc = nc_enter(nc);
    if (rc)
        return rc;
    rc = rs_locked(nc, (ncclDataType_t)t, kolo_dtype_size(dtype), nccl_op(op), in, out, counts,
                   deadline);
    return nc_leave(nc, rc);
}

int nccl_coll_reducescatter_scaled(struct coll *c, kolo_dtype dt, bool average, double factor,
                                   const void *in, void *out, const size_t *counts,
                                   uint64_t deadline)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    ncclRedOp_t op;
    bool custom;
    int rc = nc_enter(nc);
    if (rc)
        return rc;
    if (fold(nc, nc->comm, dt, average, factor, true, &op, &custom) != 0)
        return nc_leave(nc, KOLO_ENOTSUP);
    rc = rs_locked(nc, (ncclDataType_t)gpu_nccl_type(dt), kolo_dtype_size(dt), op, in, out, counts,
                   deadline);
    if (custom && !nc->aborted)
        nc->g->nccl.RedOpDestroy(op, nc->comm);
    return nc_leave(nc, rc);
}

static int nc_allgatherv(struct coll *c, const void *in, void *out, const size_t *bytes,
                         uint64_t deadline)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    const struct nccl_fns *f = &nc->g->nccl;
    int n = c->size;
    int rc = nc_enter(nc);
    if (rc)
        return rc;
    if (all_equal(bytes, n)) {
        rc = nc_settle(nc, nc->comm,
                       f->AllGather(in, out, bytes[0], ncclUint8, nc->comm, nc->stream), deadline);
        return nc_leave(nc, rc);
    }
    f->GroupStart();
    size_t off = 0;
    ncclResult_t r = ncclSuccess;
    for (int root = 0; root < n && r == ncclSuccess; root++) {
        if (bytes[root])
            r = f->Broadcast(in, (char *)out + off, bytes[root], ncclUint8, root, nc->comm,
                             nc->stream);
        off += bytes[root];
    }
    ncclResult_t e = f->GroupEnd();
    rc = nc_settle(nc, nc->comm, r != ncclSuccess ? r : e, deadline);
    return nc_leave(nc, rc);
}

static int nc_broadcast(struct coll *c, void *buf, size_t bytes, int root, uint64_t deadline)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    int rc = nc_enter(nc);
    if (rc)
        return rc;
    rc = nc_settle(nc, nc->comm,
                   nc->g->nccl.Broadcast(buf, buf, bytes, ncclUint8, root, nc->comm, nc->stream),
                   deadline);
    return nc_leave(nc, rc);
}

static int nc_alltoallv(struct coll *c, const void *in, const size_t *send_bytes, void *out,
                        const size_t *recv_bytes, uint64_t deadline)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    const struct nccl_fns *f = &nc->g->nccl;
    int rc = nc_enter(nc);
    if (rc)
        return rc;
    f->GroupStart();
    size_t so = 0, ro = 0;
    ncclResult_t r = ncclSuccess;
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        if (send_bytes[p])
            r = f->Send((const char *)in + so, send_bytes[p], ncclUint8, p, nc->comm, nc->stream);
        if (r == ncclSuccess && recv_bytes[p])
            r = f->Recv((char *)out + ro, recv_bytes[p], ncclUint8, p, nc->comm, nc->stream);
        so += send_bytes[p];
        ro += recv_bytes[p];
    }
    ncclResult_t e = f->GroupEnd();
    rc = nc_settle(nc, nc->comm, r != ncclSuccess ? r : e, deadline);
    return nc_leave(nc, rc);
}

static int nc_barrier(struct coll *c, uint64_t deadline)
{
    /* Barriers have no tensor and run on the CPU data plane; a GPU-side
     * barrier would only order this stream, which the caller does not
     * need. */
    (void)c;
    (void)deadline;
    return 0;
}

static void nc_destroy(struct coll *c)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    nc->aborting = true;
    pthread_mutex_lock(&nc->mu);
    nc_abort_locked(nc);
    if (nc->scratch)
        nc->g->rt.FreeAsync(nc->scratch, nc->stream);
    pthread_mutex_unlock(&nc->mu);
    pthread_mutex_destroy(&nc->mu);
    free(nc);
}

void nccl_coll_abort(struct coll *c, const char *why)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    nc->aborting = true; /* a poll in progress gives up, then we get the lock */
    pthread_mutex_lock(&nc->mu);
    nc_abort_locked(nc);
    nc_fail(nc, KOLO_ESHUTDOWN, "%s", why ? why : "the GPU communicator was aborted");
    pthread_mutex_unlock(&nc->mu);
}

int nccl_coll_check(struct coll *c, char *why, size_t n)
{
    struct nccl_coll *nc = (struct nccl_coll *)c;
    if (nc->aborted || nc->aborting)
        return 0; /* reported by whoever aborted */
    ncclComm_t all[3] = {nc->comm, nc->local, nc->cross};
    for (int i = 0; i < 3; i++) {
        ncclResult_t st = ncclSuccess;
        if (!all[i] || nc->g->nccl.CommGetAsyncError(all[i], &st) != ncclSuccess)
            continue;
        if (st != ncclSuccess && st != ncclInProgress) {
            snprintf(why, n, "NCCL reported an error: %s", gpu_nccl_str(st));
            return KOLO_EPEER;
        }
    }
    return 0;
}

static const struct coll_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nc_allreduce,
    .allgatherv = nc_allgatherv,
    .broadcast = nc_broadcast,
    .alltoallv = nc_alltoallv,
    .reducescatter = nc_reducescatter,
    .barrier = nc_barrier,
    .destroy = nc_destroy,
};

int nccl_coll_create(const struct gpu_libs *g, ncclComm_t comm, ncclComm_t local, ncclComm_t cross,
                     int local_rank, int local_size, int rank, int size, cudaStream_t stream,
                     struct coll **out)
{
    struct nccl_coll *nc = calloc(1, sizeof(*nc));
    if (!nc)
        return KOLO_ENOMEM;
    nc->base.ops = &nccl_ops;
    nc->base.rank = rank;
    nc->base.size = size;
    nc->g = g;
    nc->comm = comm;
    nc->local = local;
    nc->cross = cross;
    nc->local_rank = local_rank;
    nc->local_size = local_size > 0 ? local_size : 1;
    nc->stream = stream;
    pthread_mutex_init(&nc->mu, NULL);
    *out = &nc->base;
    return 0;
}

/* ---------------------------------------------------------------- staged */

struct staged_coll {
    struct coll base;
    const struct gpu_libs *g;
    struct coll *cpu;
    int dev;
    cudaStream_t stream;
    cudaEvent_t ev;
    void *h_in, *h_out; /* pinned */
    size_t in_cap, out_cap;
};

static int st_fail(struct staged_coll *s, int code, const char *why)
{
    if (!s->base.failed) {
        s->base.failed = code;
        snprintf(s->base.why, sizeof(s->base.why), "%s", why);
    }
    return s->base.failed;
}

static int st_host(struct staged_coll *s, void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1 << 20;
    while (n < need)
        n *= 2;
    if (*buf)
        s->g->rt.FreeHost(*buf);
    *buf = NULL;
    *cap = 0;
    if (s->g->rt.HostAlloc(buf, n, cudaHostAllocPortable) != cudaSuccess) {
        s->g->rt.GetLastError();
        return st_fail(s, KOLO_ENOMEM, "cannot allocate pinned host memory for staging");
    }
    *cap = n;
    return 0;
}

/* Device to host on the stream, then wait for it (and for everything
 * queued before it, which includes the previous copy back). */
static int st_fetch(struct staged_coll *s, void *host, const void *dev, size_t bytes,
                    uint64_t deadline)
{
    if (s->base.failed)
        return s->base.failed;
    if (bytes &&
        s->g->rt.MemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s->stream) != cudaSuccess)
        return st_fail(s, KOLO_EIO, "device-to-host copy failed");
    if (s->g->rt.EventRecord(s->ev, s->stream) != cudaSuccess)
        return st_fail(s, KOLO_EIO, "cudaEventRecord failed");
    char why[160];
    int rc = gpu_event_wait(s->g, s->ev, deadline, NULL, why, sizeof(why));
    return rc ? st_fail(s, rc, why) : 0;
}

static int st_put(struct staged_coll *s, void *dev, const void *host, size_t bytes)
{
    if (bytes &&
        s->g->rt.MemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s->stream) != cudaSuccess)
        return st_fail(s, KOLO_EIO, "host-to-device copy failed");
    return 0;
}

static int st_cpu(struct staged_coll *s, int rc)
{
    if (rc)
        st_fail(s, rc, s->cpu->why[0] ? s->cpu->why : kolo_strerror(rc));
    return rc;
}

static size_t sum_of(const size_t *v, int n)
{
    size_t t = 0;
    for (int i = 0; i < n; i++)
        t += v[i];
    return t;
}

static int st_allreduce(struct coll *c, kolo_dtype dt, kolo_op op, const void *in, void *out,
                        size_t count, uint64_t deadline)
{
    struct staged_coll *s = (struct staged_coll *)c;
    size_t bytes = count * kolo_dtype_size(dt);
    int rc = st_host(s, &s->h_in, &s->in_cap, bytes + 1);
    if (!rc)
        rc = st_fetch(s, s->h_in, in, bytes, deadline);
    if (!rc)
        rc = st_cpu(s, s->cpu->ops->allreduce(s->cpu, dt, op, s->h_in, s->h_in, count, deadline));
    return rc ? rc : st_put(s, out, s->h_in, bytes);
}

static int st_allgatherv(struct coll *c, const void *in, void *out, const size_t *bytes,
                         uint64_t deadline)
{
    struct staged_coll *s = (struct staged_coll *)c;
    size_t total = sum_of(bytes, c->size);
    int rc = st_host(s, &s->h_in, &s->in_cap, bytes[c->rank] + 1);
    if (!rc)
        rc = st_host(s, &s->h_out, &s->out_cap, total + 1);
    if (!rc)
        rc = st_fetch(s, s->h_in, in, bytes[c->rank], deadline);
    if (!rc)
        rc = st_cpu(s, s->cpu->ops->allgatherv(s->cpu, s->h_in, s->h_out, bytes, deadline));
    return rc ? rc : st_put(s, out, s->h_out, total);
}

static int st_broadcast(struct coll *c, void *buf, size_t bytes, int root, uint64_t deadline)
{
    struct staged_coll *s = (struct staged_coll *)c;
    int rc = st_host(s, &s->h_in, &s->in_cap, bytes + 1);
    if (!rc)
        rc = st_fetch(s, s->h_in, buf, c->rank == root ? bytes : 0, deadline);
    if (!rc)
        rc = st_cpu(s, s->cpu->ops->broadcast(s->cpu, s->h_in, bytes, root, deadline));
    return rc ? rc : st_put(s, buf, s->h_in, c->rank == root ? 0 : bytes);
}

static int st_alltoallv(struct coll *c, const void *in, const size_t *send_bytes, void *out,
                        const size_t *recv_bytes, uint64_t deadline)
{
    struct staged_coll *s = (struct staged_coll *)c;
    size_t sb = sum_of(send_bytes, c->size), rb = sum_of(recv_bytes, c->size);
    int rc = st_host(s, &s->h_in, &s->in_cap, sb + 1);
    if (!rc)
        rc = st_host(s, &s->h_out, &s->out_cap, rb + 1);
    if (!rc)
        rc = st_fetch(s, s->h_in, in, sb, deadline);
    if (!rc)
        rc = st_cpu(
            s, s->cpu->ops->alltoallv(s->cpu, s->h_in, send_bytes, s->h_out, recv_bytes, deadline));
    return rc ? rc : st_put(s, out, s->h_out, rb);
}

static int st_reducescatter(struct coll *c, kolo_dtype dt, kolo_op op, const void *in, void *out,
                            const size_t *counts, uint64_t deadline)
{
    struct staged_coll *s = (struct staged_coll *)c;
    size_t es = kolo_dtype_size(dt);
    size_t total = sum_of(counts, c->size) * es, mine = counts[c->rank] * es;
    int rc = st_host(s, &s->h_in, &s->in_cap, total + 1);
    if (!rc)
        rc = st_host(s, &s->h_out, &s->out_cap, mine + 1);
    if (!rc)
        rc = st_fetch(s, s->h_in, in, total, deadline);
    if (!rc)
        rc = st_cpu(
            s, s->cpu->ops->reducescatter(s->cpu, dt, op, s->h_in, s->h_out, counts, deadline));
    return rc ? rc : st_put(s, out, s->h_out, mine);
}

static int st_barrier(struct coll *c, uint64_t deadline)
{
    struct staged_coll *s = (struct staged_coll *)c;
    return st_cpu(s, s->cpu->ops->barrier(s->cpu, deadline));
}

static void st_destroy(struct coll *c)
{
    struct staged_coll *s = (struct staged_coll *)c;
    /* The pinned buffers may still be read by a queued copy: wait for the
     * stream first (teardown only, after the communicators were aborted). */
    if (s->h_in || s->h_out)
        s->g->rt.StreamSynchronize(s->stream);
    if (s->h_in)
        s->g->rt.FreeHost(s->h_in);
    if (s->h_out)
        s->g->rt.FreeHost(s->h_out);
    s->g->rt.EventDestroy(s->ev);
    free(s);
}

static const struct coll_ops staged_ops = {
    .name = "staged",
    .allreduce = st_allreduce,
    .allgatherv = st_allgatherv,
    .broadcast = st_broadcast,
    .alltoallv = st_alltoallv,
    .reducescatter = st_reducescatter,
    .barrier = st_barrier,
    .destroy = st_destroy,
};

int staged_coll_create(const struct gpu_libs *g, struct coll *cpu, int dev, cudaStream_t stream,
                       struct coll **out)
{
    struct staged_coll *s = calloc(1, sizeof(*s));
    if (!s)
        return KOLO_ENOMEM;
    if (g->rt.EventCreateWithFlags(&s->ev, cudaEventDisableTiming) != cudaSuccess) {
        g->rt.GetLastError();
        free(s);
        return KOLO_EIO;
    }
    s->base.ops = &staged_ops;
    s->base.rank = cpu->rank;
    s->base.size = cpu->size;
    s->g = g;
    s->cpu = cpu;
    s->dev = dev;
    s->stream = stream;
    *out = &s->base;
    return 0;
}

#endif /* KOLO_HAVE_NCCL */
