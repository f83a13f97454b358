/*
 * coord_jobs.c - jobs: submission, placement, the state machine, output.
 *
 * States: pending -> running -> succeeded | failed | stopped (pending may
 * also go straight to failed or stopped). A pending job waits for slots
 * with its reason visible (REST, `kolo run`) until its start timeout.
 * Placement writes the generation and the rank table in one transaction,
 * then bumps the desired set of every host involved, which wakes their
 * parked heartbeats: that is the launch order.
 *
 * A fixed-size job fails with the first worker that fails, with that
 * worker's exit code (128+N for a signal, as a shell reports it), and the
 * job's ranks leave every host's desired set, so agents stop the rest; a
 * lost host fails the jobs that had ranks on it. An elastic job
 * (coord_elastic.c) instead moves to a new generation.
 *
 * Every worker has a worker id (wid), unique in its job and kept for the
 * process's life: agents key their workers by it, and its events and
 * output are mapped to the rank it has in the current generation.
 */
#include "coord_jobs.h"
#include "coord_core.h"
#include "coord_hosts.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "placement.h"
#include "util.h"

#define OUTPUT_DEFAULT_LINES 1000
#define OUTPUT_MAX_LINES     10000
#define STREAM_MAX_WAIT_MS   30000

static const char *job_state_names[] = {"pending", "running", "succeeded", "failed", "stopped"};
static const char *rank_state_names[] = {"assigned", "running", "exited", "lost"};

const char *coord_job_state_name(enum job_state s)
{
    return job_state_names[s];
}

const char *coord_rank_state_name(enum rank_state s)
{
    return rank_state_names[s];
}

static int state_from_name(const char *s, const char **names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

struct job *coord_job_find(struct coord *c, uint64_t id)
{
    for (struct job *j = c->jobs; j; j = j->next)
        if (j->id == id)
            return j;
    return NULL;
}

int coord_job_ranks_alive(const struct job *j)
{
    int n = 0;
    for (int r = 0; r < j->nranks; r++)
        if (j->ranks[r].state == RANK_ASSIGNED || j->ranks[r].state == RANK_RUNNING)
            n++;
    return n;
}

static bool job_terminal(const struct job *j)
{
    return j->state == JOB_SUCCEEDED || j->state == JOB_FAILED || j->state == JOB_STOPPED;
}

/* ---------------------------------------------------------------- persistence */

static char *strv_to_json(char **v, int n)
{
    struct buf b;
    struct jw w;
    buf_init(&b);
    jw_init(&w, &b);
    jw_arr_begin(&w);
    for (int i = 0; i < n; i++)
        jw_str(&w, v[i]);
    jw_arr_end(&w);
    if (b.oom) {
        buf_free(&b);
        return NULL;
    }
    return buf_steal(&b, NULL);
}

static int strv_from_json(const char *text, char ***out, int *n)
{
    struct json *root = NULL;
    char err[128];
    *out = NULL;
    *n = 0;
    if (!text || json_parse(text, strlen(text), &root, err, sizeof(err)) != 0 ||
        root->type != JSON_ARRAY) {
        json_free(root);
        return KOLO_EPROTO;
    }
    char **v = calloc(root->count + 1, sizeof(char *));
    int k = 0;
    for (const struct json *e = root->child; e && v; e = e->next)
        if (e->type == JSON_STRING)
            v[k++] = strdup(e->str);
    json_free(root);
    if (!v)
        return KOLO_ENOMEM;
    *out = v;
    *n = k;
    return 0;
}

void coord_job_persist(struct coord *c, struct job *j)
{
    char *argv_json = strv_to_json(j->argv, j->argc);
    char *env_json = strv_to_json(j->env, j->nenv);
    char *el_json = c->hooks.elastic_to_json(j);
    /* metadata is written once, with the job's first row */
    char *meta_json = !j->id && j->nmeta ? strv_to_json(j->meta, j->nmeta) : NULL;
    struct store_job sj = {
        .elastic_json = el_json,
        .metadata_json = meta_json,
        .id = j->id,
        .name = j->name,
        .state = job_state_names[j->state],
        .np = j->np,
        .argv_json = argv_json ? argv_json : "[]",
        .env_json = env_json ? env_json : "[]",
        .cwd = j->cwd,
        .hosts = j->hosts,
        .exit_code = j->exit_code,
        .reason = j->reason ? j->reason : "",
        .generation = j->generation,
        .start_timeout_ms = j->start_timeout_ms,
        .submitted_ms = j->submitted_ms,
        .started_ms = j->started_ms,
        .ended_ms = j->ended_ms,
    };
    int rv = j->id ? store_job_update(c->store, &sj) : store_job_insert(c->store, &sj);
    if (rv != 0)
        coord_store_failed(c, "job write");
    else if (!j->id)
        j->id = sj.id;
    free(argv_json);
    free(env_json);
    free(el_json);
    free(meta_json);
}

static void rank_persist(struct coord *c, struct job *j, struct rank *r)
{
    struct store_rank sr = {
        .job_id = j->id,
        .generation = j->generation,
        .rank = r->rank,
        .worker_id = r->wid,
        .host_id = r->host_id,
        .local_rank = r->local_rank,
        .local_size = r->local_size,
        .cross_rank = r->cross_rank,
        .cross_size = r->cross_size,
        .state = rank_state_names[r->state],
        .exit_code = r->exit_code,
        .term_signal = r->term_signal,
        .pid = r->pid,
    };
    if (store_rank_update(c->store, &sr) != 0)
        coord_store_failed(c, "rank update");
}

static void job_set_reason(struct job *j, const char *reason)
{
    free(j->reason);
    j->reason = strdup(reason ? reason : "");
}

static void job_free(struct coord *c, struct job *j)
{
    for (int i = 0; i < j->argc; i++)
        free(j->argv[i]);
    for (int i = 0; i < j->nenv; i++)
        free(j->env[i]);
    for (int i = 0; i < j->nmeta; i++)
        free(j->meta[i]);
    free(j->argv);
    free(j->env);
    free(j->meta);
    free(j->name);
    free(j->cwd);
    free(j->hosts);
    free(j->reason);
    free(j->ranks);
    c->hooks.job_free(j);
    free(j->tl_last);
    free(j);
}

int coord_job_member(const struct job *j, uint64_t wid)
{
    for (int r = 0; r < j->nranks; r++)
        if (j->ranks[r].wid == wid)
            return r;
    return -1;
}

static void job_append(struct coord *c, struct job *j)
{
    struct job **tail = &c->jobs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = j;
}

/* ---------------------------------------------------------------- loading */

static int load_rank_cb(const struct store_rank *sr, void *arg)
{
    struct job *j = arg;
    if (sr->rank < 0 || sr->rank >= COORD_MAX_NP)
        return 0;
    if (sr->rank >= j->nranks) {
        struct rank *nr = realloc(j->ranks, (size_t)(sr->rank + 1) * sizeof(*nr));
        if (!nr)
            return KOLO_ENOMEM;
        for (int k = j->nranks; k <= sr->rank; k++)
            nr[k] = (struct rank){.rank = k, .state = RANK_LOST};
        j->ranks = nr;
        j->nranks = sr->rank + 1;
    }
    struct rank *r = &j->ranks[sr->rank];
    r->rank = sr->rank;
    r->wid = sr->worker_id ? sr->worker_id : (uint64_t)sr->rank + 1;
    if (r->wid > j->next_wid)
        j->next_wid = r->wid;
    str_copy(r->host_id, sr->host_id, sizeof(r->host_id));
    r->local_rank = sr->local_rank;
    r->local_size = sr->local_size;
    r->cross_rank = sr->cross_rank;
    r->cross_size = sr->cross_size;
    int st = state_from_name(sr->state, rank_state_names, 4);
    r->state = st < 0 ? RANK_LOST : (enum rank_state)st;
    r->exit_code = sr->exit_code;
    r->term_signal = sr->term_signal;
    r->pid = sr->pid;
    return 0;
}

static int load_job_cb(const struct store_job *sj, void *arg)
{
    struct coord *c = arg;
    struct job *j = calloc(1, sizeof(*j));
    if (!j)
        return KOLO_ENOMEM;
    j->id = sj->id;
    j->name = strdup(sj->name ? sj->name : "");
    int st = state_from_name(sj->state, job_state_names, 5);
    j->state = st < 0 ? JOB_FAILED : (enum job_state)st;
    j->np = sj->np;
    strv_from_json(sj->argv_json, &j->argv, &j->argc);
    strv_from_json(sj->env_json, &j->env, &j->nenv);
    if (sj->metadata_json)
        strv_from_json(sj->metadata_json, &j->meta, &j->nmeta);
    j->cwd = strdup(sj->cwd ? sj->cwd : "");
    j->hosts = strdup(sj->hosts ? sj->hosts : "");
    j->exit_code = sj->exit_code;
    j->reason = strdup(sj->reason ? sj->reason : "");
    j->generation = sj->generation;
    j->start_timeout_ms = sj->start_timeout_ms;
    j->submitted_ms = sj->submitted_ms;
    j->started_ms = sj->started_ms;
    j->ended_ms = sj->ended_ms;
    if (j->state == JOB_PENDING && j->start_timeout_ms)
        j->pending_deadline = now_mono_ms() + j->start_timeout_ms;
    if (sj->elastic_json && sj->elastic_json[0])
        c->hooks.elastic_from_json(j, sj->elastic_json);
    if (j->generation > 0) {
        if (store_ranks_each(c->store, j->id, j->generation, load_rank_cb, j) < 0) {
            job_free(c, j);
            return KOLO_ENOMEM;
        }
        for (int r = 0; r < j->nranks; r++)
            j->ranks[r].host =
                j->ranks[r].host_id[0] ? coord_host_find(c, j->ranks[r].host_id) : NULL;
    }
    store_output_max_seq(c->store, j->id, &j->out_seq);
    j->out_stored = j->out_seq;
    job_append(c, j);
    return 0;
}

int coord_jobs_load(struct coord *c)
{
    return store_jobs_each(c->store, load_job_cb, c);
}

/* ---------------------------------------------------------------- state machine */

static void job_wake_waiters(struct coord *c, struct job *j);

void coord_job_hosts_wake(struct coord *c, struct job *j)
{
    for (struct host *h = c->hosts; h; h = h->next) {
        for (int r = 0; r < j->nranks; r++) {
            if (j->ranks[r].host == h) {
                coord_host_wake(c, h);
                break;
            }
        }
    }
}

void coord_job_finish(struct coord *c, struct job *j, enum job_state state, int exit_code,
                       const char *reason)
{
    if (job_terminal(j))
        return;
    j->state = state;
    j->exit_code = exit_code;
    j->ended_ms = now_wall_ms();
    j->pending_deadline = 0;
    job_set_reason(j, reason);
    coord_job_persist(c, j);
    coord_event(c, j->id, NULL,
                state == JOB_SUCCEEDED ? "job.succeeded"
                : state == JOB_STOPPED ? "job.stopped"
                                       : "job.failed",
                "job %llu %s (exit code %d)%s%s", (unsigned long long)j->id, job_state_names[state],
                exit_code, reason && reason[0] ? ": " : "", reason ? reason : "");
    /* Workers blocked in negotiation learn it now, not at their deadline. */
    /* Workers blocked in negotiation learn it now, not at their deadline;
     * an elastic job's ranks leave the desired sets. */
    c->hooks.job_ended(c, j, state == JOB_SUCCEEDED ? KOLO_ESHUTDOWN : KOLO_EPEER,
                       reason && reason[0] ? reason : "the job ended");
    /* Agents stop what still runs. */
    coord_job_hosts_wake(c, j);
    job_wake_waiters(c, j);
    /* Freed slots may start a pending job. */
    coord_jobs_place_pending(c);
}

const char *coord_job_meta(const struct job *j, const char *key)
{
    size_t n = strlen(key);
    for (int i = 0; i < j->nmeta; i++)
        if (strncmp(j->meta[i], key, n) == 0 && j->meta[i][n] == '=')
            return j->meta[i] + n + 1;
    return NULL;
}

/* meta_check says what is wrong with a job's metadata, or returns true. */
static bool meta_check(char **meta, int n, char *err, size_t errlen)
{
    if (n > JOB_META_MAX) {
        snprintf(err, errlen, "at most %d metadata entries, not %d", JOB_META_MAX, n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(meta[i], '=');
        size_t klen = eq ? (size_t)(eq - meta[i]) : 0;
        if (!eq || klen == 0 || klen > JOB_META_KEY_MAX) {
            snprintf(err, errlen, "metadata entry '%.64s' is not key=value with a key of 1 to %d "
                     "bytes", meta[i], JOB_META_KEY_MAX);
            return false;
        }
        for (size_t k = 0; k < klen; k++) {
            char ch = meta[i][k];
            if (!isalnum((unsigned char)ch) && ch != '.' && ch != '_' && ch != '-') {
                snprintf(err, errlen, "metadata key '%.*s' may hold only letters, digits, '.', '_' "
                         "and '-'", (int)klen, meta[i]);
                return false;
            }
        }
        if (strlen(eq + 1) > JOB_META_VALUE_MAX) {
            snprintf(err, errlen, "metadata value of '%.*s' is longer than %d bytes", (int)klen,
                     meta[i], JOB_META_VALUE_MAX);
            return false;
        }
        for (int p = 0; p < i; p++)
            if (strncmp(meta[p], meta[i], klen + 1) == 0) {
                snprintf(err, errlen, "metadata key '%.*s' is given twice", (int)klen, meta[i]);
                return false;
            }
    }
    return true;
}

/*
 * job_default_name: what a job without a name is called where people look
 * (kolo jobs, the dashboard): its script, not its interpreter. For
 * "python3 -u train.py --lr 0.1" that is "train.py", for "python -m
 * pkg.train" "pkg.train"; any other command keeps its argv[0].
 */
static const char *job_default_name(int argc, char **argv)
{
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (strncmp(base, "python", 6) != 0)
        return argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-m") == 0 && i + 1 < argc)
            return argv[i + 1];
        if (strcmp(a, "-c") == 0 || strcmp(a, "-") == 0)
            return argv[0];
        if (strcmp(a, "-X") == 0 || strcmp(a, "-W") == 0 ||
            strcmp(a, "--check-hash-based-pycs") == 0) {
            i++; /* takes a value */
            continue;
        }
        if (a[0] != '-') {
            const char *script = strrchr(a, '/');
            return script && script[1] ? script + 1 : a;
        }
    }
    return argv[0];
}

int coord_job_submit(struct coord *c, const struct job_request *rq, uint64_t *job_id, char *err,
                     size_t errlen)
{
    char **argv = rq->argv, **env = rq->env;
    int argc = rq->argc, nenv = rq->nenv, np = rq->np;
    const char *hosts = rq->hosts, *name = rq->name, *cwd = rq->cwd;
    uint32_t start_timeout_ms = rq->start_timeout_ms;
    const struct elastic_opts *eo = rq->eo;
    if (argc < 1 || !argv[0][0]) {
        snprintf(err, errlen, "the job has no command");
        return KOLO_EINVAL;
    }
    if (np < 1 || np > COORD_MAX_NP) {
        snprintf(err, errlen, "np must be between 1 and %d", COORD_MAX_NP);
        return KOLO_EINVAL;
    }
    for (int i = 0; i < nenv; i++) {
        const char *eq = strchr(env[i], '=');
        if (!eq || eq == env[i]) {
            snprintf(err, errlen, "environment entry '%.64s' is not NAME=value", env[i]);
            return KOLO_EINVAL;
        }
    }
    if (!meta_check(rq->meta, rq->nmeta, err, errlen))
        return KOLO_EINVAL;
    if (hosts && hosts[0]) {
        struct place_spec_entry spec[256];
        int n = place_parse_hosts(hosts, spec, 256, err, errlen);
        if (n < 0)
            return KOLO_EINVAL;
        int total = 0;
        for (int i = 0; i < n; i++)
            total += spec[i].slots;
        if (total < np) {
            snprintf(err, errlen, "the host list %s has %d slot(s) but np is %d", hosts, total, np);
            return KOLO_EINVAL;
        }
    }
    const char *sp = eo && eo->straggler_policy ? eo->straggler_policy : "";
    bool exclude = strcmp(sp, "exclude") == 0;
    if (sp[0] && !exclude && strcmp(sp, "warn") != 0) {
        snprintf(err, errlen, "straggler policy '%.32s' is not warn or exclude", sp);
        return KOLO_EINVAL;
    }
    if (eo && eo->spares && !eo->elastic) {
        snprintf(err, errlen, "hot spares need an elastic job (--min-np, --max-np or a host "
                              "discovery script): only an elastic job takes a new worker in");
        return KOLO_EINVAL;
    }
    if (exclude && !(eo && eo->elastic)) {
        snprintf(err, errlen, "straggler policy exclude needs an elastic job (--min-np, "
                              "--max-np or a host discovery script): a fixed-size job cannot "
                              "go on without a host");
        return KOLO_EINVAL;
    }
    struct job *j = calloc(1, sizeof(*j));
    if (!j)
        return KOLO_ENOMEM;
    j->straggler_exclude = exclude;
    j->straggler_window_ms = eo && eo->straggler_window_ms ? eo->straggler_window_ms
                                                           : STRAGGLER_WINDOW_MS;
    j->argv = calloc((size_t)argc + 1, sizeof(char *));
    j->env = calloc((size_t)nenv + 4, sizeof(char *)); /* + the elastic entries */
    j->meta = calloc((size_t)rq->nmeta + 1, sizeof(char *));
    if (!j->argv || !j->env || !j->meta) {
        job_free(c, j);
        return KOLO_ENOMEM;
    }
    for (int i = 0; i < argc; i++)
        j->argv[j->argc++] = strdup(argv[i]);
    for (int i = 0; i < nenv; i++)
        j->env[j->nenv++] = strdup(env[i]);
    for (int i = 0; i < rq->nmeta; i++)
        j->meta[j->nmeta++] = strdup(rq->meta[i]);
    if (eo && eo->elastic) {
        j->np = np;
        int rv = c->hooks.elastic_init(j, eo, err, errlen);
        if (rv) {
            job_free(c, j);
            return rv;
        }
        /* Workers ask for their place by worker id, and wait for it as
         * long as the job waits for capacity. */
        char t[64];
        snprintf(t, sizeof(t), "KOLO_ELASTIC_TIMEOUT_MS=%u", j->el->timeout_ms);
        j->env[j->nenv++] = strdup("KOLO_ELASTIC=1");
        /* as horovodrun's elastic launcher does: Horovod code reads it (a
         * DistributedOptimizer made at size 1 hooks the gradients anyway,
         * or a job that grows would train rank 0 alone) */
        j->env[j->nenv++] = strdup("HOROVOD_ELASTIC=1");
        j->env[j->nenv++] = strdup(t);
    }
    j->name = strdup(name && name[0] ? name : job_default_name(argc, argv));
    j->cwd = strdup(cwd ? cwd : "");
    j->hosts = strdup(hosts ? hosts : "");
    j->np = np;
    j->state = JOB_PENDING;
    j->start_timeout_ms = start_timeout_ms;
    j->submitted_ms = now_wall_ms();
    j->reason = strdup("waiting to be placed");
    if (start_timeout_ms)
        j->pending_deadline = now_mono_ms() + start_timeout_ms;
    coord_job_persist(c, j);
    if (!j->id) {
        snprintf(err, errlen, "cannot record the job: %s", store_last_error(c->store));
        job_free(c, j);
        return KOLO_ESTORE;
    }
    job_append(c, j);
    if (j->el)
        coord_event(c, j->id, NULL, "job.submitted",
                    "job %llu submitted: elastic, np %d (min %d, max %d), %s%s%s",
                    (unsigned long long)j->id, np, j->el->min_np, j->el->max_np, j->name,
                    j->hosts[0] ? ", hosts " : "", j->hosts);
    else
        coord_event(c, j->id, NULL, "job.submitted", "job %llu submitted: np %d, %s%s%s",
                    (unsigned long long)j->id, np, j->name, j->hosts[0] ? ", hosts " : "",
                    j->hosts);
    *job_id = j->id;
    coord_jobs_place_pending(c);
    return 0;
}

/* Places one pending job; returns true when it started or ended. */
static bool job_try_place(struct coord *c, struct job *j)
{
    int nhosts = 0;
    for (struct host *h = c->hosts; h; h = h->next)
        nhosts++;
    struct place_host *ph = calloc((size_t)nhosts + 1, sizeof(*ph));
    struct host **hv = calloc((size_t)nhosts + 1, sizeof(*hv));
    struct place_spec_entry *spec = NULL;
    struct place_rank *pr = calloc((size_t)j->np, sizeof(*pr));
    char reason[512] = "";
    int nspec = 0;
    bool changed = false;
    if (!ph || !hv || !pr)
        goto out;
    int i = 0;
    for (struct host *h = c->hosts; h; h = h->next, i++) {
        hv[i] = h;
        ph[i] = (struct place_host){.name = h->name,
                                    .hostname = h->hostname,
                                    .id = h->id,
                                    .free_slots = j->el ? c->hooks.elastic_free_slots(c, j, h)
                                                        : h->slots - coord_host_slots_used(c, h),
                                    .alive = c->hooks.host_usable(c, j, h)};
    }
    if (j->hosts[0]) {
        spec = calloc(256, sizeof(*spec));
        if (!spec)
            goto out;
        nspec = place_parse_hosts(j->hosts, spec, 256, reason, sizeof(reason));
        if (nspec < 0) {
            coord_job_finish(c, j, JOB_FAILED, 1, reason);
            changed = true;
            goto out;
        }
    }
    int rv = place_ranks(ph, nhosts, spec, nspec, j->np, pr, reason, sizeof(reason));
    if (rv == PLACE_IMPOSSIBLE) {
        coord_job_finish(c, j, JOB_FAILED, 1, reason);
        changed = true;
        goto out;
    }
    if (rv == PLACE_WAIT) {
        if (!j->reason || strcmp(j->reason, reason) != 0) {
            job_set_reason(j, reason);
            coord_job_persist(c, j);
            job_wake_waiters(c, j);
        }
        goto out;
    }
    struct rank *ranks = calloc((size_t)j->np, sizeof(*ranks));
    struct store_rank *sr = calloc((size_t)j->np, sizeof(*sr));
    if (!ranks || !sr) {
        free(ranks);
        free(sr);
        goto out;
    }
    j->generation++;
    for (int r = 0; r < j->np; r++) {
        struct host *h = hv[pr[r].host];
        ranks[r] = (struct rank){.rank = r,
                                 .wid = ++j->next_wid,
                                 .host = h,
                                 .local_rank = pr[r].local_rank,
                                 .local_size = pr[r].local_size,
                                 .cross_rank = pr[r].cross_rank,
                                 .cross_size = pr[r].cross_size,
                                 .state = RANK_ASSIGNED};
        str_copy(ranks[r].host_id, h->id, sizeof(ranks[r].host_id));
        sr[r] = (struct store_rank){.job_id = j->id,
                                    .generation = j->generation,
                                    .rank = r,
                                    .worker_id = ranks[r].wid,
                                    .host_id = h->id,
                                    .local_rank = pr[r].local_rank,
                                    .local_size = pr[r].local_size,
                                    .cross_rank = pr[r].cross_rank,
                                    .cross_size = pr[r].cross_size,
                                    .state = "assigned"};
    }
    free(j->ranks);
    j->ranks = ranks;
    j->nranks = j->np;
    j->state = JOB_RUNNING;
    j->started_ms = now_wall_ms();
    j->pending_deadline = 0;
    job_set_reason(j, "");
    store_begin(c->store);
    if (store_generation_add(c->store, j->id, j->generation, "start", j->np, j->started_ms) != 0 ||
        store_ranks_put(c->store, sr, (size_t)j->np) != 0)
        coord_store_failed(c, "placement");
    coord_job_persist(c, j);
    if (store_commit(c->store) != 0)
        coord_store_failed(c, "placement commit");
    free(sr);

    struct buf where;
    buf_init(&where);
    for (int k = 0; k < nhosts; k++) {
        int n = 0;
        for (int r = 0; r < j->np; r++)
            n += ranks[r].host == hv[k];
        if (n)
            buf_printf(&where, "%s%s:%d", where.len ? "," : "", hv[k]->name, n);
    }
    coord_event(c, j->id, NULL, "job.started", "job %llu started: %d rank(s) on %s",
                (unsigned long long)j->id, j->np, buf_cstr(&where));
    buf_free(&where);
    coord_job_hosts_wake(c, j);
    job_wake_waiters(c, j);
    changed = true;
out:
    free(ph);
    free(hv);
    free(spec);
    free(pr);
    return changed;
}

void coord_jobs_place_pending(struct coord *c)
{
    /* Oldest first; a job that cannot start yet does not hold back later,
     * smaller ones. Restart the walk after a change: placing or failing a
     * job can re-enter through job_finish. */
    bool again = true;
    while (again) {
        again = false;
        for (struct job *j = c->jobs; j; j = j->next) {
            if (j->state == JOB_PENDING && job_try_place(c, j)) {
                again = true;
                break;
            }
        }
    }
}

int coord_job_stop(struct coord *c, struct job *j, const char *reason)
{
    if (job_terminal(j))
        return KOLO_ESTATE;
    const char *why = reason && reason[0] ? reason : "stopped on request";
    if (j->state == JOB_RUNNING) {
        char what[256];
        snprintf(what, sizeof what, "when stopped (%s)", why);
        c->hooks.job_stopping(c, j, what); /* first: the agents answer before they stop it */
    }
    coord_job_finish(c, j, JOB_STOPPED, 143, why);
    return 0;
}

void coord_jobs_host_lost(struct coord *c, struct host *h, const char *why)
{
    for (struct job *j = c->jobs; j; j = j->next) {
        bool hit = false;
        for (int r = 0; r < j->nranks; r++) {
            struct rank *rk = &j->ranks[r];
            if (rk->host == h && (rk->state == RANK_ASSIGNED || rk->state == RANK_RUNNING)) {
                rk->state = RANK_LOST;
                rank_persist(c, j, rk);
                hit = true;
            }
        }
        if (!hit)
            continue;
        if (j->state == JOB_RUNNING && j->el && !j->el->finishing)
            c->hooks.member_gone(c, j, h, true, CAUSE_HOST_LOST, why);
        else if (j->state == JOB_RUNNING)
            coord_job_finish(c, j, JOB_FAILED, 1, why);
        else
            job_wake_waiters(c, j);
    }
}

/* How long a job that lost a rank to a HorovodInternalError waits for the
 * rank whose failure caused it to exit too, so that the job's reason names
 * that one (its exception), not a consequence. Python's teardown of a
 * rank that raised (torch unloading) takes a moment. */
#define FAIL_CAUSE_WAIT_MS 3000

static bool all_exited(const struct job *j)
{
    for (int k = 0; k < j->nranks; k++)
        if (j->ranks[k].state != RANK_EXITED)
            return false;
    return true;
}

/* A worker of an elastic job failed with error (its traceback's last line,
 * "" for a signal or no line): whether it is the same error for the
 * SAME_ERROR_LIMIT-th time in a row, when the job has no --reset-limit of
 * its own. A reset would only bring it back: Horovod users otherwise wait
 * for a reset limit they did not set. */
#define SAME_ERROR_LIMIT 3
static bool same_error_again(struct elastic *el, const char *error)
{
    if (!error[0])
        return false; /* a kill is the cluster's: the run of the same error goes on */
    if (strcmp(el->same_error, error) == 0) {
        el->same_error_count++;
    } else {
        str_copy(el->same_error, error, sizeof el->same_error);
        el->same_error_count = 1;
    }
    return el->reset_limit == 0 && el->same_error_count >= SAME_ERROR_LIMIT;
}

void coord_job_worker_event(struct coord *c, struct host *h, uint64_t job_id, uint64_t gen,
                            int rank, uint64_t wid, int kind, int pid, int exit_code,
                            int term_signal, const char *message)
{
    struct job *j = coord_job_find(c, job_id);
    if (j && wid && coord_job_member(j, wid) < 0 && c->hooks.spare_event &&
        c->hooks.spare_event(c, j, h, wid, kind, pid, exit_code, term_signal))
        return; /* a hot spare's (coord_elastic.c) */
    if (j && wid) {
        /* The rank it has now; a worker that is no longer a member (an
         * older generation's, being stopped) has nothing to say. */
        rank = coord_job_member(j, wid);
        gen = j->generation;
    }
    if (!j || gen != j->generation || rank < 0 || rank >= j->nranks) {
        LOGD("coord", "ignoring event for job %llu gen %llu rank %d worker %llu from %s",
             (unsigned long long)job_id, (unsigned long long)gen, rank, (unsigned long long)wid,
             h->name);
        return;
    }
    struct rank *r = &j->ranks[rank];
    if (r->host != h) {
        LOGW("coord", "host %s reported rank %d of job %llu, which is not its rank", h->name, rank,
             (unsigned long long)job_id);
        return;
    }
    switch (kind) {
    case KOLO__WORKER_EVENT_KIND__WORKER_STARTED:
        if (r->state == RANK_ASSIGNED || r->state == RANK_RUNNING) {
            r->state = RANK_RUNNING;
            r->pid = pid;
            rank_persist(c, j, r);
        }
        return;
    case KOLO__WORKER_EVENT_KIND__WORKER_SPAWN_FAILED:
        coord_event(c, j->id, h->id, "worker.spawn_failed", "rank %d on %s could not start: %s",
                    rank, h->name, message ? message : "");
        return;
    case KOLO__WORKER_EVENT_KIND__WORKER_EXITED:
        break;
    default:
        return;
    }
    if (r->state == RANK_EXITED)
        return; /* a resent report */
    r->state = RANK_EXITED;
    r->exit_code = exit_code;
    r->term_signal = term_signal;
    rank_persist(c, j, r);
    int code = term_signal ? 128 + term_signal : exit_code;
    char why[600], error[400] = "";
    if (!term_signal && exit_code != 0)
        coord_rank_error_line(c, j, rank, error, sizeof error);
    if (term_signal)
        snprintf(why, sizeof(why), "rank %d on host %s was killed by signal %d", rank, h->name,
                 term_signal);
    else
        snprintf(why, sizeof(why), "rank %d on host %s exited with code %d%s%s", rank, h->name,
                 exit_code, error[0] ? ": " : "", error);
    if (j->state == JOB_RUNNING && code != 0 && j->el && !j->el->finishing) {
        struct elastic *el = j->el;
        if (term_signal) {
            el->fail_streak = 0; /* killed: the cluster, not the code */
        } else if (el->fail_streak++ == 0) {
            el->fail_first_code = exit_code;
            str_copy(el->fail_first_why, why, sizeof el->fail_first_why);
        }
        coord_event(c, j->id, h->id, "worker.failed", "%s", why);
        if (same_error_again(el, term_signal ? "" : error)) {
            char msg[900];
            snprintf(msg, sizeof msg,
                     "the same error ended a worker %d times in a row, the last: %s; no new "
                     "generation (the code, not the cluster; --reset-limit N sets a limit of "
                     "resets instead)",
                     el->same_error_count, why);
            coord_job_finish(c, j, JOB_FAILED, exit_code, msg);
            return;
        }
        c->hooks.member_gone(c, j, h, true, CAUSE_FAILURE, why);
        return;
    }
    if (j->state == JOB_RUNNING && code == 0 && j->el)
        j->el->finishing = true; /* Horovod: a success ends the job, no more resets */
    if (j->state == JOB_RUNNING && code != 0) {
        /* A HorovodInternalError is a consequence ("rank 1 left the job"):
         * the rank that caused it may exit a moment later (Python's
         * teardown). Wait that long for a cause of its own to name. */
        bool consequence = !term_signal && strstr(error, "HorovodInternalError") != NULL;
        if (consequence) {
            if (!j->fail_consequence_at) {
                j->fail_consequence_at = now_mono_ms() + FAIL_CAUSE_WAIT_MS;
                j->fail_consequence_code = code;
                str_copy(j->fail_consequence_why, why, sizeof j->fail_consequence_why);
            }
            if (!all_exited(j)) {
                job_wake_waiters(c, j);
                return;
            }
            code = j->fail_consequence_code;
            str_copy(why, j->fail_consequence_why, sizeof why);
        }
        coord_job_finish(c, j, JOB_FAILED, code, why);
        return;
    }
    if (j->state == JOB_RUNNING) {
        bool all_ok = true;
        for (int k = 0; k < j->nranks && all_ok; k++)
            all_ok = j->ranks[k].state == RANK_EXITED && j->ranks[k].exit_code == 0 &&
                     j->ranks[k].term_signal == 0;
        if (all_ok) {
            coord_job_finish(c, j, JOB_SUCCEEDED, 0, "");
            return;
        }
    }
    job_wake_waiters(c, j);
}

/* ---------------------------------------------------------------- desired sets */

/* Appends rk's spec (rank -1: a hot spare) to *specs; false: no memory. */
static bool desired_add(const struct job *j, const struct rank *rk, Kolo__WorkerSpec ***specs,
                        size_t *n, size_t *cap)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        Kolo__WorkerSpec **ns = realloc(*specs, nc * sizeof(*ns));
        if (!ns)
            return false;
        *specs = ns;
        *cap = nc;
    }
    Kolo__WorkerSpec *s = malloc(sizeof(*s));
    if (!s)
        return false;
    kolo__worker_spec__init(s);
    s->job_id = j->id;
    s->generation = j->generation;
    s->worker_id = rk->wid;
    s->rank = rk->rank;
    s->size = j->nranks;
    s->local_rank = rk->local_rank;
    s->local_size = rk->local_size;
    s->cross_rank = rk->cross_rank;
    s->cross_size = rk->cross_size;
    if (rk->rank < 0) { /* a hot spare: a valid place to start from; its own comes at init */
        s->rank = s->local_rank = s->cross_rank = 0;
        s->local_size = s->cross_size = 1;
    }
    s->n_argv = (size_t)j->argc;
    s->argv = j->argv; /* borrowed: freed with the job, not with the spec */
    s->n_env = (size_t)j->nenv;
    s->env = j->env;
    s->cwd = j->cwd;
    (*specs)[(*n)++] = s;
    return true;
}

int coord_job_desired_for_host(struct coord *c, struct host *h, void ***specs_out, size_t *n_out)
{
    size_t n = 0, cap = 0;
    Kolo__WorkerSpec **specs = NULL;
    for (struct job *j = c->jobs; j; j = j->next) {
        if (j->state != JOB_RUNNING)
            continue;
        for (int r = 0; r < j->nranks; r++) {
            struct rank *rk = &j->ranks[r];
            if (rk->host != h || (rk->state != RANK_ASSIGNED && rk->state != RANK_RUNNING))
                continue;
            if (!desired_add(j, rk, &specs, &n, &cap))
                goto fail;
        }
        for (int s = 0; s < j->nspares; s++)
            if (j->spares[s].host == h && !desired_add(j, &j->spares[s], &specs, &n, &cap))
                goto fail;
    }
    *specs_out = (void **)specs;
    *n_out = n;
    return 0;
fail:
    coord_job_desired_free((void **)specs, n);
    return KOLO_ENOMEM;
}

void coord_job_desired_free(void **specs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(specs[i]);
    free(specs);
}

/* ---------------------------------------------------------------- a rank's error */

/* The line of a rank's last stderr lines that names its error: the
 * newest that starts a line with an exception's name and a colon
 * ("ValueError: ...", "kolo.exceptions.HorovodInternalError: ..."), as
 * Python's traceback ends. */
struct error_pick {
    char *out;
    size_t len;
};

static bool error_like(const char *t, size_t n)
{
    size_t i = 0;
    while (i < n && (isalnum((unsigned char)t[i]) || t[i] == '_' || t[i] == '.'))
        i++;
    if (i == 0 || i >= n || t[i] != ':' || !isalpha((unsigned char)t[0]))
        return false;
    static const char *const kinds[] = {"Error", "Exception", "Interrupt", "Exit"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        if (memmem(t, i, kinds[k], strlen(kinds[k])))
            return true;
    return false;
}

static int pick_error(const struct store_output *o, void *arg)
{
    struct error_pick *p = arg;
    size_t n = o->text_len;
    while (n > 0 && (o->text[n - 1] == '\n' || o->text[n - 1] == '\r'))
        n--;
    if (!error_like(o->text, n))
        return 0;
    size_t k = n < p->len - 1 ? n : p->len - 1;
    memcpy(p->out, o->text, k);
    p->out[k] = '\0';
    return 1; /* the newest: done */
}

void coord_rank_error_line(struct coord *c, const struct job *j, int rank, char *out, size_t len)
{
    out[0] = '\0';
    struct error_pick p = {out, len};
    if (len > 1 && store_output_rank_tail(c->store, j->id, rank, 2, 40, pick_error, &p) < 0)
        out[0] = '\0';
}

/* ---------------------------------------------------------------- output streams */

struct collect {
    Kolo__OutputLine **lines;
    Kolo__OutputLine *storage;
    size_t n, max;
    uint64_t last_seq;
    bool short_of_memory;
};

static int collect_line(const struct store_output *o, void *arg)
{
    struct collect *col = arg;
    if (col->n == col->max)
        return 1;
    Kolo__OutputLine *l = &col->storage[col->n];
    kolo__output_line__init(l);
    l->job_id = o->job_id;
    l->rank = o->rank;
    l->stream =
        o->stream == 2 ? KOLO__OUTPUT_STREAM__OUTPUT_STDERR : KOLO__OUTPUT_STREAM__OUTPUT_STDOUT;
    l->text.data = malloc(o->text_len ? o->text_len : 1);
    if (!l->text.data) {
        col->short_of_memory = true;
        return 1;
    }
    memcpy(l->text.data, o->text, o->text_len);
    l->text.len = o->text_len;
    l->ts_ms = o->ts_ms;
    l->seq = o->seq;
    col->lines[col->n++] = l;
    col->last_seq = o->seq;
    return 0;
}

/* The job's notices above a cursor (StreamOutputRequest.notices): the
 * events of the kinds coord_event_notice names, their text copied. */
#define NOTICE_MAX  64  /* notices in one reply */
#define NOTICE_SCAN 512 /* events read for them in one reply */
struct notices {
    Kolo__JobNotice *items[NOTICE_MAX];
    size_t n;
    uint64_t last_id; /* the last event read, notice or not */
};

static int collect_notice(const struct store_event *ev, void *arg)
{
    struct notices *ns = arg;
    if (ns->n == NOTICE_MAX)
        return 1;
    ns->last_id = (uint64_t)ev->id;
    if (!coord_event_notice(ev->kind))
        return 0;
    Kolo__JobNotice *x = calloc(1, sizeof *x);
    if (!x)
        return 1;
    kolo__job_notice__init(x);
    x->id = (uint64_t)ev->id;
    x->ts_ms = ev->ts_ms;
    x->kind = strdup(ev->kind ? ev->kind : "");
    x->host_id = strdup(ev->host_id ? ev->host_id : "");
    x->message = strdup(ev->message ? ev->message : "");
    ns->items[ns->n++] = x;
    return 0;
}

static void notices_free(struct notices *ns)
{
    for (size_t i = 0; i < ns->n; i++) {
        free(ns->items[i]->kind);
        free(ns->items[i]->host_id);
        free(ns->items[i]->message);
        free(ns->items[i]);
    }
}

static bool job_done(const struct job *j)
{
    return job_terminal(j) && coord_job_ranks_alive(j) == 0;
}

/* Answers a stream request (w: its cursors) if there is something to
 * say; false = park. */
static bool stream_answer(struct coord *c, struct job *j, struct rpc_call *call,
                          const struct waiter *w, bool force)
{
    bool done = job_done(j);
    uint64_t after_seq = w->after_seq;
    uint32_t max_lines = w->max_lines;
    bool news = w->notices && w->after_notice < j->last_notice;
    if (!force && !done && !news && after_seq >= j->out_stored)
        return false;
    struct notices ns = {.last_id = w->after_notice};
    if (news && store_events_each(c->store, j->id, (int64_t)w->after_notice, NOTICE_SCAN,
                                  collect_notice, &ns) < 0)
        coord_store_failed(c, "events read");
    struct collect col = {0};
    col.max = max_lines;
    col.last_seq = after_seq;
    if (after_seq < j->out_stored) {
        col.lines = calloc(max_lines, sizeof(*col.lines));
        col.storage = calloc(max_lines, sizeof(*col.storage));
        if (!col.lines || !col.storage) {
            free(col.lines);
            free(col.storage);
            notices_free(&ns);
            rpc_call_error(call, KOLO_ENOMEM, "out of memory");
            return true;
        }
        int got = store_output_each(c->store, j->id, after_seq, (int)max_lines, collect_line, &col);
        if (got < 0)
            coord_store_failed(c, "output read");
        else if (col.n < max_lines && !col.short_of_memory && col.last_seq < j->out_stored)
            /* The rest are seqs of batches that failed. Never back: the
             * writer thread commits a batch before out_stored counts it,
             * so the read may have given lines above out_stored already,
             * and a cursor set back below them served them twice. */
            col.last_seq = j->out_stored;
    }
    Kolo__StreamOutputReply rep = KOLO__STREAM_OUTPUT_REPLY__INIT;
    rep.n_lines = col.n;
    rep.lines = col.lines;
    rep.next_seq = col.last_seq;
    rep.state = (char *)job_state_names[j->state];
    rep.exit_code = j->exit_code;
    rep.reason = j->reason ? j->reason : "";
    /* done only once the client has every line */
    rep.done = done && col.last_seq >= j->out_stored;
    rep.notices = ns.items;
    rep.n_notices = ns.n;
    rep.next_notice = ns.last_id;
    coord_send_pb(call, &rep.base);
    notices_free(&ns);
    for (size_t i = 0; i < col.n; i++)
        free(col.storage[i].text.data);
    free(col.lines);
    free(col.storage);
    return true;
}

static void job_wake_waiters(struct coord *c, struct job *j)
{
    struct waiter *w = j->waiters;
    j->waiters = NULL;
    while (w) {
        struct waiter *next = w->next;
        stream_answer(c, j, w->call, w, true);
        free(w);
        w = next;
    }
}

void coord_job_output_added(struct coord *c, struct job *j)
{
    job_wake_waiters(c, j);
}

void coord_jobs_cron(struct coord *c, uint64_t now)
{
    for (struct job *j = c->jobs; j; j = j->next) {
        c->hooks.job_cron(c, j, job_terminal(j), now);
        if (j->state == JOB_RUNNING && j->fail_consequence_at && now >= j->fail_consequence_at)
            coord_job_finish(c, j, JOB_FAILED, j->fail_consequence_code, j->fail_consequence_why);
        if (j->state == JOB_PENDING && j->pending_deadline && now >= j->pending_deadline) {
            char why[600];
            snprintf(why, sizeof(why), "not placed within the start timeout of %u ms: %s",
                     j->start_timeout_ms, j->reason ? j->reason : "");
            coord_job_finish(c, j, JOB_FAILED, 1, why);
        }
        struct waiter **pw = &j->waiters;
        while (*pw) {
            struct waiter *w = *pw;
            if (now >= w->deadline) {
                *pw = w->next;
                stream_answer(c, j, w->call, w, true);
                free(w);
            } else {
                pw = &w->next;
            }
        }
    }
}

/* ---------------------------------------------------------------- admin RPCs */

static void fill_rank_info(struct job *j, struct rank *r, Kolo__RankInfo *ri)
{
    kolo__rank_info__init(ri);
    ri->rank = r->rank;
    ri->host_id = r->host_id;
    ri->host_name = r->host ? r->host->name : "";
    ri->local_rank = r->local_rank;
    ri->local_size = r->local_size;
    ri->cross_rank = r->cross_rank;
    ri->cross_size = r->cross_size;
    ri->state = (char *)rank_state_names[r->state];
    ri->exit_code = r->exit_code;
    ri->term_signal = r->term_signal;
    ri->pid = r->pid;
    (void)j;
}

/* Fills info for j; ranks arrays are allocated and freed by job_info_clear. */
static void job_info_fill(struct job *j, Kolo__JobInfo *ji, bool with_ranks)
{
    kolo__job_info__init(ji);
    ji->id = j->id;
    ji->name = j->name;
    ji->state = (char *)job_state_names[j->state];
    ji->np = j->np;
    ji->exit_code = j->exit_code;
    ji->reason = j->reason ? j->reason : "";
    ji->n_argv = (size_t)j->argc;
    ji->argv = j->argv;
    ji->cwd = j->cwd;
    ji->hosts = j->hosts;
    ji->generation = j->generation;
    ji->submitted_ms = j->submitted_ms;
    ji->started_ms = j->started_ms;
    ji->ended_ms = j->ended_ms;
    ji->ranks_alive = coord_job_ranks_alive(j);
    if (j->el) {
        ji->elastic = true;
        ji->min_np = j->el->min_np;
        ji->max_np = j->el->max_np;
        ji->resets = j->el->resets;
        ji->reset_limit = j->el->reset_limit;
        ji->spares_wanted = j->el->spares_want;
        for (int s = 0; s < j->nspares; s++)
            ji->spares_waiting += j->spares[s].state == RANK_RUNNING;
    }
    if (with_ranks && j->nranks) {
        Kolo__RankInfo *storage = calloc((size_t)j->nranks, sizeof(*storage));
        ji->ranks = calloc((size_t)j->nranks, sizeof(*ji->ranks));
        if (storage && ji->ranks) {
            for (int r = 0; r < j->nranks; r++) {
                fill_rank_info(j, &j->ranks[r], &storage[r]);
                ji->ranks[r] = &storage[r];
            }
            ji->n_ranks = (size_t)j->nranks;
        } else {
            free(storage);
            free(ji->ranks);
            ji->ranks = NULL;
        }
    }
}

static void job_info_clear(Kolo__JobInfo *ji)
{
    if (ji->ranks) {
        free(ji->ranks[0]);
        free(ji->ranks);
    }
}

/* A host as the admin replies describe it; inv is the inventory's storage. */
static void host_info_fill(struct coord *c, struct host *h, Kolo__HostInfo *info,
                           Kolo__HostInventory *inv, uint64_t now)
{
    kolo__host_info__init(info);
    kolo__host_inventory__init(inv);
    inv->cpus = h->cpus;
    inv->gpus = h->gpus;
    inv->mem_bytes = h->mem_bytes;
    info->id = h->id;
    info->name = h->name;
    info->hostname = h->hostname;
    info->addr = h->addr;
    info->slots = h->slots;
    info->slots_used = coord_host_slots_used(c, h);
    info->state = h->state != HOST_ALIVE ? "lost" : h->drained ? "drained" : "alive";
    info->inventory = inv;
    info->lease_age_ms = now - h->last_seen_mono;
    info->registered_ms = h->registered_ms;
}

static void admin_error(struct coord *c, struct rpc_call *call, enum coord_method m, int code,
                        const char *fmt, const char *detail)
{
    c->m.rpc_errors[m]++;
    rpc_call_error(call, code, fmt, detail);
}

void coord_rpc_admin(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    const ProtobufCMessageDescriptor *desc = NULL;
    switch (m) {
    case M_ADMIN_SUBMIT:
        desc = &kolo__submit_job_request__descriptor;
        break;
    case M_ADMIN_STOP:
        desc = &kolo__stop_job_request__descriptor;
        break;
    case M_ADMIN_GET_JOB:
        desc = &kolo__get_job_request__descriptor;
        break;
    case M_ADMIN_LIST_JOBS:
        desc = &kolo__list_jobs_request__descriptor;
        break;
    case M_ADMIN_LIST_HOSTS:
        desc = &kolo__list_hosts_request__descriptor;
        break;
    case M_ADMIN_STREAM:
        desc = &kolo__stream_output_request__descriptor;
        break;
    case M_ADMIN_DRAIN:
        desc = &kolo__drain_host_request__descriptor;
        break;
    default:
        admin_error(c, call, m, KOLO_ENOMETHOD, "unknown method '%s'", f->method);
        return;
    }
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, f->body_len, f->body);
    if (!msg) {
        admin_error(c, call, m, KOLO_EPROTO, "malformed %s request", f->method);
        return;
    }
    char err[512] = "";
    switch (m) {
    case M_ADMIN_SUBMIT: {
        Kolo__SubmitJobRequest *req = (Kolo__SubmitJobRequest *)msg;
        uint64_t id = 0;
        struct elastic_opts eo = {.elastic = req->elastic,
                                  .min_np = req->min_np,
                                  .max_np = req->max_np,
                                  .reset_limit = req->reset_limit,
                                  .cooldown_lo_s = req->cooldown_lo_s,
                                  .cooldown_hi_s = req->cooldown_hi_s,
                                  .timeout_ms = req->elastic_timeout_ms,
                                  .discovery = req->discovery_script,
                                  .slots_per_host = req->slots_per_host,
                                  .spares = req->spares,
                                  .straggler_policy = req->straggler_policy,
                                  .straggler_window_ms = req->straggler_window_ms};
        struct job_request rq = {.argv = req->argv,
                                 .argc = (int)req->n_argv,
                                 .env = req->env,
                                 .nenv = (int)req->n_env,
                                 .cwd = req->cwd,
                                 .np = req->np,
                                 .hosts = req->hosts,
                                 .name = req->name,
                                 .start_timeout_ms = req->start_timeout_ms,
                                 .eo = &eo,
                                 .meta = req->metadata,
                                 .nmeta = (int)req->n_metadata};
        int rv = coord_job_submit(c, &rq, &id, err, sizeof(err));
        if (rv) {
            admin_error(c, call, m, rv, "%s", err);
            break;
        }
        Kolo__SubmitJobReply rep = KOLO__SUBMIT_JOB_REPLY__INIT;
        rep.job_id = id;
        coord_send_pb(call, &rep.base);
        break;
    }
    case M_ADMIN_STOP: {
        Kolo__StopJobRequest *req = (Kolo__StopJobRequest *)msg;
        struct job *j = coord_job_find(c, req->job_id);
        if (!j) {
            admin_error(c, call, m, KOLO_ENOTFOUND, "%s", "no such job");
            break;
        }
        coord_job_stop(c, j, req->reason);
        Kolo__StopJobReply rep = KOLO__STOP_JOB_REPLY__INIT;
        rep.state = (char *)job_state_names[j->state];
        coord_send_pb(call, &rep.base);
        break;
    }
    case M_ADMIN_GET_JOB: {
        Kolo__GetJobRequest *req = (Kolo__GetJobRequest *)msg;
        struct job *j = coord_job_find(c, req->job_id);
        if (!j) {
            admin_error(c, call, m, KOLO_ENOTFOUND, "%s", "no such job");
            break;
        }
        Kolo__JobInfo ji;
        job_info_fill(j, &ji, true);
        coord_send_pb(call, &ji.base);
        job_info_clear(&ji);
        break;
    }
    case M_ADMIN_LIST_JOBS: {
        Kolo__ListJobsRequest *req = (Kolo__ListJobsRequest *)msg;
        size_t total = 0;
        for (struct job *j = c->jobs; j; j = j->next)
            total++;
        size_t limit = req->limit ? req->limit : 100;
        size_t skip = total > limit ? total - limit : 0, n = 0;
        Kolo__JobInfo *infos = calloc(total - skip + 1, sizeof(*infos));
        Kolo__JobInfo **ptrs = calloc(total - skip + 1, sizeof(*ptrs));
        if (!infos || !ptrs) {
            free(infos);
            free(ptrs);
            admin_error(c, call, m, KOLO_ENOMEM, "%s", "out of memory");
            break;
        }
        size_t i = 0;
        for (struct job *j = c->jobs; j; j = j->next, i++) {
            if (i < skip)
                continue;
            job_info_fill(j, &infos[n], false);
            ptrs[n] = &infos[n];
            n++;
        }
        Kolo__ListJobsReply rep = KOLO__LIST_JOBS_REPLY__INIT;
        rep.n_jobs = n;
        rep.jobs = ptrs;
        coord_send_pb(call, &rep.base);
        free(infos);
        free(ptrs);
        break;
    }
    case M_ADMIN_DRAIN: {
        Kolo__DrainHostRequest *req = (Kolo__DrainHostRequest *)msg;
        struct host *h = coord_host_named(c, req->host);
        if (!h) {
            admin_error(c, call, m, KOLO_ENOTFOUND, "no such host '%s'", req->host);
            break;
        }
        coord_host_drain(c, h, !req->undrain, req->leaving,
                         req->leaving   ? "its agent's shutdown"
                         : req->undrain ? "kolo undrain"
                                        : "kolo drain");
        Kolo__HostInfo info;
        Kolo__HostInventory inv;
        host_info_fill(c, h, &info, &inv, now_mono_ms());
        coord_send_pb(call, &info.base);
        break;
    }
    case M_ADMIN_LIST_HOSTS: {
        size_t total = 0;
        for (struct host *h = c->hosts; h; h = h->next)
            total++;
        Kolo__HostInfo *infos = calloc(total + 1, sizeof(*infos));
        Kolo__HostInfo **ptrs = calloc(total + 1, sizeof(*ptrs));
        Kolo__HostInventory *inv = calloc(total + 1, sizeof(*inv));
        if (!infos || !ptrs || !inv) {
            free(infos);
            free(ptrs);
            free(inv);
            admin_error(c, call, m, KOLO_ENOMEM, "%s", "out of memory");
            break;
        }
        size_t n = 0;
        uint64_t now = now_mono_ms();
        for (struct host *h = c->hosts; h; h = h->next, n++) {
            host_info_fill(c, h, &infos[n], &inv[n], now);
            ptrs[n] = &infos[n];
        }
        Kolo__ListHostsReply rep = KOLO__LIST_HOSTS_REPLY__INIT;
        rep.n_hosts = n;
        rep.hosts = ptrs;
        coord_send_pb(call, &rep.base);
        free(infos);
        free(ptrs);
        free(inv);
        break;
    }
    case M_ADMIN_STREAM: {
        Kolo__StreamOutputRequest *req = (Kolo__StreamOutputRequest *)msg;
        struct job *j = coord_job_find(c, req->job_id);
        if (!j) {
            admin_error(c, call, m, KOLO_ENOTFOUND, "%s", "no such job");
            break;
        }
        uint32_t max = req->max_lines ? req->max_lines : OUTPUT_DEFAULT_LINES;
        if (max > OUTPUT_MAX_LINES)
            max = OUTPUT_MAX_LINES;
        uint32_t wait = req->wait_ms > STREAM_MAX_WAIT_MS ? STREAM_MAX_WAIT_MS : req->wait_ms;
        struct waiter ask = {.call = call,
                             .after_seq = req->after_seq,
                             .max_lines = max,
                             .notices = req->notices,
                             .after_notice = req->after_notice};
        if (stream_answer(c, j, call, &ask, wait == 0))
            break;
        struct waiter *w = calloc(1, sizeof(*w));
        if (!w) {
            admin_error(c, call, m, KOLO_ENOMEM, "%s", "out of memory");
            break;
        }
        *w = ask;
        w->deadline = now_mono_ms() + wait;
        w->next = j->waiters;
        j->waiters = w;
        break;
    }
    default:
        break;
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}

/* coord_worker_fence is the check every worker request passes: the job
 * runs, the caller's generation is the current one, its rank exists. On
 * failure the call is answered (and counted against m) and NULL returned. */
struct job *coord_worker_fence(struct coord *c, struct rpc_call *call, enum coord_method m)
{
    return coord_worker_fence_past(c, call, m, NULL);
}

struct job *coord_worker_fence_past(struct coord *c, struct rpc_call *call, enum coord_method m,
                                    bool *past)
{
    const struct rpc_frame *f = rpc_call_frame(call);
    struct job *j = coord_job_find(c, f->job_id);
    const char *bad = NULL;
    int code = KOLO_EINVAL;
    if (past)
        *past = false;
    if (!j)
        bad = "no such job";
    else if (j->state != JOB_RUNNING) {
        bad = "the job is not running";
        code = KOLO_ESHUTDOWN;
    } else if (past && f->generation && f->generation < j->generation) {
        *past = true; /* what an earlier generation did: its rank need not exist now */
        if (f->rank < 0)
            bad = "rank out of range";
    } else if (f->generation != j->generation) {
        c->m.stale_generation++;
        rpc_call_error(call, KOLO_ESTALE,
                       "stale generation %llu: job %llu is at generation %llu",
                       (unsigned long long)f->generation, (unsigned long long)j->id,
                       (unsigned long long)j->generation);
        c->m.rpc_errors[m]++;
        return NULL;
    } else if (f->rank < 0 || f->rank >= j->nranks)
        bad = "rank out of range";
    if (bad) {
        c->m.rpc_errors[m]++;
        rpc_call_error(call, code, "%s (job %llu, rank %d)", bad, (unsigned long long)f->job_id,
                       f->rank);
        return NULL;
    }
    return j;
}

void coord_jobs_shutdown(struct coord *c)
{
    for (struct job *j = c->jobs; j; j = j->next) {
        c->hooks.job_shutdown(c, j);
        struct waiter *w = j->waiters;
        j->waiters = NULL;
        while (w) {
            struct waiter *next = w->next;
            rpc_call_error(w->call, KOLO_ESHUTDOWN, "the coordinator is shutting down");
            free(w);
            w = next;
        }
    }
}

void coord_jobs_free(struct coord *c)
{
    struct job *j = c->jobs;
    while (j) {
        struct job *next = j->next;
        job_free(c, j);
        j = next;
    }
    c->jobs = NULL;
}
