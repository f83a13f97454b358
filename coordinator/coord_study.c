/*
 * coord_study.c - hyperparameter studies (domain, issue 18): the jobs
 * labelled kolo.study=NAME and their epoch reports, as coord_study.h
 * describes. Everything is derived on each read from the jobs (in memory)
 * and the epochs (SQLite): a study has no state of its own to keep or to
 * lose in a restart.
 */
#include "coord_study.h"
#include "coord_jobs.h"
#include "coord_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "util.h"

static const char *const trial_state_names[] = {"pending", "running", "complete",
                                                "pruned",  "failed",  "stopped"};

const char *coord_trial_state_name(enum trial_state s)
{
    return trial_state_names[s];
}

void coord_study_free(struct study *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->trials[i].curve);
    free(s->trials);
    free(s->best_so_far);
    memset(s, 0, sizeof *s);
}

static bool better(const struct study *s, double a, double b)
{
    return isnan(b) || (s->maximize ? a > b : a < b);
}

/* The trial's metric per complete epoch (curve, value, best). */
static int trial_curve(struct coord *c, const struct study *s, struct study_trial *t)
{
    struct ep_rows rs = {0};
    struct ep_sum *sums = NULL;
    size_t n = 0;
    int rc = coord_report_epochs(c, t->job, &rs, &sums, &n);
    if (!rc && n) {
        t->curve = calloc(n, sizeof *t->curve);
        if (!t->curve)
            rc = KOLO_ENOMEM;
    }
    for (size_t i = 0; !rc && i < n; i++) {
        if (!sums[i].complete)
            continue;
        struct ep_metrics m;
        coord_report_metrics(&rs, &sums[i], &m);
        double v = coord_report_mean(&m, s->metric);
        coord_report_metrics_free(&m);
        if (isnan(v))
            continue;
        t->curve[t->ncurve++] =
            (struct study_point){.epoch = sums[i].epoch, .value = v, .end_ms = sums[i].end_ms};
        t->value = v;
        if (better(s, v, t->best))
            t->best = v;
    }
    free(sums);
    coord_report_rows_free(&rs);
    return rc;
}

static enum trial_state trial_state_of(const struct job *j, double value)
{
    switch (j->state) {
    case JOB_PENDING:
        return TRIAL_PENDING;
    case JOB_RUNNING:
        return TRIAL_RUNNING;
    case JOB_SUCCEEDED:
        return isnan(value) ? TRIAL_FAILED : TRIAL_COMPLETE;
    case JOB_STOPPED:
        return j->reason && strncmp(j->reason, STUDY_PRUNED_REASON,
                                    strlen(STUDY_PRUNED_REASON)) == 0
                   ? TRIAL_PRUNED
                   : TRIAL_STOPPED;
    case JOB_FAILED:
        break;
    }
    return TRIAL_FAILED;
}

static int by_number(const void *a, const void *b)
{
    const struct study_trial *x = a, *y = b;
    if (x->number != y->number)
        return x->number < y->number ? -1 : 1;
    return x->job->id < y->job->id ? -1 : x->job->id > y->job->id;
}

static int by_end(const void *a, const void *b)
{
    const struct study_best *x = a, *y = b;
    return x->ts_ms < y->ts_ms ? -1 : x->ts_ms > y->ts_ms;
}

/* best_so_far: the complete trials in the order they ended, keeping each
 * that beat every one before it. */
static int best_curve(struct study *s)
{
    struct study_best *v = calloc(s->n ? s->n : 1, sizeof *v);
    if (!v)
        return KOLO_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->trials[i].state == TRIAL_COMPLETE)
            v[n++] = (struct study_best){s->trials[i].job->ended_ms, s->trials[i].value, i};
    qsort(v, n, sizeof *v, by_end);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || better(s, v[i].value, v[k - 1].value))
            v[k++] = v[i];
    s->best_so_far = v;
    s->nbest = k;
    s->best = k ? (long)v[k - 1].trial : -1;
    return 0;
}

int coord_study_get(struct coord *c, const char *name, struct study *s)
{
    memset(s, 0, sizeof *s);
    s->best = -1;
    size_t cap = 0;
    for (struct job *j = c->jobs; j; j = j->next) {
        const char *sn = coord_job_meta(j, STUDY_META_NAME);
        if (!sn || strcmp(sn, name) != 0)
            continue;
        if (s->n == cap) {
            cap = cap ? 2 * cap : 16;
            struct study_trial *nt = realloc(s->trials, cap * sizeof *nt);
            if (!nt)
                return KOLO_ENOMEM;
            s->trials = nt;
        }
        struct study_trial *t = &s->trials[s->n++];
        const char *num = coord_job_meta(j, STUDY_META_TRIAL);
        char *end = NULL;
        long long v = num ? strtoll(num, &end, 10) : -1;
        *t = (struct study_trial){.job = j,
                                  .number = num && end && !*end && v >= 0 ? v : -1,
                                  .params = coord_job_meta(j, STUDY_META_PARAMS),
                                  .value = NAN,
                                  .best = NAN};
        /* jobs are in submission order: the newest trial's labels win */
        s->name = sn;
        const char *metric = coord_job_meta(j, STUDY_META_METRIC);
        const char *mode = coord_job_meta(j, STUDY_META_MODE);
        s->metric = metric && metric[0] ? metric : "loss";
        s->maximize = mode && strcmp(mode, "max") == 0;
        if (!s->first_ms || (j->submitted_ms && j->submitted_ms < s->first_ms))
            s->first_ms = j->submitted_ms;
    }
    if (!s->n)
        return KOLO_ENOTFOUND;
    qsort(s->trials, s->n, sizeof *s->trials, by_number);
    bool open = false;
    for (size_t i = 0; i < s->n; i++) {
        struct study_trial *t = &s->trials[i];
        int rc = trial_curve(c, s, t);
        if (rc)
            return rc;
        t->state = trial_state_of(t->job, t->value);
        s->counts[t->state]++;
        open |= t->state == TRIAL_PENDING || t->state == TRIAL_RUNNING;
        if (t->job->ended_ms > s->last_ms)
            s->last_ms = t->job->ended_ms;
    }
    if (open)
        s->last_ms = 0;
    return best_curve(s);
}

static bool listed(const char **v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], name) == 0)
            return true;
    return false;
}

int coord_study_names(struct coord *c, const char ***names, size_t *n)
{
    size_t cap = 0, k = 0;
    const char **v = NULL;
    for (struct job *j = c->jobs; j; j = j->next) {
        const char *sn = coord_job_meta(j, STUDY_META_NAME);
        if (!sn || listed(v, k, sn))
            continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 8;
            const char **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                free(v);
                return KOLO_ENOMEM;
            }
            v = nv;
        }
        v[k++] = sn;
    }
    /* jobs are oldest first; studies newest first (by their first trial) */
    for (size_t i = 0; i < k / 2; i++) {
        const char *t = v[i];
        v[i] = v[k - 1 - i];
        v[k - 1 - i] = t;
    }
    *names = v;
    *n = k;
    return 0;
}
