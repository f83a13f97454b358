/*
 * fastpath.h - readiness rounds among the ranks (fastpath.c).
 */
#ifndef KOLO_WORKER_FASTPATH_H
#define KOLO_WORKER_FASTPATH_H

#include <stdbool.h>

#include "ctx_model.h"

/* fastpath.c: readiness rounds among the ranks (docs/design.md) */
int fast_init(struct kolo_ctx *c);   /* after the data plane is up */
void fast_free(struct kolo_ctx *c);
/* fast_submit classifies a new op (mu held): true when the fast path took
 * it (a cached allreduce, or a barrier); false: it goes to the
 * coordinator, with op->cache_id set where the coordinator's cache path
 * applies (join mode). */
bool fast_submit(struct kolo_ctx *c, struct op *op);
/* fast_cache_reset: a log entry clears every rank's response cache (a
 * restarted coordinator found the ranks' tables in disagreement): ops
 * waiting under a cache id go to the coordinator in full (mu held). */
void fast_cache_reset(struct kolo_ctx *c);
/* fast_evict: a log entry gives cache id to name; if another name holds
 * it, that one leaves the cache and its pending op goes to the
 * coordinator in full (mu held; every rank runs the entry at the same
 * point). */
void fast_evict(struct kolo_ctx *c, uint32_t id, const char *name);
/* fast_try runs one round and its outcome if there is a reason to (mu
 * held; takes the executor token); false when there was nothing to do.
 * now_us: a now_mono_us() the caller took just before, or 0 (read here):
 * on the path of a small op every clock read counts. */
bool fast_try(struct kolo_ctx *c, uint64_t now_us);
/* fast_idle waits in the backend's idle_wait for up to ms (mu held,
 * released meanwhile), if no other thread does; false if it did not. */
bool fast_idle(struct kolo_ctx *c, int ms, bool spin);
/* fast_news: a local event worth a round (mu held). */
void fast_news(struct kolo_ctx *c);
/* fast_leave: kolo_fini's last round, which tells the peers this rank
 * leaves (ROUND_F_SHUTDOWN) so that their pending ops fail at once in
 * Horovod's words, the coordinator reachable or not (mu held; at most
 * ms, then the rank leaves without it). */
void fast_leave(struct kolo_ctx *c, int ms);

#endif
