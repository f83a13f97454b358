/*
 * coord_core.h - the core's verbs (coord.c) every module uses: answering a call,
 * events, store failures, histograms.
 */
#ifndef KOLO_COORDINATOR_COORD_CORE_H
#define KOLO_COORDINATOR_COORD_CORE_H

#include "coord_model.h"

int coord_send_pb(struct rpc_call *call, const ProtobufCMessage *msg);
void coord_event(struct coord *c, uint64_t job_id, const char *host_id, const char *kind,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* coord_event_notice: whether a job's event of this kind is told to the
 * terminals that follow the job (StreamOutputRequest.notices: kolo run,
 * kolo attach): a stall, a worker lost or frozen, an elastic reset, a
 * host excluded, a wait for capacity. Starts, submissions and commits
 * are not. coord_event wakes the job's parked followers on one. */
bool coord_event_notice(const char *kind);
/* coord_store_failed marks the store degraded (refusing what cannot be
 * stored); coord_store_probe, from the tick, tries a small write every
 * STORE_PROBE_MS while it is, and ends the degraded state when it works. */
void coord_store_failed(struct coord *c, const char *what);
/* coord_store_failed_why: the same for a failure on another connection
 * (a writer's), whose message is why. */
void coord_store_failed_why(struct coord *c, const char *what, const char *why);
void coord_store_probe(struct coord *c, uint64_t now);

/* coord_read runs fn on the read-only store connection c->reader with
 * the state lock released, and returns what fn returns; the caller holds
 * the lock before and after. fn must not touch the coordinator's state:
 * it gets the store and arg only. coord_reader_open opens the connection
 * (at start), coord_reader_close waits for reads in flight and closes it
 * (state lock not held). */
int coord_read(struct coord *c, int (*fn)(struct store *st, void *arg), void *arg);
int coord_reader_open(struct coord *c, char *err, size_t errlen);
void coord_reader_close(struct coord *c);

void coord_hist_observe(struct coord_hist *h, double seconds);
/* coord_hist_observe_n: n observations of the same value. */
void coord_hist_observe_n(struct coord_hist *h, double seconds, uint64_t n);
void coord_hist_render(struct buf *b, const char *name, const char *help,
                       const struct coord_hist *h);

#endif
