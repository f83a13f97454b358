/*
 * coord_report.h - training reports (domain): epochs, steps, ranks, stragglers.
 */
#ifndef KOLO_COORDINATOR_COORD_REPORT_H
#define KOLO_COORDINATOR_COORD_REPORT_H

#include "coord_model.h"

/* coord_report.c (issue 6): WorkerService.Report, AdminService.GetEpochs;
 * the queries below serve REST /epochs, /steps, /ranks of a job
 * (coord_http_report.c renders them). */
void coord_rpc_report(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_report_render_metrics(struct coord *c, struct buf *b);
/* Stores the step rows that wait for the next group commit: the tick calls
 * coord_report_cron, readers and the shutdown call coord_report_flush. */
void coord_report_cron(struct coord *c, uint64_t now);
/* coord_dp_rejected_add counts n data-plane refusals a rank reported. */
void coord_dp_rejected_add(struct coord *c, const char *reason, uint64_t n);
void coord_report_flush(struct coord *c);
void coord_report_free(struct coord *c);

/* coord_report.c: slow[r] = rank r is a straggler given every rank's lag
 * (seconds): at least 20 ms, and at least 3x the median of the others'. */
void coord_straggler_flags(const double *lag_s, int n, bool *slow);

/* ---- queries (read-only; under the state lock) ---- */

/* One rank's report of one epoch, as stored. */
struct ep_row {
    uint64_t generation;
    int rank;
    int64_t epoch;
    uint64_t start_ms, end_ms;
    int64_t samples;
    char *metrics; /* NULL: none */
};

struct ep_rows {
    struct ep_row *v;
    size_t n, cap;
    bool oom;
};

/* One derived epoch: rows[first, first + count) of the generation used. */
struct ep_sum {
    int64_t epoch;
    uint64_t generation;
    uint64_t start_ms, end_ms;
    double wall_s; /* NAN: unknown */
    int64_t samples;
    double samples_per_s; /* NAN: unknown */
    int reported, expected;
    bool complete;
    /* elastic resets that cut it: generations formed after the previous
     * epoch's end and before its end (its wall time counts from the last) */
    int resets;
    const char *metrics; /* rank 0's, else the lowest rank's; NULL: none */
    size_t first, count;
};

/* coord_report_epochs derives the job's epochs from its rows, which it
 * reads into rs (sorted by epoch, generation, rank; free it with
 * coord_report_rows_free, also on failure); *out is malloc'd. 0, or
 * KOLO_ENOMEM / KOLO_ESTORE. */
int coord_report_epochs(struct coord *c, const struct job *j, struct ep_rows *rs,
                        struct ep_sum **out, size_t *nout);
void coord_report_rows_free(struct ep_rows *rs);
/* The epoch's ranks' metrics, each parsed once: coord_report_metrics
 * fills m (free with coord_report_metrics_free); coord_report_mean is the
 * mean over the ranks that reported the numeric metric key, or NAN when
 * none did. */
struct json;
struct ep_metrics {
    struct json **v;
    size_t n;
};
void coord_report_metrics(const struct ep_rows *rs, const struct ep_sum *s, struct ep_metrics *m);
void coord_report_metrics_free(struct ep_metrics *m);
double coord_report_mean(const struct ep_metrics *m, const char *key);

/* The single-worker baseline of j: the newest other job that ran the same
 * command (argv) on one worker and reported complete epochs. Its median
 * samples/s (the first epoch left out when there are more, as a warm-up),
 * or NAN when there is none; *id is the baseline job. */
double coord_report_baseline(struct coord *c, const struct job *j, uint64_t *id);

/* Step-time rows of a job, bucketed by the caller's bucket_ms, sorted by
 * host, bucket, seconds. */
struct step_row {
    char host[64];
    uint64_t bucket_ms;
    double seconds;
    uint32_t n;
    int rank;
};

struct step_rows {
    struct step_row *v;
    size_t n, cap;
    uint64_t bucket_ms;
    bool oom;
};
/* coord_report_steps reads the job's rows since since_ms (those waiting
 * for the group commit too) into sr (free sr->v); 0, or KOLO_ENOMEM /
 * KOLO_ESTORE. */
int coord_report_steps(struct coord *c, const struct job *j, uint64_t since_ms,
                       struct step_rows *sr);

/* coord_report_stragglers fills lag[] (seconds) and slow[] for the job's
 * current ranks (nranks entries each); false when nothing is known yet. */
bool coord_report_stragglers(const struct job *j, double *lag, bool *slow);

/* A rank as kolo top and REST /ranks show it. */
struct rank_cost {
    double step_s; /* its latest step time, NAN unknown */
    double lag_s;  /* how long the others wait for it, NAN unknown */
    double cost;   /* (lag - the median lag) / the median step time, NAN unknown */
    bool straggler;
};
/* coord_report_rank_costs fills v[j->nranks]; returns the ranks' median
 * latest step time (NAN unknown). */
double coord_report_rank_costs(struct coord *c, const struct job *j, struct rank_cost *v);

/* --straggler-policy, every second of a running job: a host whose ranks
 * cost the job at least STRAGGLER_COST for its window gets an event
 * (job.straggler, printed by kolo run) and, with exclude, is drained from
 * the job (coord_elastic_exclude_straggler). */
void coord_report_straggler_cron(struct coord *c, struct job *j, uint64_t now);

/* What the coordinator keeps in memory of a rank that reports: its last
 * step and epoch; NULL when it reported nothing. */
struct report_rank {
    uint64_t step_ms; /* the second of the last step row, 0: none */
    double step_s;
    uint32_t step_n;
    int64_t epoch; /* the last epoch whose end it reported, -1: none */
    /* its clock: the coordinator's CLOCK_MONOTONIC minus the rank's, from
     * its reports' round trips (common/clock_offset.h) */
    bool clock_known;
    int64_t clock_offset_us;
    uint64_t clock_rtt_us;
    /* where its time goes (proto TimeSplit), its windows' µs with each
     * older one counted half as much as the next: split_wall 0: unknown */
    double split_wall, split_wait, split_data, split_overlap;
};
/* A rank's time shares from its report windows (0..1; compute + wait +
 * data = 1, overlap is part of compute). false: it reported none. */
struct time_shares {
    double compute, wait, data, overlap;
};
bool coord_report_time_shares(const struct report_rank *rr, struct time_shares *s);
const struct report_rank *coord_report_rank(struct coord *c, uint64_t job_id, int rank);

#endif
