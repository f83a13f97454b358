/*
 * coord_stacks.h - `kolo stacks` (domain): what every rank of a running
 * job is doing, taken by the agents of its hosts.
 */
#ifndef KOLO_COORDINATOR_COORD_STACKS_H
#define KOLO_COORDINATOR_COORD_STACKS_H

#include "coord_model.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "store.h"

/* AdminService.Stacks (asks the job's hosts through their heartbeats and
 * parks until they answered) and AgentService.Stacks (a host's answer). */
void coord_rpc_stacks(struct coord *c, struct rpc_call *call, enum coord_method m);
/* Takes the running job's stacks for a reason (a stall, a stop, a frozen
 * member) before anything is killed: kept with the job (SQLite), with a
 * verdict that kolo run prints (event stacks.taken). Joins a collection
 * in progress. */
void coord_stacks_take(struct coord *c, struct job *j, const char *reason);
/* The job ended: a collection asked by a user is answered now; one taken
 * for a reason runs on (the agents answer before they stop the workers). */
void coord_stacks_job_ended(struct coord *c, struct job *j);
/* The tick: a collection past its time is answered with what came. */
void coord_stacks_cron(struct coord *c, struct job *j, uint64_t now);
/* The job ended or the coordinator stops: parked calls are answered now. */
void coord_stacks_finish(struct coord *c, struct job *j);
void coord_stacks_free(struct job *j);
/* A StacksReply as JSON (kolo stacks -o json, REST): rank >= 0 that one. */
void coord_stacks_json(struct jw *w, uint64_t job_id, const Kolo__StacksReply *rep, int rank);
/* The job's kept stacks as a JSON array, newest first, at most limit;
 * how many, or a store error (< 0). */
int coord_stacks_kept_json(struct store *st, struct jw *w, uint64_t job_id, int limit);

#endif
