/*
 * coord_negot.h - rendezvous and negotiation of a job's generations (domain).
 */
#ifndef KOLO_COORDINATOR_COORD_NEGOT_H
#define KOLO_COORDINATOR_COORD_NEGOT_H

#include "coord_model.h"

struct negot;
/* WorkerService.Timeline: start or stop the job's timeline at run time. */
void coord_rpc_timeline(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_rpc_worker(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_negot_job_ended(struct coord *c, struct job *j, int code, const char *why);
void coord_negot_cron(struct coord *c, struct job *j, uint64_t now);
void coord_negot_drop_parked(struct coord *c, struct job *j);
void coord_negot_free(struct negot *n);
void coord_negot_free_job(struct job *j); /* j->negot and its process sets' */
/* A tensor some ranks submitted and others not yet (REST /stalls):
 * coord_negot_stalls fills at most max of the job's that have waited
 * min_age_ms or more, oldest first, and returns how many there are (call
 * it with max 0 to size out). They point into the negotiation: valid
 * while the state lock is held. */
struct negot_stall {
    const char *name;
    uint64_t waiting_ms;
    int submitted; /* ranks that did */
    int size;      /* ranks in all */
    const void *const *reqs;
    const bool *rank_joined;
};
size_t coord_negot_stalls(const struct job *j, uint64_t min_age_ms, struct negot_stall *out,
                          size_t max);
/* Whether rank has yet to submit the stalled tensor (a joined rank has
 * not: Join stands in for it). */
bool coord_negot_stall_missing(const struct negot_stall *s, int rank);

/* The job's elastic state announced a membership update (el->update_ms):
 * the ranks' parked calls hear it now; every later reply carries it. */
void coord_negot_hosts_updated(struct coord *c, struct job *j);
bool coord_negot_rank_joined(const struct job *j, int rank);
/* Each rank's moving average of how late (seconds) its requests come in
 * after the first rank's, for the current generation: fills up to max
 * entries, returns how many (0 before the rendezvous completes). */
int coord_negot_lags(const struct job *j, double *lag_s, int max);
/* Readiness rounds' telemetry from one rank (coord_report.c): its moving
 * average wait per agreed op, which the lags use once any rank sent one. */
void coord_negot_round_wait(struct job *j, int rank, double wait_avg_s);

#endif
