/*
 * time_split.h - where a rank's time goes (issue 31): computing, waiting
 * for the other ranks, or moving data.
 *
 * Two facts change over time, each at a handful of places:
 *   blocked - a user thread waits in kolo_wait for an operation that is not
 *             done yet (ops.c);
 *   running - the data plane runs a collective on this rank (exec.c).
 * Every moment falls in one of four states; the clock adds the time since
 * the last change to the state's counter:
 *
 *              | not running     | running
 *   -----------+-----------------+---------------------------------------
 *   not blocked| compute         | overlap (data moves behind compute)
 *   blocked    | wait (others)   | data (the rank waits for its own bytes)
 *
 * compute, wait and data cover the window without gaps (wall); overlap is
 * part of compute. A blocked rank whose collective is agreed but not yet
 * running, or whose tiny operation completes inside the readiness round
 * that agrees it, counts as waiting: it waits for the others' readiness.
 *
 * Pure: no locks (the caller holds the context's mu), no clock (the caller
 * passes `now`, monotonic microseconds). tests/worker/test_time_split.c.
 */
#ifndef KOLO_WORKER_TIME_SPLIT_H
#define KOLO_WORKER_TIME_SPLIT_H

#include <stdbool.h>
#include <stdint.h>

struct time_split {
    uint64_t start_us; /* the window's start, 0: not started */
    uint64_t since_us; /* the last change */
    int blocked;       /* user threads waiting in kolo_wait */
    int running;       /* collectives running on the data plane */
    uint64_t wait_us, data_us, overlap_us;
};

/* One window's totals, as the report sends them (proto TimeSplit). */
struct time_split_window {
    uint64_t wall_us, wait_us, data_us, overlap_us; /* compute = wall - wait - data */
};

static inline void time_split_advance(struct time_split *t, uint64_t now)
{
    if (!t->start_us)
        t->start_us = t->since_us = now;
    if (now > t->since_us) {
        uint64_t d = now - t->since_us;
        if (t->blocked > 0 && t->running > 0)
            t->data_us += d;
        else if (t->blocked > 0)
            t->wait_us += d;
        else if (t->running > 0)
            t->overlap_us += d;
        t->since_us = now;
    }
}

/* A user thread starts (+1) or stops (-1) waiting. */
static inline void time_split_blocked(struct time_split *t, uint64_t now, int delta)
{
    time_split_advance(t, now);
    t->blocked += delta;
    if (t->blocked < 0)
        t->blocked = 0;
}

/* A collective starts (+1) or ends (-1) on the data plane. */
static inline void time_split_running(struct time_split *t, uint64_t now, int delta)
{
    time_split_advance(t, now);
    t->running += delta;
    if (t->running < 0)
        t->running = 0;
}

/* Closes the window at `now`, returns its totals and opens the next one
 * (the states carry over). false: nothing measured yet (w untouched, or
 * an empty window: wall_us 0). */
static inline bool time_split_take(struct time_split *t, uint64_t now,
                                   struct time_split_window *w)
{
    if (!t->start_us)
        return false;
    time_split_advance(t, now);
    w->wall_us = now - t->start_us;
    w->wait_us = t->wait_us;
    w->data_us = t->data_us;
    w->overlap_us = t->overlap_us;
    t->wait_us = t->data_us = t->overlap_us = 0;
    t->start_us = now;
    return w->wall_us > 0;
}

#endif
