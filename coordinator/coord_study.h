/*
 * coord_study.h - hyperparameter studies (domain, issue 18).
 *
 * A trial of `kolo tune` is a job labelled with metadata: kolo.study (the
 * study's name), kolo.trial (its number), kolo.params (its parameters, a
 * JSON object), kolo.metric and kolo.mode (what the search optimises). A
 * study is the jobs that share a kolo.study; its trials' values come from
 * their epoch reports (the metric's mean over the ranks), so the
 * coordinator shows a search without knowing the sampler that drives it.
 * The api layer renders these queries as REST /studies and the dashboard.
 */
#ifndef KOLO_COORDINATOR_COORD_STUDY_H
#define KOLO_COORDINATOR_COORD_STUDY_H

#include "coord_model.h"

#define STUDY_META_NAME   "kolo.study"
#define STUDY_META_TRIAL  "kolo.trial"
#define STUDY_META_PARAMS "kolo.params"
#define STUDY_META_METRIC "kolo.metric"
#define STUDY_META_MODE   "kolo.mode"
/* A trial stopped with a reason that starts with this was pruned. */
#define STUDY_PRUNED_REASON "pruned"
#define STUDY_NAME_MAX      128 /* bytes; %-encoded it fits a REST path */

enum trial_state {
    TRIAL_PENDING,
    TRIAL_RUNNING,
    TRIAL_COMPLETE, /* the job succeeded and reported the metric */
    TRIAL_PRUNED,   /* stopped by the search (STUDY_PRUNED_REASON) */
    TRIAL_FAILED,   /* failed, or succeeded without reporting the metric */
    TRIAL_STOPPED,  /* stopped otherwise (the search was interrupted) */
};

/* One complete epoch of a trial: the metric's mean over its ranks. */
struct study_point {
    int64_t epoch;
    double value;
    uint64_t end_ms;
};

struct study_trial {
    const struct job *job;
    int64_t number; /* kolo.trial; -1 when absent */
    enum trial_state state;
    const char *params; /* kolo.params (JSON object text), or NULL */
    struct study_point *curve;
    size_t ncurve;
    double value; /* the last complete epoch's metric; NAN: none */
    double best;  /* the best epoch's metric; NAN: none */
};

/* Each time a complete trial improved on the best, in the order trials
 * ended: (when, its value, which trial). */
struct study_best {
    uint64_t ts_ms;
    double value;
    size_t trial; /* index in study.trials */
};

struct study {
    const char *name;
    const char *metric; /* the newest trial's kolo.metric ("loss" when none says) */
    bool maximize;      /* kolo.mode is "max" */
    struct study_trial *trials; /* by trial number, then job id */
    size_t n;
    long best; /* index of the best complete trial, -1: none yet */
    struct study_best *best_so_far;
    size_t nbest;
    int counts[TRIAL_STOPPED + 1]; /* trials per state */
    uint64_t first_ms; /* the first trial's submission */
    uint64_t last_ms;  /* the newest trial's end (0 while one runs) */
};

/* coord_study_get fills s with the study of that name (free it with
 * coord_study_free, also on failure): 0, KOLO_ENOTFOUND, KOLO_ENOMEM or
 * KOLO_ESTORE. Under the state lock. */
int coord_study_get(struct coord *c, const char *name, struct study *s);
void coord_study_free(struct study *s);
/* coord_study_names sets *names (malloc'd; the strings are the jobs') to
 * every study's name, newest first; 0 or KOLO_ENOMEM. */
int coord_study_names(struct coord *c, const char ***names, size_t *n);
const char *coord_trial_state_name(enum trial_state s);

#endif
