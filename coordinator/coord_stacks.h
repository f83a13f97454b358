/*
 * coord_stacks.h - `kolo stacks` (domain): what every rank of a running
 * job is doing, taken by the agents of its hosts.
 */
#ifndef KOLO_COORDINATOR_COORD_STACKS_H
#define KOLO_COORDINATOR_COORD_STACKS_H

#include "coord_model.h"

/* AdminService.Stacks (asks the job's hosts through their heartbeats and
 * parks until they answered) and AgentService.Stacks (a host's answer). */
void coord_rpc_stacks(struct coord *c, struct rpc_call *call, enum coord_method m);
/* The tick: a collection past its time is answered with what came. */
void coord_stacks_cron(struct coord *c, struct job *j, uint64_t now);
/* The job ended or the coordinator stops: parked calls are answered now. */
void coord_stacks_finish(struct coord *c, struct job *j);
void coord_stacks_free(struct job *j);

#endif
