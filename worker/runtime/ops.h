/*
 * ops.h - operations: handles, the submit queue, the response cache's
 * names, kolo_submit and kolo_wait (ops.c).
 */
#ifndef KOLO_WORKER_OPS_H
#define KOLO_WORKER_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "ctx_model.h"

/* ops.c (caller holds mu unless noted) */
/* request_elems: the number of elements of r's tensor (product of its shape). */
int64_t request_elems(const kolo_request *r);
/* op_queue_push appends op to the singly linked list head..tail (op->next). */
void op_queue_push(struct op **head, struct op **tail, struct op *op);
/* op_queue_pop takes the first op off head..tail (NULL when empty). */
struct op *op_queue_pop(struct op **head, struct op **tail);
struct op *ops_lookup(struct kolo_ctx *c, kolo_handle h);
/* ops_finished: the op of handle h once it has finished (and, ok, with
 * success), else NULL with *rv the reason: KOLO_ENOTFOUND, KOLO_ESTATE
 * (recorded as the last error) or its failure (mu held). */
struct op *ops_finished(struct kolo_ctx *c, kolo_handle h, bool ok, int *rv);
struct op *ops_by_name(struct kolo_ctx *c, const char *name);
void ops_complete(struct kolo_ctx *c, struct op *op, int status, const char *error);
void ops_fail_all(struct kolo_ctx *c, int status, const char *error);
/* Queues op for the coordinator (mu held; the caller sends the queue). */
void ops_queue_slow(struct kolo_ctx *c, struct op *op);
void ops_free_all(struct kolo_ctx *c);
uint32_t ops_cache_lookup(struct kolo_ctx *c, const struct op *op);
void ops_cache_put(struct kolo_ctx *c, const struct op *op, uint32_t id);
/* ops_cache_clear forgets every cache id (the coordinator lost its cache). */
void ops_cache_clear(struct kolo_ctx *c);
/* ops_cache_id_of: the id name is cached under, whatever its signature (0: none). */
uint32_t ops_cache_id_of(struct kolo_ctx *c, const char *name);
/* ops_cache_forget_id drops the signature cached under id. */
void ops_cache_forget_id(struct kolo_ctx *c, uint32_t id);
/* ops_cache_name_of: the name cached under id, NULL if none. */
const char *ops_cache_name_of(struct kolo_ctx *c, uint32_t id);

/* ops.c: kolo_submit with the stream GPU requests wait on (nccl_exec.h) */
int ops_submit(struct kolo_ctx *c, const kolo_request *reqs, int n, void *stream,
               kolo_handle *handles);

/* ops_done_since: when the ops this thread ran since `since` ended (its
 * last ops_finish, before their waiters could submit anything else), for
 * the timeline's spans (fastpath.c, ctx.c); now if it finished none since
 * then (a GPU op of the coordinator's log, which its finaliser completes
 * on its own thread: the time its launch returned; the rounds' GPU ops
 * carry their span to ops_complete instead). */
uint64_t ops_done_since(uint64_t since);
/* ops_finish: an executor (exec.c, nccl_exec.c, a round) completes
 * ops[0..n) with rc (recording cache ids on success); a failure becomes
 * the context's sticky error. Takes mu. */
void ops_finish(struct kolo_ctx *c, struct op **ops, size_t n, int rc, const char *why,
                const uint32_t *cache_ids, size_t ncache);

#endif
