/*
 * nccl_exec.h - what the rest of libkolo calls of the GPU backend.
 *
 * The backend (nccl_exec.c, nccl_coll.c, nccl_load.c) is compiled in when
 * CMake found the CUDA and NCCL headers; without them these functions are
 * stubs that refuse GPU tensors with a clear error. Either way nothing
 * here touches CUDA until a request names a device (device >= 0), so a
 * CPU-only job never loads the CUDA runtime.
 *
 * Life of a GPU operation:
 *   submit (user thread, mu held): gpu_validate checks the device and
 *     the pointers; gpu_op_attach records an event on the caller's stream
 *     - the point after which the tensor's producer is done.
 *   execute (the executor, mu not held): the first GPU response of a
 *     context sets the backend up (collectively, see nccl_exec.c); every
 *     GPU response makes the backend's stream wait for the ops' events,
 *     queues copies, kernels and NCCL calls, records a completion event
 *     and hands it to the finaliser thread - the executor never waits for
 *     the GPU on this path.
 *   complete (finaliser): when the event fires, the operations complete
 *     (results attached, cache ids recorded), or fail if NCCL reported an
 *     error or the deadline passed; a failure aborts the communicator.
 */
#ifndef KOLO_WORKER_NCCL_EXEC_H
#define KOLO_WORKER_NCCL_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "kolo.h"
#include "kolo.pb-c.h"

struct kolo_ctx;
struct op;

/* Submit-time checks for a request with device >= 0 (mu held): the
 * backend is built, the CUDA runtime and NCCL load, the device exists,
 * it is this context's device (one GPU per process, as in Horovod), and
 * the buffers are device memory on it. 0, or a code with the reason in
 * c->last_error. */
int gpu_validate(struct kolo_ctx *c, const kolo_request *r);

/* Records op's producer event on stream (a cudaStream_t, NULL for the
 * device's default stream) (mu held). A JOIN op just remembers its
 * device: the zeros it contributes live there. */
int gpu_op_attach(struct kolo_ctx *c, struct op *op, void *stream);

/* True if response r (whose local ops are ops[0..k)) runs on the GPU:
 * its ops name a device, or this rank joined with a device and has no
 * op of its own in it. */
bool gpu_response_is_gpu(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops, size_t k);

/* Executes a GPU response (executor thread, mu not held). */
void gpu_exec_response(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops,
                       uint64_t deadline);

/* Frees what an op holds on the GPU (its event, a device result). */
void gpu_op_free(struct op *op);

/* Tears the backend down (ctx_free, after the background thread
 * stopped): aborts the communicators - never ncclCommDestroy, which may
 * wait for peers that are gone - stops the finaliser, frees buffers. */
void gpu_ctx_fini(struct kolo_ctx *c);

#endif
