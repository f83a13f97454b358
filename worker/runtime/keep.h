/*
 * keep.h - a host's shared segment kept from one elastic generation to
 * the next (issue 29, item 6).
 *
 * At an elastic reset the survivors leave their generation (kolo_fini)
 * and join the next one (kolo_init) in the same process. A host whose
 * ranks are the same processes, in the same order, needs no new segment:
 * each rank parks its mapping when it leaves (coll_ops.keep_segment,
 * keep_park) and tells the next rendezvous which one it holds
 * (keep_code). The reply carries every rank's code, and every member of
 * a host applies keep_plan to the same codes, so all of them decide
 * alike:
 *   KEEP_NONE   the host's leader made a new segment before the
 *               rendezvous (it kept none that fits): as at a first
 *               generation;
 *   KEEP_REUSE  every member holds the leader's kept segment at its own
 *               member index, and the host has as many members as it:
 *               they re-arm it (shmcoll_rearm) instead of making, zeroing,
 *               faulting in and attaching a new one;
 *   KEEP_FRESH  the leader kept one and so made none, but the host cannot
 *               reuse it (a new member, another order): the leader makes
 *               one now, under a name every member derives from the
 *               generation's key (shm_names_derive).
 * A parked segment belongs to the (job, elastic worker) that parked it;
 * one that is not taken stays mapped until the next kolo_init or the
 * process's exit (its name is gone from /dev/shm since its first
 * generation).
 */
#ifndef KOLO_WORKER_KEEP_H
#define KOLO_WORKER_KEEP_H

#include <stdint.h>

#include "coll.h"

enum keep_plan { KEEP_NONE, KEEP_REUSE, KEEP_FRESH };

/* The segment name a leader that kept one (and so made none) reports:
 * its host makes one after the rendezvous unless it re-arms the kept one,
 * also when the coordinator relays no codes (an older one). */
#define KEEP_DEFERRED "(kept)"

/* keep_park takes seg (a parked shmcoll) for this worker of job; a
 * segment parked before by the same worker, or by any worker of another
 * job, is destroyed. */
void keep_park(uint64_t job, uint64_t worker, struct coll *seg);
/* keep_take hands back the segment this worker parked (NULL: none); the
 * caller owns it. */
struct coll *keep_take(uint64_t job, uint64_t worker);
/* keep_code: what a rank holding seg reports, never 0 (the segment's
 * identity in the high bits, the rank's member index in the low 12). */
uint64_t keep_code(const struct coll *seg);
/* keep_plan: codes[i] is what member i of a host of n reported (in local
 * order; codes[0] is the leader's, non-zero only if it made no segment);
 * held_size the size of the segment this rank holds (0: none). */
enum keep_plan keep_plan(const uint64_t *codes, int n, int held_size);

#endif
