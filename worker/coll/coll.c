/*
 * coll.c - what every collective backend shares: the note of whom a rank
 * sleeps on (coll.h, struct coll), which libkolo's watch thread turns
 * into "waiting on rank j since T", and the reduction of a round's
 * payload.
 */
#include "coll.h"

#include "reduce.h"
#include "util.h"

_Thread_local bool coll_thread_idle;

void coll_waiting(struct coll *c, int peer)
{
    /* the start time stays while it is the same peer: one long wait in
     * many short sleeps is still one wait */
    if (atomic_load_explicit(&c->waiting_on, memory_order_relaxed) == peer + 1)
        return;
    atomic_store_explicit(&c->waiting_since_ms, now_mono_ms(), memory_order_relaxed);
    atomic_store_explicit(&c->waiting_on, peer + 1, memory_order_release);
}

void coll_round_pay(uint32_t dtype, uint32_t op, void *dst, const void *src, size_t count)
{
    reduce_into((kolo_dtype)dtype, (kolo_op)op, dst, src, count);
}
