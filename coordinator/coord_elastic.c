/*
 * coord_elastic.c - elastic jobs: generations, exclusion, growing back.
 *
 * An elastic job's workers are processes with a worker id (wid) that they
 * keep for life; a generation maps the wids alive in it to ranks. Every
 * membership change closes the current generation and forms the next:
 *
 *   - a member exits non-zero, or its host's lease expires, or its agent
 *     restarts: the host is excluded (see below) and the generation closes
 *     at once, since its ring is broken. Its negotiation log ends with an
 *     error, so every survivor's pending operation fails fast
 *     (HorovodInternalError), and the survivors ask for their new place;
 *   - a worker asks for its place while it is a joined member of the
 *     current generation: it reset on its own (a data-plane error the
 *     coordinator did not see yet, or HostsUpdatedInterrupt), so the
 *     generation closes and the next one forms with the same members plus
 *     whatever capacity is there;
 *   - capacity appears (a new or returning host, an exclusion that cooled
 *     down) while the job is below max_np, or a member's host is drained:
 *     nothing closes yet. The workers are told (hosts_updated_ms in every
 *     negotiation reply), Horovod-style: rank 0 raises HostsUpdatedInterrupt
 *     on every rank at the next commit or check_host_updates, they reset
 *     without rolling back, and their requests for a place form the next
 *     generation.
 *
 * Forming: survivors keep their relative order, so rank 0 stays rank 0
 * while it lives; hosts are taken in the order of their lowest surviving
 * rank, then hosts with no survivor in registration order, and each host
 * is filled (survivors first, then newcomers) up to max_np. Newcomers get
 * new wids and reach their agent through its desired set; members that
 * are not in the new generation leave the desired sets, so their agents
 * stop them. Below min_np the job waits, with the reason visible, until
 * capacity returns or the elastic timeout passes, and then fails cleanly.
 * Survivors waiting meanwhile are parked in their place request, which
 * they repeat until their own deadline: nothing deadlocks.
 *
 * Exclusion: a host whose worker failed (or whose lease expired) gets no
 * new worker of this job for a while; members still alive on it stay. Without a cooldown range it stays out for
 * good, as in Horovod. With --blacklist-cooldown-range LO HI the n-th
 * exclusion of a host lasts
 *
 *     delay(n) = min(HI, LO * 2^(n-1)) * (1 + u/4),  u uniform in [0, 1)
 *
 * clamped to HI: LO, 2 LO, 4 LO, ... with up to 25% jitter so that hosts
 * that failed together do not all return in the same instant. (Horovod
 * starts at 2 LO because it counts before use; we start at LO, which is
 * what its documentation says.)
 *
 * Reset limit: every generation after the first is a reset; the one that
 * would exceed --reset-limit fails the job instead, with that reason.
 */
#include "coord_elastic.h"
#include "coord_core.h"
#include "coord_hosts.h"
#include "coord_jobs.h"
#include "coord_negot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "capture.h"
#include "errors.h"
#include "json.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "placement.h"
#include "util.h"

#define ELASTIC_DEFAULT_TIMEOUT_MS 600000u
#define ASSIGN_MAX_WAIT_MS         30000u
/* A rank that resets on its own (its collective failed) usually does so
 * because a peer died, a moment before that peer's agent reports the
 * death. The coordinator waits this long for such a report before it
 * forms a generation for the reset alone, so that one failure makes one
 * new generation, without the dead worker and with the true cause. */
#define RESET_GRACE_MS             250u

struct disc_host {
    char name[PLACE_MAX_HOST_NAME];
    int slots;
};

/* A worker waiting for its place in a generation that has not formed. */
struct parked_assign {
    struct parked_assign *next;
    struct rpc_call *call;
    uint64_t wid;
    uint64_t deadline; /* monotonic */
    uint32_t wait_ms;  /* what the worker asked to wait at most */
    /* a reset in its grace (RESET_GRACE_MS): the generation it left and
     * its rank there; 0 for a plain wait for capacity */
    uint64_t reset_gen;
    int reset_rank;
};


/* ---------------------------------------------------------------- lifetime */

int coord_elastic_init(struct job *j, const struct elastic_opts *o, char *err, size_t errlen)
{
    int min_np = o->min_np, max_np = o->max_np, reset_limit = o->reset_limit;
    uint32_t lo_s = o->cooldown_lo_s, hi_s = o->cooldown_hi_s, timeout_ms = o->timeout_ms;
    const char *discovery = o->discovery;
    int slots_per_host = o->slots_per_host;
    if (min_np <= 0)
        min_np = j->np;
    if (max_np <= 0)
        max_np = j->np;
    if (min_np > j->np || j->np > max_np || max_np > COORD_MAX_NP) {
        snprintf(err, errlen, "elastic sizes must satisfy min-np <= np <= max-np <= %d (got %d, %d, %d)",
                 COORD_MAX_NP, min_np, j->np, max_np);
        return KOLO_EINVAL;
    }
    if (reset_limit < 0) {
        snprintf(err, errlen, "reset limit must be >= 0");
        return KOLO_EINVAL;
    }
    if ((lo_s || hi_s) && (lo_s < 1 || hi_s > 3600 || lo_s > hi_s)) {
        snprintf(err, errlen,
                 "blacklist cooldown range must be LO HI with 1 <= LO <= HI <= 3600 (got %u %u)",
                 lo_s, hi_s);
        return KOLO_EINVAL;
    }
    if (slots_per_host < 0 || slots_per_host > 65536) {
        snprintf(err, errlen, "slots per host must be between 0 and 65536");
        return KOLO_EINVAL;
    }
    if (o->spares < 0 || o->spares > 1024) {
        snprintf(err, errlen, "spares must be between 0 and 1024");
        return KOLO_EINVAL;
    }
    struct elastic *el = calloc(1, sizeof(*el));
    if (!el)
        return KOLO_ENOMEM;
    el->min_np = min_np;
    el->max_np = max_np;
    el->reset_limit = reset_limit;
    el->cooldown_lo_s = lo_s;
    el->cooldown_hi_s = hi_s;
    el->timeout_ms = timeout_ms ? timeout_ms : ELASTIC_DEFAULT_TIMEOUT_MS;
    el->slots_per_host = slots_per_host;
    el->spares_want = o->spares;
    if (discovery && discovery[0] && !(el->discovery = strdup(discovery))) {
        free(el);
        return KOLO_ENOMEM;
    }
    j->el = el;
    return 0;
}

static void drop_assigns(struct elastic *el, int code, const char *why)
{
    while (el->assign) {
        struct parked_assign *p = el->assign;
        el->assign = p->next;
        rpc_call_error(p->call, code, "%s", why);
        free(p);
    }
}

void coord_elastic_shutdown(struct coord *c, struct job *j)
{
    (void)c;
    if (j->el)
        drop_assigns(j->el, KOLO_EIO, COORD_STOPPING_WHY); /* retried, as in coord_negot.c */
}

void coord_elastic_free(struct elastic *el)
{
    if (!el)
        return;
    while (el->excl) {
        struct exclusion *x = el->excl;
        el->excl = x->next;
        free(x);
    }
    drop_assigns(el, KOLO_ESHUTDOWN, "the job is gone");
    free(el->discovery);
    free(el->wait_cause);
    free(el->disc);
    free(el->disc_error);
    free(el);
}

/* ---------------------------------------------------------------- persistence */

/* The elastic settings and the state a restart must not forget (resets,
 * exclusions as remaining time), as JSON in the job's row. */
char *coord_elastic_to_json(const struct job *j)
{
    const struct elastic *el = j->el;
    if (!el)
        return NULL;
    struct buf b;
    struct jw w;
    buf_init(&b);
    jw_init(&w, &b);
    jw_obj_begin(&w);
    jw_key(&w, "min_np");
    jw_int(&w, el->min_np);
    jw_key(&w, "max_np");
    jw_int(&w, el->max_np);
    jw_key(&w, "reset_limit");
    jw_int(&w, el->reset_limit);
    jw_key(&w, "resets");
    jw_int(&w, el->resets);
    jw_key(&w, "cooldown_lo_s");
    jw_int(&w, el->cooldown_lo_s);
    jw_key(&w, "cooldown_hi_s");
    jw_int(&w, el->cooldown_hi_s);
    jw_key(&w, "timeout_ms");
    jw_int(&w, el->timeout_ms);
    jw_key(&w, "slots_per_host");
    jw_int(&w, el->slots_per_host);
    jw_key(&w, "spares");
    jw_int(&w, el->spares_want);
    jw_key(&w, "discovery");
    if (el->discovery)
        jw_str(&w, el->discovery);
    else
        jw_null(&w);
    jw_key(&w, "next_wid");
    jw_int(&w, (int64_t)j->next_wid);
    jw_key(&w, "straggler_exclude");
    jw_bool(&w, j->straggler_exclude);
    jw_key(&w, "straggler_window_ms");
    jw_int(&w, j->straggler_window_ms);
    jw_key(&w, "excluded");
    jw_arr_begin(&w);
    uint64_t now = now_mono_ms();
    for (const struct exclusion *x = el->excl; x; x = x->next) {
        jw_obj_begin(&w);
        jw_key(&w, "host_id");
        jw_str(&w, x->host_id);
        jw_key(&w, "count");
        jw_int(&w, x->count);
        jw_key(&w, "active");
        jw_bool(&w, x->active);
        jw_key(&w, "evict");
        jw_bool(&w, x->evict);
        jw_key(&w, "remaining_ms");
        jw_int(&w, !x->active ? 0 : x->until == 0 ? -1 : x->until > now ? (int64_t)(x->until - now) : 0);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    char *out = b.oom ? NULL : buf_steal(&b, NULL);
    buf_free(&b);
    return out;
}

static int64_t jint(const struct json *obj, const char *key, int64_t dflt)
{
    int64_t v;
    return json_as_int(json_get(obj, key), &v) ? v : dflt;
}

void coord_elastic_from_json(struct job *j, const char *text)
{
    struct json *root = NULL;
    char perr[128];
    if (!text || !text[0] || json_parse(text, strlen(text), &root, perr, sizeof(perr)) != 0)
        return;
    char err[256];
    const struct json *dv = json_get(root, "discovery");
    const char *disc = dv && dv->type == JSON_STRING ? dv->str : NULL;
    struct elastic_opts o = {.elastic = true,
                             .min_np = (int)jint(root, "min_np", 0),
                             .max_np = (int)jint(root, "max_np", 0),
                             .reset_limit = (int)jint(root, "reset_limit", 0),
                             .cooldown_lo_s = (uint32_t)jint(root, "cooldown_lo_s", 0),
                             .cooldown_hi_s = (uint32_t)jint(root, "cooldown_hi_s", 0),
                             .timeout_ms = (uint32_t)jint(root, "timeout_ms", 0),
                             .discovery = disc,
                             .slots_per_host = (int)jint(root, "slots_per_host", 0),
                             .spares = (int)jint(root, "spares", 0)};
    const struct json *se = json_get(root, "straggler_exclude");
    j->straggler_exclude = se && se->type == JSON_BOOL && se->b;
    j->straggler_window_ms = (uint32_t)jint(root, "straggler_window_ms", STRAGGLER_WINDOW_MS);
    if (coord_elastic_init(j, &o, err, sizeof(err)) != 0) {
        LOGW("coord", "job %llu: cannot reload its elastic settings: %s",
             (unsigned long long)j->id, err);
        json_free(root);
        return;
    }
    j->el->resets = (int)jint(root, "resets", 0);
    uint64_t wid = (uint64_t)jint(root, "next_wid", 0);
    if (wid > j->next_wid)
        j->next_wid = wid;
    const struct json *xs = json_get(root, "excluded");
    uint64_t now = now_mono_ms();
    for (size_t i = 0; xs && xs->type == JSON_ARRAY && i < xs->count; i++) {
        const struct json *o = json_at(xs, i);
        const struct json *idv = json_get(o, "host_id");
        const char *id = idv && idv->type == JSON_STRING ? idv->str : NULL;
        struct exclusion *x = calloc(1, sizeof(*x));
        if (!id || !x) {
            free(x);
            continue;
        }
        str_copy(x->host_id, id, sizeof(x->host_id));
        x->count = (int)jint(o, "count", 1);
        const struct json *av = json_get(o, "active");
        x->active = av && av->type == JSON_BOOL && av->b;
        const struct json *ev = json_get(o, "evict");
        x->evict = x->active && ev && ev->type == JSON_BOOL && ev->b;
        int64_t rem = jint(o, "remaining_ms", 0);
        x->until = rem < 0 ? 0 : now + (uint64_t)rem;
        x->next = j->el->excl;
        j->el->excl = x;
    }
    json_free(root);
}

/* ---------------------------------------------------------------- hosts */

static struct exclusion *exclusion_find(struct elastic *el, const char *host_id)
{
    for (struct exclusion *x = el->excl; x; x = x->next)
        if (strcmp(x->host_id, host_id) == 0)
            return x;
    return NULL;
}

static uint64_t cooldown_ms(const struct elastic *el, int count)
{
    double lo = el->cooldown_lo_s, hi = el->cooldown_hi_s;
    double d = lo;
    for (int i = 1; i < count && d < hi; i++)
        d *= 2;
    if (d > hi)
        d = hi;
    uint32_t u = 0;
    random_bytes(&u, sizeof(u));
    d *= 1.0 + (double)u / 4294967296.0 / 4.0;
    if (d > hi)
        d = hi;
    return (uint64_t)(d * 1000.0);
}

static void exclude_host(struct coord *c, struct job *j, struct host *h, const char *why)
{
    struct elastic *el = j->el;
    struct exclusion *x = exclusion_find(el, h->id);
    if (!x) {
        x = calloc(1, sizeof(*x));
        if (!x)
            return;
        str_copy(x->host_id, h->id, sizeof(x->host_id));
        x->next = el->excl;
        el->excl = x;
    }
    x->count++;
    x->active = true;
    c->m.exclusions++;
    if (el->cooldown_lo_s) {
        uint64_t d = cooldown_ms(el, x->count);
        x->until = now_mono_ms() + d;
        coord_event(c, j->id, h->id, "host.excluded",
                    "host %s excluded from job %llu for %.1f s (exclusion %d): %s", h->name,
                    (unsigned long long)j->id, (double)d / 1000.0, x->count, why);
    } else {
        x->until = 0;
        coord_event(c, j->id, h->id, "host.excluded",
                    "host %s excluded from job %llu for good (no cooldown range): %s", h->name,
                    (unsigned long long)j->id, why);
    }
}

/* The discovery entry for h, or NULL. */
static const struct disc_host *disc_find(const struct elastic *el, const struct host *h)
{
    for (int i = 0; i < el->ndisc; i++)
        if (strcmp(el->disc[i].name, h->name) == 0 || strcmp(el->disc[i].name, h->hostname) == 0 ||
            strcmp(el->disc[i].name, h->id) == 0)
            return &el->disc[i];
    return NULL;
}

/* Slots of h this job may use at most (0: none), before other jobs' use. */
static int job_slots_on(const struct job *j, const struct host *h)
{
    int slots = h->slots;
    if (j->el && j->el->discovery) {
        const struct disc_host *d = disc_find(j->el, h);
        if (!d)
            return 0;
        int ds = d->slots > 0 ? d->slots : j->el->slots_per_host > 0 ? j->el->slots_per_host : h->slots;
        if (ds < slots)
            slots = ds;
    }
    if (j->hosts && j->hosts[0]) {
        struct place_spec_entry spec[256];
        char err[128];
        int n = place_parse_hosts(j->hosts, spec, 256, err, sizeof(err));
        int found = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(spec[i].name, h->name) == 0 || strcmp(spec[i].name, h->hostname) == 0 ||
                strcmp(spec[i].name, h->id) == 0)
                found += spec[i].slots;
        if (found < slots)
            slots = found;
    }
    return slots;
}

bool coord_elastic_host_usable(struct coord *c, struct job *j, const struct host *h)
{
    (void)c;
    if (h->state != HOST_ALIVE || h->drained)
        return false;
    if (!j->el)
        return true;
    const struct exclusion *x = exclusion_find(j->el, h->id);
    if (x && x->active)
        return false;
    return job_slots_on(j, h) > 0;
}

/* Free slots of h for job j: its limit minus what other jobs use there. */
static int free_for_job(struct coord *c, struct job *j, struct host *h)
{
    if (!coord_elastic_host_usable(c, j, h))
        return 0;
    int used = 0;
    for (struct job *o = c->jobs; o; o = o->next) {
        if (o == j || o->state != JOB_RUNNING)
            continue;
        for (int r = 0; r < o->nranks; r++)
            if (o->ranks[r].host == h &&
                (o->ranks[r].state == RANK_ASSIGNED || o->ranks[r].state == RANK_RUNNING))
                used++;
        for (int s = 0; s < o->nspares; s++)
            used += o->spares[s].host == h;
    }
    int room = h->slots - used, lim = job_slots_on(j, h);
    return room < lim ? (room > 0 ? room : 0) : lim;
}

int coord_elastic_free_slots(struct coord *c, struct job *j, struct host *h)
{
    return free_for_job(c, j, h);
}

/* ---------------------------------------------------------------- planning */

static bool member_alive(const struct rank *r)
{
    return r->state == RANK_ASSIGNED || r->state == RANK_RUNNING;
}

static int alive_members(const struct job *j)
{
    int n = 0;
    for (int r = 0; r < j->nranks; r++)
        n += member_alive(&j->ranks[r]);
    return n;
}

/* Members alive on r's host with a lower rank than r. */
static int members_before(const struct job *j, const struct rank *r)
{
    int k = 0;
    for (const struct rank *q = j->ranks; q < r; q++)
        k += q->host == r->host && member_alive(q);
    return k;
}

/* A member that stays in the next generation: alive, on a live host that
 * is not drained. Exclusion does not remove it: exclusion only keeps new
 * workers off a host (unlike Horovod, which drops every slot of the host,
 * healthy siblings included: they would be killed for nothing, and the
 * job would reset once more when they are replaced). */
static bool survives(const struct job *j, const struct rank *r)
{
    if (!member_alive(r) || !r->host || r->host->state != HOST_ALIVE || r->host->drained)
        return false;
    const struct exclusion *x = exclusion_find(j->el, r->host->id);
    if (x && x->active && x->evict)
        return false; /* a straggler's host: its members leave too */
    if (!j->el->discovery)
        return true;
    /* a host the discovery script no longer lists is left, as if drained */
    if (!disc_find(j->el, r->host))
        return false;
    /* one it lists with fewer slots keeps its lowest ranks (Horovod removes
     * the extra slots) */
    return members_before(j, r) < job_slots_on(j, r->host);
}

/* ---------------------------------------------------------------- hot spares
 *
 * --spares K: K workers of the job started beyond its generation, each
 * blocked in hvd.init() (its place request parked, answered "spare, keep
 * asking" every ASSIGN_MAX_WAIT_MS), costing no CPU. plan() takes them
 * before it starts anything: a lost rank's place goes to a process that
 * already imported everything, and the job is back at full size without
 * a process start. spares_fill starts new ones on free slots (never while
 * the job could grow: growing takes spares too). A spare stays on a host
 * excluded after a failure (exclusion keeps new workers off it; a spare
 * is not new); one on a lost or drained host is dropped.
 *
 * Growing goes the same way, with or without --spares: room to grow into
 * gets a spare first, and the workers hear of the capacity only once it
 * waits in hvd.init() (in_init), so they do not stop at a commit to wait
 * while a new process imports its libraries. After SPARE_FAILURES_MAX
 * spares died unplaced, growing starts processes in the generation again. */

#define SPARE_FAILURES_MAX 3 /* spares in a row that die unplaced: no more are started */

static int spare_find(const struct job *j, uint64_t wid)
{
    for (int s = 0; s < j->nspares; s++)
        if (j->spares[s].wid == wid)
            return s;
    return -1;
}

static bool spare_usable(const struct rank *s)
{
    return s->host && s->host->state == HOST_ALIVE && !s->host->drained;
}

static int spares_on(const struct job *j, const struct host *h)
{
    int n = 0;
    for (int s = 0; s < j->nspares; s++)
        n += j->spares[s].host == h;
    return n;
}

/* Whether spare s still has a slot of its host: the host discovery script
 * (or -H) may list fewer slots now; the members come first. */
static bool spare_has_slot(const struct job *j, int s)
{
    const struct host *h = j->spares[s].host;
    int used = 0;
    for (int r = 0; r < j->nranks; r++)
        used += j->ranks[r].host == h && member_alive(&j->ranks[r]);
    for (int k = 0; k < s; k++)
        used += j->spares[k].host == h;
    return used < job_slots_on(j, h);
}

static void spare_remove(struct job *j, int s)
{
    j->spares[s] = j->spares[--j->nspares];
}

/* Plans the next generation: survivors (members alive on usable hosts)
 * keep their order, then newcomers fill up to max_np. Returns the number
 * of ranks (0 when out of memory) in *out (caller frees). */
static int plan(struct coord *c, struct job *j, struct rank **out)
{
    int nhosts = 0;
    for (struct host *h = c->hosts; h; h = h->next)
        nhosts++;
    struct host **order = calloc((size_t)nhosts + 1, sizeof(*order));
    struct rank *next = calloc((size_t)j->el->max_np + 1, sizeof(*next));
    bool *taken = calloc((size_t)j->nspares + 1, sizeof(*taken)); /* spares planned in */
    int n = 0, no = 0;
    if (!order || !next || !taken)
        goto fail;
    /* Hosts of survivors, by their lowest surviving rank. */
    for (int r = 0; r < j->nranks; r++) {
        struct rank *rk = &j->ranks[r];
        if (!survives(j, rk))
            continue;
        bool seen = false;
        for (int k = 0; k < no && !seen; k++)
            seen = order[k] == rk->host;
        if (!seen)
            order[no++] = rk->host;
    }
    /* then hosts with hot spares, whose processes are up already */
    for (int s = 0; s < j->nspares; s++) {
        bool seen = false;
        for (int k = 0; k < no && !seen; k++)
            seen = order[k] == j->spares[s].host;
        if (!seen && spare_usable(&j->spares[s]))
            order[no++] = j->spares[s].host;
    }
    for (struct host *h = c->hosts; h; h = h->next) {
        bool seen = false;
        for (int k = 0; k < no && !seen; k++)
            seen = order[k] == h;
        if (!seen && coord_elastic_host_usable(c, j, h))
            order[no++] = h;
    }
    int survivors = 0;
    for (int r = 0; r < j->nranks; r++)
        if (survives(j, &j->ranks[r]))
            survivors++;
    int budget = j->el->finishing ? 0 : j->el->max_np - survivors;
    for (int k = 0; k < no; k++) {
        struct host *h = order[k];
        int room = free_for_job(c, j, h);
        int first = n;
        for (int r = 0; r < j->nranks && n < j->el->max_np; r++) {
            struct rank *rk = &j->ranks[r];
            if (rk->host == h && survives(j, rk)) {
                next[n] = *rk;
                next[n].rank = n;
                n++;
            }
        }
        int here = n - first, left = 0;
        for (int s = 0; s < j->nspares; s++) {
            const struct rank *sp = &j->spares[s];
            if (sp->host != h || !spare_usable(sp))
                continue;
            if (budget > 0 && n < j->el->max_np) {
                next[n] = *sp; /* no room check: it holds its slot already */
                next[n].rank = n;
                taken[s] = true;
                n++;
                here++;
                budget--;
            } else {
                left++;
            }
        }
        while (budget > 0 && here + left < room && n < j->el->max_np) {
            next[n] = (struct rank){.rank = n, .host = h, .state = RANK_ASSIGNED};
            str_copy(next[n].host_id, h->id, sizeof(next[n].host_id));
            n++;
            here++;
            budget--;
        }
    }
    /* local and cross ranks, as placement.c computes them */
    for (int r = 0; r < n; r++) {
        int local = 0, lsize = 0;
        for (int q = 0; q < n; q++) {
            if (next[q].host != next[r].host)
                continue;
            if (q < r)
                local++;
            lsize++;
        }
        next[r].local_rank = local;
        next[r].local_size = lsize;
    }
    for (int r = 0; r < n; r++) {
        int cross = 0, csize = 0;
        for (int k = 0; k < no; k++) {
            bool has = false;
            for (int q = 0; q < n && !has; q++)
                has = next[q].host == order[k] && next[q].local_rank == next[r].local_rank;
            if (!has)
                continue;
            if (order[k] == next[r].host)
                cross = csize;
            csize++;
        }
        next[r].cross_rank = cross;
        next[r].cross_size = csize;
        next[r].exit_code = 0;
        next[r].term_signal = 0;
    }
    free(order);
    free(taken);
    *out = next;
    return n;
fail:
    free(order);
    free(next);
    free(taken);
    *out = NULL;
    return 0;
}

/* Slots free for new processes of the job: beyond its members and spares. */
static int free_slots(struct coord *c, struct job *j)
{
    int room = 0;
    for (struct host *h = c->hosts; h; h = h->next) {
        int members = 0;
        for (int r = 0; r < j->nranks; r++)
            members += j->ranks[r].host == h && member_alive(&j->ranks[r]);
        int f = free_for_job(c, j, h) - members - spares_on(j, h);
        if (f > 0)
            room += f;
    }
    return room;
}

/* Count of newcomers a plan would add now (capacity check, no side effects). */
static int room_to_grow(struct coord *c, struct job *j)
{
    if (j->el->finishing || j->nranks >= j->el->max_np)
        return 0;
    int room = j->el->spare_failures >= SPARE_FAILURES_MAX ? free_slots(c, j) : 0;
    for (int s = 0; s < j->nspares; s++) /* a spare waiting in hvd.init() */
        room += spare_usable(&j->spares[s]) && j->spares[s].in_init;
    int want = j->el->max_np - j->nranks;
    return room < want ? room : want;
}

/* ---------------------------------------------------------------- generations */

static void assign_answer(struct job *j, struct rpc_call *call, uint64_t wid);

static void wake_assigns(struct coord *c, struct job *j)
{
    (void)c;
    struct parked_assign **pp = &j->el->assign;
    while (*pp) {
        struct parked_assign *p = *pp;
        int idx = coord_job_member(j, p->wid);
        if (idx < 0 && spare_find(j, p->wid) >= 0) {
            pp = &p->next; /* still a spare: it waits on */
        } else if (!j->el->waiting || idx < 0) {
            *pp = p->next;
            assign_answer(j, p->call, p->wid);
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

/* Makes ranks[0..n) the current generation. */
static void form(struct coord *c, struct job *j, struct rank *ranks, int n, const char *cause)
{
    struct elastic *el = j->el;
    struct store_rank *sr = calloc((size_t)n + 1, sizeof(*sr));
    /* Hosts that ran members must hear about the change too (to stop them). */
    coord_job_hosts_wake(c, j);
    free(j->ranks);
    j->ranks = ranks;
    j->nranks = n;
    j->generation++;
    el->waiting = false;
    el->wait_deadline = 0;
    el->update_ms = 0;
    el->update_kind = 0;
    el->leave_why[0] = '\0';
    if (j->generation > 1) {
        el->resets++;
        c->m.generations++;
    }
    uint64_t now = now_mono_ms();
    char took[200] = "";
    int ntook = 0;
    for (int r = 0; r < n; r++) {
        int s = ranks[r].wid ? spare_find(j, ranks[r].wid) : -1;
        if (s < 0)
            continue;
        spare_remove(j, s); /* a member now */
        size_t used = strlen(took);
        if (used + 48 < sizeof took)
            snprintf(took + used, sizeof took - used, "%sworker %llu on %s", ntook ? ", " : "",
                     (unsigned long long)ranks[r].wid,
                     ranks[r].host ? ranks[r].host->name : ranks[r].host_id);
        ntook++;
    }
    if (ntook)
        el->spare_failures = 0;
    for (int r = 0; r < n; r++) {
        if (!ranks[r].wid)
            ranks[r].wid = ++j->next_wid; /* a newcomer */
        if (!ranks[r].unjoined_since)
            ranks[r].unjoined_since = now; /* until it joins (see frozen_member) */
    }
    for (int r = 0; sr && r < n; r++) {
        struct rank *rk = &ranks[r];
        sr[r] = (struct store_rank){.job_id = j->id,
                                    .generation = j->generation,
                                    .rank = r,
                                    .worker_id = rk->wid,
                                    .host_id = rk->host_id,
                                    .local_rank = rk->local_rank,
                                    .local_size = rk->local_size,
                                    .cross_rank = rk->cross_rank,
                                    .cross_size = rk->cross_size,
                                    .state = coord_rank_state_name(rk->state),
                                    .pid = rk->pid};
    }
    store_begin(c->store);
    if (store_generation_add(c->store, j->id, j->generation, cause, n, now_wall_ms()) != 0 ||
        (sr && store_ranks_put(c->store, sr, (size_t)n) != 0))
        coord_store_failed(c, "generation");
    free(j->reason);
    j->reason = strdup("");
    coord_job_persist(c, j);
    if (store_commit(c->store) != 0)
        coord_store_failed(c, "generation commit");
    free(sr);

    struct buf where;
    buf_init(&where);
    for (int r = 0; r < n; r++) {
        bool first = true;
        for (int q = 0; q < r && first; q++)
            first = ranks[q].host != ranks[r].host;
        if (!first)
            continue;
        buf_printf(&where, "%s%s:%d", where.len ? "," : "",
                   ranks[r].host ? ranks[r].host->name : ranks[r].host_id, ranks[r].local_size);
    }
    coord_event(c, j->id, NULL, "job.generation", "job %llu generation %llu: %d rank(s) on %s (%s)",
                (unsigned long long)j->id, (unsigned long long)j->generation, n, buf_cstr(&where),
                cause);
    buf_free(&where);
    if (ntook)
        coord_event(c, j->id, NULL, "job.spares",
                    "job %llu generation %llu took %d hot spare(s), no process start: %s",
                    (unsigned long long)j->id, (unsigned long long)j->generation, ntook, took);
    coord_job_hosts_wake(c, j);
    wake_assigns(c, j);
}

/* A member placed in generations for the whole elastic timeout without
 * joining any (it never came to the rendezvous) is frozen: a worker
 * stuck in its own code, or stopped. The others time out and ask again,
 * and without this every new generation would wait for it in turn. It is
 * treated like a failed worker: its host is excluded for a while, the
 * next generation forms without it, and its agent stops it. */
static bool frozen_member(struct coord *c, struct job *j, uint64_t now)
{
    for (int r = 0; r < j->nranks; r++) {
        struct rank *rk = &j->ranks[r];
        /* now may predate a generation formed earlier in this same pass */
        if (!member_alive(rk) || !rk->unjoined_since || now <= rk->unjoined_since ||
            now - rk->unjoined_since < (uint64_t)j->el->timeout_ms)
            continue;
        char why[300];
        snprintf(why, sizeof(why),
                 "rank %d (worker %llu, pid %d) on host %s did not join any generation for %u s "
                 "(the elastic timeout): stopped as frozen",
                 r, (unsigned long long)rk->wid, rk->pid, rk->host ? rk->host->name : rk->host_id,
                 j->el->timeout_ms / 1000);
        char what[64];
        snprintf(what, sizeof what, "when rank %d was declared frozen", r);
        c->hooks.job_stopping(c, j, what); /* before its state changes */
        rk->state = RANK_LOST;
        j->el->fail_streak = 0; /* not an error of the code's */
        coord_event(c, j->id, rk->host_id, "worker.frozen", "%s", why);
        coord_elastic_member_gone(c, j, rk->host, true, CAUSE_FAILURE, why);
        return true;
    }
    return false;
}

/* Closes the current generation: its pending operations fail at once. */
static void close_generation(struct coord *c, struct job *j, const char *why)
{
    coord_negot_job_ended(c, j, KOLO_EPEER, why);
}

/* Closes the generation and forms the next one, or waits for capacity. */
static void regroup(struct coord *c, struct job *j, enum elastic_cause cause, const char *why)
{
    struct elastic *el = j->el;
    if (j->state != JOB_RUNNING)
        return;
    close_generation(c, j, why);
    c->m.resets_by_cause[cause]++;
    if (!el->closed_mono)
        el->closed_mono = now_mono_ms();
    if ((cause == CAUSE_FAILURE || cause == CAUSE_HOST_LOST) && !el->rec_mono) {
        el->rec_mono = now_mono_ms(); /* a recovery starts (job.recovered) */
        el->rec_gen = el->rec_formed_ms = 0;
        str_copy(el->rec_why, why, sizeof el->rec_why);
    }
    if (el->fail_streak > 0 && alive_members(j) == 0) {
        /* Every member ended with an error of its own (Horovod's "all
         * workers failed"): the script is at fault, and a new generation
         * would only fail the same way, so the job fails now, with the
         * first error, instead of waiting for capacity. */
        char msg[900];
        snprintf(msg, sizeof msg,
                 "every worker failed with an error of its own (%d since the last generation "
                 "that formed), the first: %s; no new generation (the code, not the cluster)",
                 el->fail_streak, el->fail_first_why);
        coord_job_finish(c, j, JOB_FAILED, el->fail_first_code ? el->fail_first_code : 1, msg);
        return;
    }
    if (el->reset_limit > 0 && el->resets >= el->reset_limit) {
        char msg[700];
        snprintf(msg, sizeof(msg),
                 "the job was reset %d time(s), its reset limit; the last cause: %s", el->resets,
                 why);
        coord_job_finish(c, j, JOB_FAILED, 1, msg);
        return;
    }
    struct rank *ranks = NULL;
    int n = plan(c, j, &ranks);
    if (n >= el->min_np && ranks) {
        form(c, j, ranks, n, why);
        return;
    }
    free(ranks);
    if (!el->waiting) {
        el->waiting = true;
        el->wait_deadline = now_mono_ms() + el->timeout_ms;
        free(el->wait_cause);
        el->wait_cause = strdup(why);
    }
    char reason[700];
    snprintf(reason, sizeof(reason),
             "waiting for capacity: %d of min-np %d slot(s) usable (elastic timeout %u s) after: %s",
             n, el->min_np, el->timeout_ms / 1000, why);
    free(j->reason);
    j->reason = strdup(reason);
    coord_job_persist(c, j);
    coord_event(c, j->id, NULL, "job.waiting", "%s", reason);
    coord_job_hosts_wake(c, j);
}

void coord_elastic_member_gone(struct coord *c, struct job *j, struct host *h, bool exclude,
                               enum elastic_cause cause, const char *why)
{
    if (cause != CAUSE_FAILURE)
        j->el->fail_streak = 0; /* a host lost or left: the cluster, not the code */
    if (exclude && h)
        exclude_host(c, j, h, why);
    regroup(c, j, cause, why);
}

void coord_elastic_host_drained(struct coord *c, struct host *h)
{
    for (struct job *j = c->jobs; j; j = j->next) {
        if (!j->el || j->state != JOB_RUNNING)
            continue;
        bool member = false;
        for (int r = 0; r < j->nranks && !member; r++)
            member = j->ranks[r].host == h && member_alive(&j->ranks[r]);
        if (!member)
            continue;
        /* Graceful, as Horovod's removal: the workers reset at their next
         * commit (HostsUpdatedInterrupt, no rollback) and the next
         * generation leaves the host out. */
        j->el->update_ms = now_wall_ms();
        j->el->update_kind |= 1;
        snprintf(j->el->leave_why, sizeof j->el->leave_why, "host %s drained", h->name);
        coord_negot_hosts_updated(c, j);
        coord_event(c, j->id, h->id, "job.hosts_updated",
                    "host %s drained: job %llu will leave it at its next commit", h->name,
                    (unsigned long long)j->id);
    }
}

bool coord_elastic_spare_event(struct coord *c, struct job *j, struct host *h, uint64_t wid,
                               int kind, int pid, int exit_code, int term_signal)
{
    int s = j->el ? spare_find(j, wid) : -1;
    if (s < 0)
        return false;
    struct rank *sp = &j->spares[s];
    if (sp->host != h)
        return true; /* only its own host speaks for it */
    if (kind == KOLO__WORKER_EVENT_KIND__WORKER_STARTED) {
        sp->state = RANK_RUNNING;
        sp->pid = pid;
        return true;
    }
    if (kind != KOLO__WORKER_EVENT_KIND__WORKER_EXITED &&
        kind != KOLO__WORKER_EVENT_KIND__WORKER_SPAWN_FAILED)
        return true;
    if (j->state == JOB_RUNNING) {
        bool error = kind == KOLO__WORKER_EVENT_KIND__WORKER_SPAWN_FAILED ||
                     (exit_code != 0 && !term_signal);
        j->el->spare_failures += error;
        char how[64];
        if (term_signal)
            snprintf(how, sizeof how, "was killed by signal %d", term_signal);
        else if (kind == KOLO__WORKER_EVENT_KIND__WORKER_SPAWN_FAILED)
            snprintf(how, sizeof how, "could not start");
        else
            snprintf(how, sizeof how, "exited with code %d", exit_code);
        bool give_up = j->el->spare_failures >= SPARE_FAILURES_MAX;
        coord_event(c, j->id, h->id, "worker.spare_lost",
                    "hot spare worker %llu (pid %d) of job %llu on host %s %s%s",
                    (unsigned long long)wid, sp->pid, (unsigned long long)j->id, h->name, how,
                    give_up ? ": the last of 3 spares in a row that failed before a place was "
                              "theirs, no more are started"
                            : "; another one starts");
    }
    spare_remove(j, s);
    return true;
}

/* Keeps --spares workers started on free slots, while the job cannot
 * grow (growing comes first, and takes spares too). */
static void spares_fill(struct coord *c, struct job *j)
{
    struct elastic *el = j->el;
    for (int s = 0; s < j->nspares;) {
        struct rank *sp = &j->spares[s];
        bool usable = spare_usable(sp);
        const char *why = !usable                 ? "its host is lost or drained"
                          : !spare_has_slot(j, s) ? "its host has no slot for it now"
                                                  : NULL;
        if (!why) {
            s++;
            continue;
        }
        coord_event(c, j->id, sp->host_id, "worker.spare_lost",
                    "hot spare worker %llu of job %llu dropped: %s", (unsigned long long)sp->wid,
                    (unsigned long long)j->id, why);
        struct host *h = usable ? sp->host : NULL; /* read before the slot is reused */
        spare_remove(j, s);
        if (h)
            coord_host_wake(c, h); /* its agent stops the process */
    }
    if (el->finishing || el->waiting || el->spare_failures >= SPARE_FAILURES_MAX)
        return;
    /* --spares, and room to grow into: it waits as a spare until it is
     * ready (see the top of this section) */
    int grow = el->max_np - j->nranks - j->nspares;
    int free = free_slots(c, j);
    int want = el->spares_want + (grow < free ? (grow > 0 ? grow : 0) : free);
    if (j->nspares >= want)
        return;
    for (struct host *h = c->hosts; h && j->nspares < want; h = h->next) {
        int members = 0;
        for (int r = 0; r < j->nranks; r++)
            members += j->ranks[r].host == h && member_alive(&j->ranks[r]);
        int f = free_for_job(c, j, h) - members - spares_on(j, h);
        bool woke = false;
        while (f-- > 0 && j->nspares < want) {
            struct rank *v = realloc(j->spares, (size_t)(j->nspares + 1) * sizeof *v);
            if (!v)
                return;
            j->spares = v;
            struct rank *sp = &j->spares[j->nspares++];
            *sp = (struct rank){.rank = -1, .wid = ++j->next_wid, .host = h,
                                .state = RANK_ASSIGNED};
            str_copy(sp->host_id, h->id, sizeof sp->host_id);
            coord_event(c, j->id, h->id, "worker.spare_started",
                        "worker %llu of job %llu starts on host %s and waits in hvd.init() for "
                        "a place (a spare)",
                        (unsigned long long)sp->wid, (unsigned long long)j->id, h->name);
            woke = true;
        }
        if (woke)
            coord_host_wake(c, h); /* its desired set has the spare now */
    }
}

bool coord_elastic_exclude_straggler(struct coord *c, struct job *j, struct host *h,
                                     const char *why)
{
    struct elastic *el = j->el;
    if (!el || j->state != JOB_RUNNING || el->finishing)
        return false;
    int here = 0;
    for (int r = 0; r < j->nranks; r++)
        here += j->ranks[r].host == h && member_alive(&j->ranks[r]);
    if (!here || alive_members(j) - here < el->min_np)
        return false; /* the job would fall below --min-np */
    exclude_host(c, j, h, why);
    struct exclusion *x = exclusion_find(el, h->id);
    if (x)
        x->evict = true;
    /* graceful, as a drain: the ranks reset at their next commit without
     * a rollback, and the next generation leaves the host */
    el->update_ms = now_wall_ms();
    el->update_kind |= 1;
    snprintf(el->leave_why, sizeof el->leave_why, "host %s excluded as a straggler", h->name);
    coord_negot_hosts_updated(c, j);
    return true;
}

void coord_elastic_cron(struct coord *c, struct job *j, uint64_t now)
{
    struct elastic *el = j->el;
    if (j->state != JOB_RUNNING)
        return;
    for (struct exclusion *x = el->excl; x; x = x->next) {
        if (x->active && x->until && now >= x->until) {
            x->active = false;
            x->evict = false;
            struct host *h = coord_host_find(c, x->host_id);
            coord_event(c, j->id, x->host_id, "host.readmitted",
                        "host %s may rejoin job %llu: its cooldown passed",
                        h ? h->name : x->host_id, (unsigned long long)j->id);
        }
    }
    struct parked_assign **pp = &el->assign;
    while (*pp) {
        struct parked_assign *p = *pp;
        if (p->reset_gen && now >= p->deadline) {
            /* the grace passed and no death was reported: the reset the
             * rank asked for. Forming answers every parked call; when
             * the job must wait for capacity instead, they wait as any. */
            char why[160];
            snprintf(why, sizeof(why), "rank %d reset and asked for a new generation",
                     p->reset_rank);
            for (struct parked_assign *q = el->assign; q; q = q->next)
                if (q->reset_gen) {
                    q->reset_gen = 0;
                    q->deadline = now + (q->wait_ms > ASSIGN_MAX_WAIT_MS ? ASSIGN_MAX_WAIT_MS
                                                                         : q->wait_ms);
                }
            regroup(c, j, CAUSE_RESET, why);
            if (j->state != JOB_RUNNING)
                return;
            pp = &el->assign;
        } else if (!p->reset_gen && now >= p->deadline) {
            *pp = p->next;
            assign_answer(j, p->call, p->wid);
            free(p);
        } else {
            pp = &p->next;
        }
    }
    if (el->waiting) {
        struct rank *ranks = NULL;
        int n = plan(c, j, &ranks);
        if (n >= el->min_np && ranks) {
            form(c, j, ranks, n, el->wait_cause ? el->wait_cause : "capacity returned");
            return;
        }
        free(ranks);
        if (now >= el->wait_deadline) {
            char why[700];
            snprintf(why, sizeof(why),
                     "elastic timeout: fewer than min-np %d slot(s) usable for %u s (%d usable)",
                     el->min_np, el->timeout_ms / 1000, n);
            coord_job_finish(c, j, JOB_FAILED, 1, why);
        }
        return;
    }
    if (!el->finishing && frozen_member(c, j, now))
        return;
    /* A member that is gone but still in the generation (the coordinator
     * restarted between its exit and the next generation): regroup now. */
    if (!el->finishing) {
        for (int r = 0; r < j->nranks; r++) {
            const struct rank *rk = &j->ranks[r];
            if (rk->state == RANK_LOST || (rk->state == RANK_EXITED &&
                                           (rk->exit_code != 0 || rk->term_signal != 0))) {
                char why[200];
                snprintf(why, sizeof(why), "rank %d of generation %llu is gone", r,
                         (unsigned long long)j->generation);
                regroup(c, j, CAUSE_FAILURE, why);
                return;
            }
        }
    }
    /* Capacity to grow into: tell the workers once per update. */
    if (!(el->update_kind & 2) && j->negot && room_to_grow(c, j) > 0) {
        el->update_ms = now_wall_ms();
        el->update_kind |= 2;
        coord_negot_hosts_updated(c, j);
        coord_event(c, j->id, NULL, "job.hosts_updated",
                    "capacity for job %llu: it will grow at its next commit (%d of max-np %d now)",
                    (unsigned long long)j->id, j->nranks, el->max_np);
    }
    spares_fill(c, j);
}

void coord_elastic_job_ended(struct coord *c, struct job *j)
{
    (void)c;
    if (!j->el)
        return;
    while (j->el->assign) {
        struct parked_assign *p = j->el->assign;
        j->el->assign = p->next;
        rpc_call_error(p->call, KOLO_ESHUTDOWN, "the job ended: %s", j->reason ? j->reason : "");
        free(p);
    }
}

/* ---------------------------------------------------------------- place requests */

static void assign_answer(struct job *j, struct rpc_call *call, uint64_t wid)
{
    int idx = j->el->waiting ? -1 : coord_job_member(j, wid);
    if (j->state != JOB_RUNNING) {
        rpc_call_error(call, KOLO_ESHUTDOWN, "the job is not running: %s",
                       j->reason ? j->reason : "");
        return;
    }
    if (idx < 0 && spare_find(j, wid) >= 0) {
        Kolo__RendezvousReply rep = KOLO__RENDEZVOUS_REPLY__INIT;
        rep.spare = true; /* generation 0: ask again, for as long as it is a spare */
        coord_send_pb(call, &rep.base);
        return;
    }
    if (!j->el->waiting && idx < 0) {
        rpc_call_error(call, KOLO_ENOTFOUND,
                       "worker %llu has been removed from elastic job %llu (generation %llu)",
                       (unsigned long long)wid, (unsigned long long)j->id,
                       (unsigned long long)j->generation);
        return;
    }
    Kolo__RendezvousReply rep = KOLO__RENDEZVOUS_REPLY__INIT;
    if (idx >= 0) {
        struct rank *r = &j->ranks[idx];
        rep.generation = j->generation;
        rep.rank = r->rank;
        rep.size = j->nranks;
        rep.local_rank = r->local_rank;
        rep.local_size = r->local_size;
        rep.cross_rank = r->cross_rank;
        rep.cross_size = r->cross_size;
    }
    /* generation 0: not formed yet, ask again */
    coord_send_pb(call, &rep.base);
}

/* Parks a place request: until a generation forms, wait_ms passes (at most
 * ASSIGN_MAX_WAIT_MS), or, for the rank of a reset (reset_rank >= 0), its
 * RESET_GRACE_MS. */
static void park_assign(struct job *j, struct rpc_call *call, uint64_t wid, uint32_t wait_ms,
                        int reset_rank)
{
    struct parked_assign *p = calloc(1, sizeof(*p));
    if (!p) {
        rpc_call_error(call, KOLO_ENOMEM, "out of memory");
        return;
    }
    p->call = call;
    p->wid = wid;
    p->wait_ms = wait_ms;
    p->deadline = now_mono_ms() + (reset_rank >= 0                ? RESET_GRACE_MS
                                   : wait_ms > ASSIGN_MAX_WAIT_MS ? ASSIGN_MAX_WAIT_MS
                                                                  : wait_ms);
    if (reset_rank >= 0) {
        p->reset_gen = j->generation;
        p->reset_rank = reset_rank;
    }
    p->next = j->el->assign;
    j->el->assign = p;
}

void coord_elastic_assign(struct coord *c, struct job *j, struct rpc_call *call, uint64_t wid,
                          uint32_t wait_ms)
{
    int idx = coord_job_member(j, wid);
    int s = idx < 0 ? spare_find(j, wid) : -1;
    if (s >= 0) {
        j->spares[s].in_init = true; /* ready: room to grow into */
        park_assign(j, call, wid, wait_ms, -1); /* a spare waits for a place */
        return;
    }
    if (idx < 0) {
        rpc_call_error(call, KOLO_ENOTFOUND,
                       "worker %llu has been removed from elastic job %llu (generation %llu)",
                       (unsigned long long)wid, (unsigned long long)j->id,
                       (unsigned long long)j->generation);
        return;
    }
    bool grace = false;
    if (!j->el->waiting && coord_negot_rank_joined(j, idx) && !j->el->update_kind) {
        grace = true; /* see RESET_GRACE_MS */
    } else if (!j->el->waiting && coord_negot_rank_joined(j, idx)) {
        char why[240];
        if (j->el->update_kind & 2)
            snprintf(why, sizeof(why), "capacity to grow into (rank %d reset to take it)", idx);
        else if (j->el->leave_why[0])
            snprintf(why, sizeof(why), "%s (rank %d reset to leave it)", j->el->leave_why, idx);
        else
            snprintf(why, sizeof(why), "hosts removed (rank %d reset to leave them)", idx);
        regroup(c, j, CAUSE_CAPACITY, why);
        if (j->state != JOB_RUNNING || coord_job_member(j, wid) < 0) {
            assign_answer(j, call, wid);
            return;
        }
    }
    if (!j->el->waiting && !grace) {
        assign_answer(j, call, wid);
        return;
    }
    park_assign(j, call, wid, wait_ms, grace ? idx : -1);
}


/* ---------------------------------------------------------------- host discovery */

#define DISCOVERY_PERIOD_MS  1000
#define DISCOVERY_TIMEOUT_MS 10000
#define DISCOVERY_MAX_OUTPUT (1 << 20)
#define DISCOVERY_MAX_HOSTS  4096

/* Runs script with /bin/sh for at most DISCOVERY_TIMEOUT_MS: 0 with its
 * output in *out (caller frees), or an error with a message in err. */
static int run_script(const char *script, char **out, char *err, size_t errlen)
{
    char *argv[] = {"/bin/sh", "-c", (char *)script, NULL};
    return capture_run(argv, "the host discovery script", DISCOVERY_TIMEOUT_MS,
                       DISCOVERY_MAX_OUTPUT, out, err, errlen);
}

/* Parses "host" / "host:slots" lines (blank lines and '#' comments are
 * skipped; duplicates add up as one set, the last slots win). */
static int parse_hosts(char *text, struct disc_host **out, int *n, char *err, size_t errlen)
{
    struct disc_host *v = NULL;
    int count = 0, lineno = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        while (*line == ' ' || *line == '\t')
            line++;
        size_t len = strlen(line);
        while (len && (line[len - 1] == ' ' || line[len - 1] == '\t' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (!len || line[0] == '#')
            continue;
        int slots = 0;
        char *colon = strrchr(line, ':');
        if (colon) {
            char *end;
            long s = strtol(colon + 1, &end, 10);
            if (*end || s < 1 || s > 65536 || colon == line) {
                snprintf(err, errlen, "host discovery line %d: '%.100s' is not host[:slots]",
                         lineno, line);
                free(v);
                return KOLO_EINVAL;
            }
            slots = (int)s;
            *colon = '\0';
        }
        if (strlen(line) >= PLACE_MAX_HOST_NAME || strpbrk(line, " \t,")) {
            snprintf(err, errlen, "host discovery line %d: bad host name '%.100s'", lineno, line);
            free(v);
            return KOLO_EINVAL;
        }
        int k;
        for (k = 0; k < count && strcmp(v[k].name, line) != 0; k++)
            ;
        if (k == count) {
            if (count == DISCOVERY_MAX_HOSTS)
                break;
            struct disc_host *nv = realloc(v, (size_t)(count + 1) * sizeof(*v));
            if (!nv) {
                free(v);
                return KOLO_ENOMEM;
            }
            v = nv;
            str_copy(v[count].name, line, sizeof(v[count].name));
            count++;
        }
        v[k].slots = slots;
    }
    *out = v;
    *n = count;
    return 0;
}

static bool same_hosts(const struct disc_host *a, int na, const struct disc_host *b, int nb)
{
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++) {
        int k;
        for (k = 0; k < nb && (strcmp(a[i].name, b[k].name) || a[i].slots != b[k].slots); k++)
            ;
        if (k == nb)
            return false;
    }
    return true;
}

/* Stores one run's result (mtx held). */
static void discovery_result(struct coord *c, uint64_t job_id, int rc, struct disc_host *hosts,
                             int n, const char *why)
{
    struct job *j = coord_job_find(c, job_id);
    if (!j || !j->el || (j->state != JOB_PENDING && j->state != JOB_RUNNING)) {
        free(hosts);
        return;
    }
    struct elastic *el = j->el;
    if (rc != 0) {
        if (!el->disc_ok && j->state == JOB_PENDING) {
            free(hosts);
            /* As Horovod: a script that fails before the job started ends it. */
            coord_job_finish(c, j, JOB_FAILED, 1, why);
            return;
        }
        if (!el->disc_error || strcmp(el->disc_error, why) != 0) {
            coord_event(c, j->id, NULL, "job.discovery_failed",
                        "%s; keeping the last list of %d host(s)", why, el->ndisc);
            free(el->disc_error);
            el->disc_error = strdup(why);
        }
        free(hosts);
        return;
    }
    free(el->disc_error);
    el->disc_error = NULL;
    bool changed = !el->disc_ok || !same_hosts(hosts, n, el->disc, el->ndisc);
    free(el->disc);
    el->disc = hosts;
    el->ndisc = n;
    el->disc_ok = true;
    if (!changed)
        return;
    coord_event(c, j->id, NULL, "job.discovered", "host discovery lists %d host(s)", n);
    if (j->state == JOB_PENDING) {
        coord_jobs_place_pending(c);
        return;
    }
    /* Members on hosts that left the list, or beyond the slots a host
     * still listed has now: a graceful removal. */
    for (int r = 0; r < j->nranks; r++) {
        struct rank *rk = &j->ranks[r];
        if (!member_alive(rk) || !rk->host)
            continue;
        bool listed = disc_find(el, rk->host) != NULL;
        if (listed && members_before(j, rk) < job_slots_on(j, rk->host))
            continue;
        el->update_ms = now_wall_ms();
        el->update_kind |= 1;
        coord_negot_hosts_updated(c, j);
        if (listed)
            coord_event(c, j->id, rk->host->id, "job.hosts_updated",
                        "host %s lists %d slot(s) now: job %llu leaves the others at its next "
                        "commit",
                        rk->host->name, job_slots_on(j, rk->host), (unsigned long long)j->id);
        else
            coord_event(c, j->id, rk->host->id, "job.hosts_updated",
                        "host %s left the discovery list: job %llu leaves it at its next commit",
                        rk->host->name, (unsigned long long)j->id);
        break;
    }
}

static void *discovery_main(void *arg)
{
    thread_name("kolo-discovery");
    struct coord *c = arg;
    pthread_mutex_lock(&c->mtx);
    while (!c->stopping) {
        /* Copy out the scripts to run, then run them without the lock. */
        size_t n = 0;
        for (struct job *j = c->jobs; j; j = j->next)
            n += j->el && j->el->discovery && (j->state == JOB_PENDING || j->state == JOB_RUNNING);
        uint64_t *ids = n ? calloc(n, sizeof(*ids)) : NULL;
        char **scripts = n ? calloc(n, sizeof(*scripts)) : NULL;
        size_t k = 0;
        for (struct job *j = c->jobs; ids && scripts && j && k < n; j = j->next) {
            if (j->el && j->el->discovery &&
                (j->state == JOB_PENDING || j->state == JOB_RUNNING)) {
                ids[k] = j->id;
                scripts[k++] = strdup(j->el->discovery);
            }
        }
        pthread_mutex_unlock(&c->mtx);
        for (size_t i = 0; i < k; i++) {
            char err[300] = "";
            char *text = NULL;
            struct disc_host *hosts = NULL;
            int nh = 0;
            int rc = scripts[i] ? run_script(scripts[i], &text, err, sizeof(err)) : KOLO_ENOMEM;
            if (rc == 0)
                rc = parse_hosts(text, &hosts, &nh, err, sizeof(err));
            free(text);
            pthread_mutex_lock(&c->mtx);
            discovery_result(c, ids[i], rc, hosts, nh, err);
            pthread_mutex_unlock(&c->mtx);
            free(scripts[i]);
        }
        free(ids);
        free(scripts);
        pthread_mutex_lock(&c->mtx);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += DISCOVERY_PERIOD_MS / 1000;
        if (!c->stopping)
            pthread_cond_timedwait(&c->cond, &c->mtx, &ts);
    }
    pthread_mutex_unlock(&c->mtx);
    return NULL;
}

int coord_discovery_start(struct coord *c)
{
    if (pthread_create(&c->disc_thread, NULL, discovery_main, c) != 0)
        return KOLO_ESYS;
    c->disc_running = true;
    return 0;
}

void coord_discovery_stop(struct coord *c)
{
    if (!c->disc_running)
        return;
    pthread_mutex_lock(&c->mtx);
    c->stopping = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mtx);
    pthread_join(c->disc_thread, NULL);
    c->disc_running = false;
}
