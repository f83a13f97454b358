/*
 * kolo.h - libkolo, the runtime inside every training process.
 *
 * This is the library's only public header. A process creates a context
 * (normally from the environment that `kolo run` / the agent set), then
 * submits named collective operations asynchronously and waits for them.
 * A background thread per context negotiates each operation with the
 * coordinator (an operation runs once every rank submitted it, in one
 * order for all ranks) and executes it on the data plane (shared memory
 * between ranks of one host, TCP between hosts).
 *
 * Conventions. Every function returns int: 0 on success, a positive
 * KOLO_E* code on failure (stable, see the table below). kolo_strerror and
 * kolo_errname describe a code; kolo_last_error(ctx) has the detail of the
 * last failure on that context. Handles are opaque integers: a handle that
 * was released or never existed fails with KOLO_ENOTFOUND, never crashes.
 * There are no library globals: several contexts may live in one process.
 * The library prints nothing unless KOLO_LOG_LEVEL asks it to.
 */
#ifndef KOLO_H
#define KOLO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KOLO_API __attribute__((visibility("default")))

/* The shared vocabulary: error codes (enum kolo_err), element types
 * (kolo_dtype), reductions (kolo_op) and collective kinds (kolo_coll), one
 * table each. Values are part of the ABI and the wire protocol. */
#include "kolo/abi.h"

/* kolo_errname returns the symbolic name of code ("KOLO_ETIMEDOUT"), or
 * "KOLO_E?" for a code not in the table. Never NULL. */
KOLO_API const char *kolo_errname(int code);

/* kolo_strerror returns a short English description of code. Never NULL. */
KOLO_API const char *kolo_strerror(int code);

typedef struct kolo_ctx kolo_ctx;
typedef int64_t kolo_handle;

/*
 * kolo_config is the explicit form of what kolo_init otherwise reads from
 * the environment (KOLO_COORDINATOR, KOLO_TOKEN or KOLO_JOB_TOKEN, KOLO_JOB,
 * KOLO_GENERATION, KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, ...,
 * KOLO_HOST_ID). Zero-initialise it and set what you need; zero fields
 * take the documented defaults.
 */
typedef struct kolo_config {
    const char *coordinator; /* RPC URL of the coordinator */
    const char *token;       /* cluster token, NULL for none */
    uint64_t job_id;
    uint64_t generation;
    int rank, size;
    int local_rank, local_size; /* informational; placement decides */
    int cross_rank, cross_size;
    const char *host_id;   /* ranks with the same host id share memory */
    const char *data_addr; /* address peers reach this rank at; NULL: the
                              host's first non-loopback IPv4, else 127.0.0.1 */
    int timeout_ms;        /* rendezvous and peer-failure deadline; 0 = 30000 */
    int64_t fusion_threshold; /* bytes; 0 = 64 MiB; -1 disables fusion */
    int disable_shm;       /* 1: TCP between every pair (tests, benchmarks) */
    /* Elastic jobs: non-zero makes kolo_init ask the coordinator for this
     * worker's place in the job's current generation first (rank, size,
     * topology and generation above are then only who is asking), and
     * join that generation; a generation replaced while joining sends it
     * back to ask again, for up to elastic_timeout_ms (0 = 600 s). */
    uint64_t worker_id;
    int elastic_timeout_ms;
    /* Process sets: 0 joins the job itself; kolo_process_set_init fills
     * the rest for a set (rank and size are then within the set). */
    int process_set;
    /* The job's own credential (KOLO_JOB_TOKEN, what agents give their
     * workers): used instead of token, it opens this job's calls only. */
    const char *job_token;
    /* 1: seal the TCP data plane (AES-256-GCM records keyed per
     * connection; needs libcrypto at run time). Every rank of the job
     * must agree: a rank with another setting is refused. Shared memory
     * stays as it is (it never leaves the host). */
    int encrypt_data;
} kolo_config;

/*
 * kolo_init joins the job: it connects to the coordinator, opens this
 * rank's data-plane listener, waits until every rank of the generation
 * has joined (rendezvous, bounded by timeout_ms), connects to its peers
 * and starts the background thread. cfg NULL reads the environment.
 * On failure *ctx is NULL and the code says why (KOLO_ETIMEDOUT if peers
 * did not join in time, KOLO_EINVAL for a missing variable).
 *
 * Without a coordinator (KOLO_COORDINATOR unset or empty, or
 * cfg->coordinator NULL or "") and a size that is unset, 0 or 1, the
 * process runs alone, as Horovod's programs do when started without a
 * launcher: a one-rank context (rank 0 of 1, local 0 of 1, cross 0 of 1)
 * with no coordinator, no RPC and no data plane, whose collectives go
 * through this same API and executor as a job of one rank (kolo_solo).
 * A size above 1 without a coordinator fails with KOLO_EINVAL.
 */
KOLO_API int kolo_init(kolo_ctx **ctx, const kolo_config *cfg);

/* kolo_solo returns 1 for a one-rank context made without a coordinator
 * (see kolo_init), 0 for a context of a job, -1 for NULL. What needs a
 * coordinator fails on such a context with KOLO_ENOTSUP (kolo_timeline,
 * the snapshot calls) or does nothing (reports); process sets of its one
 * rank are one-rank contexts too. */
KOLO_API int kolo_solo(const kolo_ctx *ctx);

/*
 * kolo_fini leaves the job: pending operations fail with KOLO_ESHUTDOWN,
 * the background thread stops, connections close, memory is freed.
 * Other ranks see this rank leave (their pending operations fail with
 * KOLO_EPEER). NULL is accepted.
 */
KOLO_API int kolo_fini(kolo_ctx *ctx);

/*
 * Process sets (Horovod's hvd.ProcessSet): some of the job's ranks running
 * collectives among themselves, with a negotiation of their own (tensor
 * names are per set) and a data plane of their own (shared memory or TCP
 * between the members). Every rank of the job calls kolo_process_set_init
 * with the same set_id (> 0, never reused while the set exists) and the
 * same ranks (job ranks, any order, no duplicates), in the same order as
 * the other sets it creates. A member gets *set: a context whose rank and
 * size are within the set (ranks sorted), used with every other call of
 * this API; kolo_fini(*set) leaves the set (its pending operations fail).
 * A rank outside the set gets *set NULL and 0. The call returns once every
 * member joined (bounded by the job's rendezvous timeout). KOLO_EINVAL for
 * a bad id or rank list; elastic jobs have no process sets (KOLO_ENOTSUP).
 */
KOLO_API int kolo_process_set_init(kolo_ctx *ctx, int set_id, const int *ranks, int nranks,
                                   kolo_ctx **set);

/* The id of the process set a context runs (0: the job itself). */
KOLO_API int kolo_process_set_id(const kolo_ctx *ctx);

/*
 * kolo_abort fails every pending and future operation on ctx with
 * KOLO_ESHUTDOWN and tells the peers, without waiting for anything.
 * kolo_fini must still be called.
 */
KOLO_API int kolo_abort(kolo_ctx *ctx, const char *reason);

/* Topology of this context's generation. -1 for a NULL ctx. */
KOLO_API int kolo_rank(const kolo_ctx *ctx);
KOLO_API int kolo_size(const kolo_ctx *ctx);
KOLO_API int kolo_local_rank(const kolo_ctx *ctx);
KOLO_API int kolo_local_size(const kolo_ctx *ctx);
KOLO_API int kolo_cross_rank(const kolo_ctx *ctx);
KOLO_API int kolo_cross_size(const kolo_ctx *ctx);
/* kolo_generation returns the job generation ctx joined (elastic jobs get
 * a new one at every membership change), 0 for NULL. */
KOLO_API uint64_t kolo_generation(const kolo_ctx *ctx);

/*
 * kolo_timeline starts (path set) or stops (path NULL or "") the job's
 * timeline: a Chrome-trace file in Horovod's format, written by the
 * coordinator on its host (a relative path is taken from the job's working
 * directory) with every rank's negotiation. Any rank may call it; every
 * rank starting the same file opens it once. Blocks for one round trip to
 * the coordinator (at most 10 s); a stop first sends the spans of the ops
 * this rank traced (at most 3 s more), so that they are in the file.
 * KOLO_ENOTSUP on a context without one (kolo_solo).
 */
KOLO_API int kolo_timeline(kolo_ctx *ctx, const char *path);

/*
 * kolo_hosts_updated reports the latest membership update the coordinator
 * announced and the workers have not acted on yet: *stamp_ms is its
 * wall-clock time (0: none) and *kind Horovod's HostUpdateResult bits (1
 * hosts removed, 2 hosts added). Elastic training raises
 * HostsUpdatedInterrupt on it at the next commit or check_host_updates.
 */
KOLO_API int kolo_hosts_updated(const kolo_ctx *ctx, uint64_t *stamp_ms, int *kind);

/* kolo_last_error returns the detail of the last failure on ctx (the
 * text of a mismatch, the peer that died), "" if none. Valid until the
 * next call on ctx from the same thread. With ctx NULL: why this
 * thread's last kolo_init failed ("" after one that succeeded). */
KOLO_API const char *kolo_last_error(const kolo_ctx *ctx);

/* kolo_dtype_size returns the size of one element in bytes (0 if dtype
 * is invalid); kolo_dtype_name its name ("float32"), kolo_op_name a
 * reduction's ("sum"), kolo_coll_name a collective kind's ("allreduce"):
 * "invalid" for a value outside the table, never NULL. */
KOLO_API size_t kolo_dtype_size(kolo_dtype dtype);
KOLO_API const char *kolo_dtype_name(kolo_dtype dtype);
KOLO_API const char *kolo_op_name(kolo_op op);
KOLO_API const char *kolo_coll_name(kolo_coll coll);

/*
 * kolo_request is the general form of a collective operation, used by
 * kolo_submit; the kolo_*_async functions below fill one for you.
 *
 *  - name: unique among this rank's operations in flight; NULL or "" gets
 *    a per-context counter name ("kolo.op.17"), the same on every rank
 *    when every rank submits unnamed operations in the same order.
 *  - sendbuf: the input, shape[0..ndim) elements of dtype (ndim 0 means
 *    one element). count = product of shape.
 *  - recvbuf: the output for allreduce (same size), broadcast (same size;
 *    may equal sendbuf, which is then also the root's input) and
 *    reducescatter (this rank's rows: shape[0] / size rows, the first
 *    shape[0] % size ranks getting one more). NULL for allgather and
 *    alltoall, whose output sizes are known only after negotiation: read
 *    those with kolo_result. sendbuf == recvbuf works in place.
 *  - op, prescale, postscale: allreduce and reducescatter. Inputs are
 *    multiplied by prescale before the reduction and outputs by postscale
 *    after it (floating types only; 0 means 1.0).
 *  - root: broadcast.
 *  - splits, nsplits: alltoall: how many first-dimension rows go to each
 *    rank (nsplits == size), or NULL to split evenly (shape[0] must then
 *    divide by size).
 *  - device: -1 for host memory; >= 0 for a CUDA device (GPU backend).
 */
typedef struct kolo_request {
    kolo_coll coll;
    const char *name;
    const void *sendbuf;
    void *recvbuf;
    kolo_dtype dtype;
    int ndim;
    const int64_t *shape;
    kolo_op op;
    double prescale, postscale;
    int root;
    const int32_t *splits;
    int nsplits;
    int device;
} kolo_request;

/* The layout of kolo_request as this library was built: its size, and a
 * field's offset in bytes (-1 for a name it does not have). A binding
 * that cannot include this header (Python's ctypes) checks its own copy
 * against these at load, so a package and a library of different
 * versions fail with a message instead of passing garbage. */
KOLO_API size_t kolo_request_size(void);
KOLO_API long kolo_request_offset(const char *field);

/*
 * kolo_submit enqueues n operations and returns their handles. With n > 1
 * they form a group: negotiated and executed together (fused where they
 * can be), as Horovod's grouped_allreduce. Argument errors that this rank
 * can see alone (bad dtype, a name already in flight) fail here, with
 * nothing enqueued; disagreements between ranks fail in kolo_wait on
 * every rank with KOLO_EMISMATCH and Horovod's message in kolo_last_error.
 */
KOLO_API int kolo_submit(kolo_ctx *ctx, const kolo_request *reqs, int n, kolo_handle *handles);

/* kolo_allreduce_async reduces count elements of sendbuf across ranks
 * into recvbuf (may be the same buffer). */
KOLO_API int kolo_allreduce_async(kolo_ctx *ctx, const char *name, const void *sendbuf,
                                  void *recvbuf, size_t count, kolo_dtype dtype, kolo_op op,
                                  kolo_handle *handle);

/* kolo_allgather_async concatenates every rank's rows (first dimensions
 * may differ; the rest of the shape must agree); read with kolo_result. */
KOLO_API int kolo_allgather_async(kolo_ctx *ctx, const char *name, const void *sendbuf, int ndim,
                                  const int64_t *shape, kolo_dtype dtype, kolo_handle *handle);

/* kolo_broadcast_async copies root's buffer to every rank, in place. */
KOLO_API int kolo_broadcast_async(kolo_ctx *ctx, const char *name, void *buf, size_t count,
                                  kolo_dtype dtype, int root, kolo_handle *handle);

/* kolo_alltoall_async sends splits[i] rows to rank i (NULL: even) and
 * receives rows from every rank; read with kolo_result, which also gives
 * the received splits. */
KOLO_API int kolo_alltoall_async(kolo_ctx *ctx, const char *name, const void *sendbuf, int ndim,
                                 const int64_t *shape, kolo_dtype dtype, const int32_t *splits,
                                 kolo_handle *handle);

/* kolo_reducescatter_async reduces (SUM or AVERAGE) and leaves this
 * rank's share of the rows in recvbuf. */
KOLO_API int kolo_reducescatter_async(kolo_ctx *ctx, const char *name, const void *sendbuf,
                                      void *recvbuf, int ndim, const int64_t *shape,
                                      kolo_dtype dtype, kolo_op op, kolo_handle *handle);

/* kolo_barrier_async completes once every rank reached it. */
KOLO_API int kolo_barrier_async(kolo_ctx *ctx, kolo_handle *handle);

/*
 * kolo_join_async tells the others this rank ran out of data: until every
 * rank joined, it takes part in every allreduce the others run with zeros
 * (so averages still divide by size). Completes when all ranks joined;
 * kolo_result's value is the last rank to join.
 */
KOLO_API int kolo_join_async(kolo_ctx *ctx, kolo_handle *handle);

/* kolo_poll sets *done to 1 if the operation finished (successfully or
 * not) and 0 if not yet; it returns KOLO_ENOTFOUND for an unknown handle. */
KOLO_API int kolo_poll(kolo_ctx *ctx, kolo_handle handle, int *done);

/*
 * kolo_wait waits up to timeout_ms (negative: forever) for the operation
 * and returns its result: 0, or why it failed (KOLO_EMISMATCH,
 * KOLO_EPEER, KOLO_ESHUTDOWN, ...; detail in kolo_last_error). KOLO_ETIMEDOUT
 * means it is still running and the handle stays valid. Once finished, the
 * handle is released, except for operations with a result
 * (allgather, alltoall, join), which keep it for kolo_result until
 * kolo_release.
 */
KOLO_API int kolo_wait(kolo_ctx *ctx, kolo_handle handle, int timeout_ms);

/*
 * kolo_result describes a finished operation's output held by the
 * library: data and its size in bytes; the output's first dimension
 * (rows, the other dimensions are the input's); for alltoall, recv_splits
 * (size entries: rows received from each rank); for join, value is the
 * last joined rank. Pointers stay valid until kolo_release. Any output
 * pointer may be NULL.
 */
KOLO_API int kolo_result(kolo_ctx *ctx, kolo_handle handle, const void **data, size_t *bytes,
                         int64_t *rows, const int32_t **recv_splits, int64_t *value);

/* kolo_release frees a finished operation's handle and result. */
KOLO_API int kolo_release(kolo_ctx *ctx, kolo_handle handle);

/* ================================================================ GPU
 *
 * GPU tensors (the NCCL backend; docs/gpu.md). A request whose device is
 * a CUDA device ordinal (>= 0) takes device pointers. kolo, like Horovod,
 * runs one GPU per process: every GPU request of a context names the same
 * device. CUDA and NCCL are loaded at run time, when the first GPU
 * request is submitted; a build without the CUDA/NCCL headers, or a host
 * without a GPU, refuses such a request at submit with KOLO_ENOTSUP and
 * the reason in kolo_last_error, never a crash. Host pointers in a GPU
 * request (and device pointers of another GPU) fail with KOLO_EINVAL.
 *
 * Ordering: the operation starts on the GPU after the work queued so far
 * on the stream passed to kolo_submit_stream (kolo_submit uses the
 * device's default stream), without blocking the host. It is complete -
 * outputs written - when kolo_wait returns 0. Outputs held by the library
 * (allgather, alltoall) are device memory: kolo_result's data is a device
 * pointer; copy it with kolo_result_copy.
 */

/* kolo_submit_stream is kolo_submit for GPU requests produced on stream
 * (a cudaStream_t; NULL: the legacy default stream). Host requests
 * ignore the stream. */
KOLO_API int kolo_submit_stream(kolo_ctx *ctx, const kolo_request *reqs, int n, void *stream,
                                kolo_handle *handles);

/* kolo_result_copy copies a finished operation's output held by the
 * library (kolo_result's bytes) to dst: for a GPU operation, device (or
 * host) memory, queued on stream (a cudaStream_t) - and the library frees
 * the output on that stream at kolo_release, after the copy; for a host
 * operation a plain memcpy (stream ignored). */
KOLO_API int kolo_result_copy(kolo_ctx *ctx, kolo_handle handle, void *dst, void *stream);

/* kolo_nccl_built returns the NCCL version the GPU backend was built
 * against (NCCL_VERSION_CODE, e.g. 22809), 0 if it was not built;
 * kolo_cuda_built the CUDA runtime version (CUDART_VERSION), 0 if not. */
KOLO_API int kolo_nccl_built(void);
KOLO_API int kolo_cuda_built(void);

/* kolo_gpu_count loads the CUDA runtime and NCCL (once per process) and
 * returns the number of GPUs this process can use; 0 with the reason in
 * why (why may be NULL) if the backend, the libraries or a GPU are
 * missing. */
KOLO_API int kolo_gpu_count(char *why, size_t len);

/* ---------------------------------------------------------------- snapshots
 *
 * Durable elastic-state snapshots (what state.commit() makes durable in
 * kolo.torch.elastic): an opaque blob plus a JSON object of metadata,
 * kept by the coordinator in its store, the newest few per job (the
 * coordinator's --snapshot-keep, 3 by default; KOLO_SNAPSHOT_KEEP in a
 * worker's environment sets it for its job). These calls use their own
 * connection to the coordinator, not the background thread's, and may run
 * in any thread while collectives go on; several may run at once. They
 * retry across coordinator restarts until their timeout (timeout_ms <= 0:
 * 5 minutes). A call in flight when kolo_fini starts fails with
 * KOLO_ESHUTDOWN; a context without a coordinator (kolo_solo) has no
 * snapshots (KOLO_ENOTSUP). Errors have their detail in
 * kolo_last_error(ctx).
 */

/*
 * kolo_snapshot_put uploads len bytes of data and meta_json (a JSON
 * object as text, at most 64 KiB; NULL or "" for none) as a snapshot of
 * this job and returns once the coordinator acknowledged it: it is then
 * durable, and survives a crash of the coordinator. *snapshot_id (may be
 * NULL) gets its id, increasing with every commit. Only the job's current
 * generation may commit (KOLO_ESTALE otherwise); KOLO_ETOOBIG when the
 * snapshot exceeds the coordinator's --snapshot-max-bytes (2 GiB by
 * default); KOLO_ETIMEDOUT when no acknowledgement came in time (the
 * snapshot may or may not have been stored). data is read, never kept.
 */
KOLO_API int kolo_snapshot_put(kolo_ctx *ctx, const void *data, size_t len, const char *meta_json,
                               int timeout_ms, uint64_t *snapshot_id);

/*
 * kolo_snapshot_get reads the job's snapshot snapshot_id (0: the latest
 * acknowledged one) into *data and *len, its metadata into *meta_json
 * (may be NULL) and its id into *id_out (may be NULL); free both with
 * kolo_snapshot_free. Any rank of the job may read, whatever its
 * generation. The bytes are checked against the checksum the snapshot was
 * committed with. KOLO_ENOTFOUND when the job has no snapshot (or none
 * with that id: never committed, or pruned).
 */
KOLO_API int kolo_snapshot_get(kolo_ctx *ctx, uint64_t snapshot_id, void **data, size_t *len,
                               char **meta_json, uint64_t *id_out, int timeout_ms);

/* kolo_snapshot_get_latest is kolo_snapshot_get of the latest snapshot. */
KOLO_API int kolo_snapshot_get_latest(kolo_ctx *ctx, void **data, size_t *len, char **meta_json,
                                      uint64_t *snapshot_id, int timeout_ms);

/* kolo_snapshot_free frees what kolo_snapshot_get returned. NULL is
 * accepted. */
KOLO_API void kolo_snapshot_free(void *p);

/* kolo_snapshot_cancel ends the snapshot calls running on ctx (they fail
 * with KOLO_ESHUTDOWN) and refuses new ones, and returns once none runs.
 * A binding calls it before kolo_fini when other threads may start
 * snapshot calls on ctx, so that none can start while ctx is freed. */
KOLO_API int kolo_snapshot_cancel(kolo_ctx *ctx);

/* ---------------------------------------------------------------- reports
 * (issue 6: epoch and step reporting; begin)
 *
 * Training progress for the coordinator's dashboard and REST API: epoch
 * boundaries and step times. The calls never block and never fail
 * training: they append to a bounded queue in the context, and a sender
 * thread (started on the first report, with its own coordinator
 * connection) sends the queue at most every 500 ms, and once more, within
 * 2 s, when kolo_fini starts. A report that finds the queue full, or that
 * the coordinator refuses (a stale generation, a job that ended), is
 * dropped and counted (kolo_report_dropped). A context without a
 * coordinator accepts reports and drops them silently. Times are the
 * worker's wall clock.
 */

/*
 * kolo_report_epoch records a boundary of epoch (>= 0) now: phase 0 its
 * start, phase 1 its end, with samples (>= 0) this rank processed in it
 * and metrics_json (a JSON object as text, at most 4 KiB, e.g.
 * {"loss":0.23}; NULL or "" for none). An end without a start for the same
 * epoch takes as its start the previous end reported on this context, and
 * is without a start (0) if there was none. KOLO_EINVAL for a bad
 * argument, KOLO_ETOOBIG for metrics that are too long, KOLO_EBUSY when
 * the queue is full (the report is dropped).
 */
KOLO_API int kolo_report_epoch(kolo_ctx *ctx, int64_t epoch, int phase, int64_t samples,
                               const char *metrics_json);

/*
 * kolo_report_epoch_span records a whole epoch at once: it ran on this
 * rank from start_ms to end_ms (wall-clock ms since the Unix epoch,
 * start_ms <= end_ms; start_ms 0: unknown). This is what a binding uses
 * when it takes an epoch's start as the previous epoch's end or its own
 * init time (kolo.report_epoch). Errors as kolo_report_epoch.
 */
KOLO_API int kolo_report_epoch_span(kolo_ctx *ctx, int64_t epoch, uint64_t start_ms,
                                    uint64_t end_ms, int64_t samples, const char *metrics_json);

/*
 * kolo_report_step records that one training step of this rank took
 * seconds (>= 0, finite, below 10^6). Steps are aggregated per wall-clock
 * second before they are sent, so calling it every step is cheap (a lock
 * and a few additions). KOLO_EINVAL for a bad value, KOLO_EBUSY when the
 * queue is full (dropped).
 */
KOLO_API int kolo_report_step(kolo_ctx *ctx, double seconds);

/*
 * kolo_report_recovery records how this rank came back from an elastic
 * reset after a failure, as three durations of its own clock (ms): from
 * the collective that failed to kolo_init of the new generation
 * returning, from there to the state restored (its sync from rank 0), and
 * from there to the first training step done. Sent once with the next
 * report; the coordinator writes rank 0's into the job's job.recovered
 * event, with when it detected the failure and formed the generation.
 * The Python elastic wrapper (kolo.torch.elastic.run) calls it.
 */
KOLO_API int kolo_report_recovery(kolo_ctx *ctx, uint32_t told_to_formed_ms,
                                  uint32_t formed_to_restored_ms, uint32_t restored_to_step_ms);

/* kolo_report_dropped returns how many reports of ctx were dropped so far
 * (queue full, or refused by the coordinator). */
KOLO_API uint64_t kolo_report_dropped(const kolo_ctx *ctx);

/* (issue 6: end) */

#ifdef __cplusplus
}
#endif

#endif
