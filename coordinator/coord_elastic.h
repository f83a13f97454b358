/*
 * coord_elastic.h - elastic jobs (domain): members, exclusions,
 * generations, host discovery. Their state (struct elastic) is part of
 * the job, in coord_model.h.
 */
#ifndef KOLO_COORDINATOR_COORD_ELASTIC_H
#define KOLO_COORDINATOR_COORD_ELASTIC_H

#include "coord_model.h"

/* coord_elastic.c */
int coord_elastic_init(struct job *j, const struct elastic_opts *o, char *err, size_t errlen);
/* coord_elastic_free frees el; place requests still parked in it are
 * answered (KOLO_ESHUTDOWN), so the RPC server must still be open. */
void coord_elastic_free(struct elastic *el);
/* coord_elastic_shutdown answers the job's parked place requests
 * (KOLO_EIO, COORD_STOPPING_WHY: the workers ask again) while the RPC
 * server that holds them is still open: the stop's drain, before it
 * closes. */
void coord_elastic_shutdown(struct coord *c, struct job *j);
bool coord_elastic_host_usable(struct coord *c, struct job *j, const struct host *h);
void coord_elastic_member_gone(struct coord *c, struct job *j, struct host *h, bool exclude,
                               enum elastic_cause cause, const char *why);
/* The hooks' spare_event (coord_model.h): a worker event about one of the
 * job's hot spares. */
bool coord_elastic_spare_event(struct coord *c, struct job *j, struct host *h, uint64_t wid,
                               int kind, int pid, int exit_code, int term_signal);
/* --straggler-policy exclude: h's members leave the job at their next
 * commit and h is excluded for its cooldown; false (nothing done) when
 * the job would fall below min_np or h runs none of its ranks. */
bool coord_elastic_exclude_straggler(struct coord *c, struct job *j, struct host *h,
                                     const char *why);
void coord_elastic_cron(struct coord *c, struct job *j, uint64_t now);
void coord_elastic_assign(struct coord *c, struct job *j, struct rpc_call *call, uint64_t wid,
                          uint32_t wait_ms);
void coord_elastic_job_ended(struct coord *c, struct job *j);
void coord_elastic_host_drained(struct coord *c, struct host *h);
int coord_elastic_free_slots(struct coord *c, struct job *j, struct host *h);
/* The discovery thread: runs every elastic job's host discovery script once
 * a second, outside the state lock. */
int coord_discovery_start(struct coord *c);
void coord_discovery_stop(struct coord *c);
char *coord_elastic_to_json(const struct job *j);
void coord_elastic_from_json(struct job *j, const char *text);

#endif
