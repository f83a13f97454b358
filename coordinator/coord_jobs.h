/*
 * coord_jobs.h - jobs and their ranks (core): submit, place, stop, worker events,
 * output streams.
 */
#ifndef KOLO_COORDINATOR_COORD_JOBS_H
#define KOLO_COORDINATOR_COORD_JOBS_H

#include "coord_model.h"

struct job *coord_job_find(struct coord *c, uint64_t id);
const char *coord_job_state_name(enum job_state s);
const char *coord_rank_state_name(enum rank_state s);
/* coord_job_submit checks and stores a job; 0 with *job_id, or KOLO_EINVAL
 * (err says why), KOLO_ENOMEM, KOLO_ESTORE. */
int coord_job_submit(struct coord *c, const struct job_request *rq, uint64_t *job_id, char *err,
                     size_t errlen);
/* The value of a job's metadata key, or NULL. */
const char *coord_job_meta(const struct job *j, const char *key);
int coord_job_stop(struct coord *c, struct job *j, const char *reason);
int coord_job_ranks_alive(const struct job *j);
void coord_jobs_place_pending(struct coord *c);
void coord_jobs_cron(struct coord *c, uint64_t now);
void coord_jobs_host_lost(struct coord *c, struct host *h, const char *why);
void coord_job_worker_event(struct coord *c, struct host *h, uint64_t job_id, uint64_t gen,
                            int rank, uint64_t wid, int kind, int pid, int exit_code,
                            int term_signal, const char *message);
void coord_job_output_added(struct coord *c, struct job *j);
int coord_job_desired_for_host(struct coord *c, struct host *h, void ***specs, size_t *n);
void coord_job_desired_free(void **specs, size_t n);
/* coord_worker_fence is the check every worker request passes: the job
 * runs, the caller's generation is the current one, its rank exists. On
 * failure the call is answered (and counted against m) and NULL returned. */
struct job *coord_worker_fence(struct coord *c, struct rpc_call *call, enum coord_method m);
/* As coord_worker_fence, but a caller of an earlier generation passes too,
 * with *past set: what a rank reported about that generation's work (its
 * last epoch, sent as a reset closed it) still counts. */
struct job *coord_worker_fence_past(struct coord *c, struct rpc_call *call, enum coord_method m,
                                    bool *past);
void coord_rpc_admin(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_jobs_shutdown(struct coord *c);
void coord_jobs_free(struct coord *c);
int coord_jobs_load(struct coord *c);

void coord_job_finish(struct coord *c, struct job *j, enum job_state state, int exit_code,
                      const char *reason);
void coord_job_persist(struct coord *c, struct job *j);
void coord_job_hosts_wake(struct coord *c, struct job *j);
int coord_job_member(const struct job *j, uint64_t wid);
/* coord_rank_error_line: the error a rank's last stderr lines name (the
 * newest "SomeError: text" line, as a Python traceback ends), "" none. */
void coord_rank_error_line(struct coord *c, const struct job *j, int rank, char *out, size_t len);

#endif
