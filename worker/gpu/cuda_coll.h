/*
 * cuda_coll.h - the GPU collectives behind struct coll (coll.h).
 *
 * Two implementations of the CPU backends' interface, on device buffers:
 *   - nccl (nccl_coll.c): NCCL over a communicator of the generation's
 *     ranks, one per GPU; optionally hierarchical for allreduce (a
 *     reduce-scatter inside each host, an allreduce of the shards across
 *     hosts, an allgather inside each host).
 *   - staged (nccl_coll.c): copies through pinned host memory and runs
 *     the CPU backend of the context (shmcoll or ring). It serves GPUs
 *     that NCCL cannot put in one communicator (several ranks on one GPU)
 *     and reductions of types NCCL lacks (int16).
 *
 * Unlike the CPU backends the calls are stream-ordered: they return once
 * the work is queued on the backend's stream, and the caller learns of
 * completion from an event it records after them (the staged backend
 * waits for its own copies to the host, so it blocks the caller for the
 * duration of the CPU step). The other rules of coll.h hold: collective,
 * same arguments everywhere, sticky failure; "bytes" are bytes and
 * AVERAGE reduces as SUM (the caller divides).
 */
#ifndef KOLO_WORKER_CUDA_COLL_H
#define KOLO_WORKER_CUDA_COLL_H

#include "cuda_api.h"

#if KOLO_HAVE_NCCL

#include <stdbool.h>

#include "coll.h"

/* Takes ownership of the communicators (aborted by destroy). local and
 * cross are NULL for a flat allreduce; both set make it hierarchical,
 * with this rank at local_rank of local_size in its host. */
int nccl_coll_create(const struct gpu_libs *g, ncclComm_t comm, ncclComm_t local, ncclComm_t cross,
                     int local_rank, int local_size, int rank, int size, cudaStream_t stream,
                     struct coll **out);

/*
 * The reductions with the scaling folded into NCCL: each input multiplied
 * by factor (ncclRedOpCreatePreMulSum) and, with average, divided by the
 * number of ranks (ncclAvg, or the premultiplier). KOLO_ENOTSUP when NCCL
 * cannot do it exactly for this type (then nothing was queued and the
 * caller uses a plain SUM and the scaling kernels).
 */
int nccl_coll_allreduce_scaled(struct coll *c, kolo_dtype dt, bool average, double factor,
                               const void *in, void *out, size_t count, uint64_t deadline);
int nccl_coll_reducescatter_scaled(struct coll *c, kolo_dtype dt, bool average, double factor,
                                   const void *in, void *out, const size_t *counts,
                                   uint64_t deadline);

/* Aborts the communicators now (ncclCommAbort): queued NCCL kernels
 * end, later calls fail. Any thread; the coll stays to be destroyed. */
void nccl_coll_abort(struct coll *c, const char *why);

/* NCCL's asynchronous error of the communicators: 0, or KOLO_EPEER with
 * the text in why. */
int nccl_coll_check(struct coll *c, char *why, size_t n);

/* The staged backend over cpu (not owned) on device dev. */
int staged_coll_create(const struct gpu_libs *g, struct coll *cpu, int dev, cudaStream_t stream,
                       struct coll **out);

/* Polls ev until it completed, NCCL or CUDA reported an error, *abort
 * became true (may be NULL) or the deadline passed; sleeps between polls
 * after a short spin. 0 or a code with the reason in why. */
int gpu_event_wait(const struct gpu_libs *g, cudaEvent_t ev, uint64_t deadline,
                   const volatile bool *abort, char *why, size_t n);

#endif /* KOLO_HAVE_NCCL */
#endif
