/*
 * fastpath.c - readiness rounds: the ranks agree among themselves on
 * which cached tensors are ready, without the coordinator.
 *
 * DESIGN (docs/design.md, "Negotiation"; the rules are negotiation/round.h)
 *
 * Once the coordinator's log gave an allreduce or a host broadcast a cache id, submitting it
 * again with the same signature only sets its bit in this rank's ready
 * bitmap. A round reduces every rank's vector in one exchange over the
 * data plane (coll.h: round); from the same reduced vector every rank
 * derives the same outcome, in this order:
 *   1. ids whose bit some rank set in invalid are dropped from every
 *      cache; an op waiting under such an id goes to the coordinator in
 *      full (a changed signature then meets check_entry's error text, a
 *      stalled one the stall inspector);
 *   2. with the JOIN flag, join mode starts: every waiting op goes to the
 *      coordinator, which handles joined ranks as before;
 *   3. ready_AND & ~invalid_OR runs in ascending id order, fused by the
 *      coordinator's rule and rank 0's threshold;
 *   4. the barrier bit completes one barrier on every rank;
 *   5. the coordinator's log entries below cursor_MIN run.
 * Caches change only in steps 1 and 5, at the same point of the same round
 * on every rank, so a tensor is a hit on every rank or on none.
 *
 * Rounds are event-driven: a rank starts one when it has something new
 * (a submission, log entries, an invalid bit, the JOIN flag) or when a
 * peer started one; an idle rank learns that through the backend's
 * idle_wait (shared memory: a bell word and the peers' event counters;
 * TCP: the first round message on a socket). There is no cycle and no
 * traffic while nothing happens.
 *
 * Threads: whoever holds the executor token (ctx.c) runs rounds: a user
 * thread blocked in kolo_wait (no thread hand-off on the path of a small
 * op), or the background thread once nobody has waited for a moment
 * (ctx.c, BG_TAKEOVER_US). One thread at a time sits in idle_wait
 * (c->idling); the background thread gives the place up to a user thread
 * that waits. kolo_fini's last round (fast_leave) tells the peers the
 * rank leaves: ROUND_F_SHUTDOWN ends the generation on every rank.
 */
#include "fastpath.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "log.h"
#include "mismatch.h"
#include "plan.h"
#include "reduce.h"
#include "round.h"
#include "settings.h"
#include "util.h"
#include "ctx.h"
#include "exec.h"
#include "ops.h"
#include "report.h"

#define FAST_STALL_MAX_MS 10000
/* How long a rank whose round failed because a peer left waits for the
 * coordinator's shutdown entry, whose text (Horovod's) it then reports. */
#define FAST_LEFT_WAIT_MS 1000

/* KOLO_FAST_PATH: unset or "auto" = rounds wherever the backend can run
 * them, "0" = never (the coordinator for every op, for A/B comparison and
 * debugging), anything else = always. Crowded hosts take rounds too: at
 * np 4 on 2 CPUs a 4-byte allreduce takes ~0.24 ms in rounds against
 * ~2.6 ms through the coordinator, a ResNet-50 step 58 ms against 198 ms
 * (docs/libkolo.md). */
static bool fast_wanted(void)
{
    return strcmp(settings_str(SET_FAST_PATH), "0") != 0;
}

int fast_init(struct kolo_ctx *c)
{
    /* an elastic generation's start: the last one's table, as every rank
     * got it from the rendezvous (ctx.c) */
    c->cache = c->carried ? c->carried : tcache_new();
    c->carried = NULL;
    c->pending = calloc(ROUND_MAX_ID + 1, sizeof(*c->pending));
    c->vec = calloc(round_words(64) + ROUND_PAY_MAX_WORDS, sizeof(uint64_t));
    c->pay = calloc(ROUND_PAY_MAX_WORDS / 3, sizeof(*c->pay));
    c->agreed = calloc(ROUND_MAX_ID, sizeof(*c->agreed));
    c->agreed_items = calloc(ROUND_MAX_ID, sizeof(*c->agreed_items));
    if (!c->cache || !c->pending || !c->vec || !c->pay || !c->agreed || !c->agreed_items)
        return KOLO_ENOMEM;
    c->pay_seen = c->cache_changes - 1; /* laid out at the first round */
    /* Alone, no coordinator gives cache ids: every op is answered at once
     * by the local negotiation (solo.c), which needs no round. */
    bool can = !c->solo && c->coll && c->coll->can_round && c->coll->ops->round;
    int32_t on = can && fast_wanted();
    /* Every rank must take the same path: one MIN over the data plane (the
     * generation's first collective) settles it, whatever each rank's
     * environment or CPU count said. */
    if (can && c->size > 1) {
        int rc = c->coll->ops->allreduce(c->coll, KOLO_INT32, KOLO_MIN, &on, &on, 1,
                                         ctx_deadline(c));
        if (rc) {
            LOGE("kolo", "rank %d: agreeing on readiness rounds failed: %s", c->rank,
                 c->coll->why[0] ? c->coll->why : kolo_strerror(rc));
            return rc;
        }
    }
    c->fast = on != 0;
    /* the rounds' telemetry and the time split go out with the reports
     * (report.c) */
    if (c->fast || c->telemetry) {
        int rc = report_start(c);
        if (rc)
            return rc;
    }
    /* Horovod invalidates a cached tensor pending longer than the stall
     * warning; half of it (at most 10 s) leaves the coordinator's
     * inspector time to name the missing ranks before it warns. */
    int64_t warn = c->stall_warning_ms == 0 ? 60000 : c->stall_warning_ms;
    c->fast_stall_ms = warn < 0 ? -1 : (warn / 2 < FAST_STALL_MAX_MS ? warn / 2 : FAST_STALL_MAX_MS);
    return 0;
}

void fast_free(struct kolo_ctx *c)
{
    tcache_free(c->cache);
    c->cache = NULL;
    free(c->pending);
    free(c->vec);
    free(c->pay);
    c->pay = NULL;
    c->npay = c->pay_words = 0;
    free(c->agreed);
    free(c->agreed_items);
    c->agreed = NULL;
    c->agreed_items = NULL;
    c->pending = NULL;
    c->vec = NULL;
}

void fast_news(struct kolo_ctx *c)
{
    if (!c->fast)
        return;
    c->fast_dirty = true;
    if (c->idling)
        c->coll->ops->bell_ring(c->coll);
}

/* ---------------------------------------------------------------- classify */

static void ready_clear(struct kolo_ctx *c, uint32_t id)
{
    c->ready_bits[id / 64] &= ~(1ull << (id % 64));
}

static void moded_set(struct kolo_ctx *c, struct op *op)
{
    if (!op->moded) {
        op->moded = true;
        c->moded_ops++;
    }
}

/* Sends a waiting op to the coordinator, in full (ops_queue_slow: the
 * rounds' cache ids are not the coordinator's once it restarted). An op a
 * mode (join, slow) moved holds the mode up until it is done. */
static void to_slow_path(struct kolo_ctx *c, struct op *op, bool by_mode)
{
    if (op->cache_id && c->pending[op->cache_id] == op) {
        c->pending[op->cache_id] = NULL;
        ready_clear(c, op->cache_id);
    }
    op->cache_id = 0;
    if (by_mode)
        moded_set(c, op);
    op->fast = false;
    if (op->state == OP_SENT)
        c->inflight--;
    op->state = OP_QUEUED;
    op_queue_push(&c->q_head, &c->q_tail, op);
}

void fast_evict(struct kolo_ctx *c, uint32_t id, const char *name)
{
    const char *holder = ops_cache_name_of(c, id);
    if (!holder || strcmp(holder, name) == 0)
        return;
    LOGD("kolo", "rank %d: cache id %u goes from %s to %s", c->rank, id, holder, name);
    struct op *op = c->pending[id];
    if (op) {
        to_slow_path(c, op, false);
        pthread_cond_signal(&c->wake); /* the background thread sends it */
    }
    ops_cache_forget_id(c, id);
    c->fast_evicted++;
}

void fast_cache_reset(struct kolo_ctx *c)
{
    uint32_t held = tcache_count(c->cache);
    for (uint32_t id = 1; id <= tcache_top(c->cache); id++)
        if (c->pending[id])
            to_slow_path(c, c->pending[id], false);
    memset(c->invalid_bits, 0, sizeof(c->invalid_bits));
    for (size_t i = 0; i < sizeof(c->ready_bits) / sizeof(c->ready_bits[0]); i++)
        c->ready_bits[i] &= i == 0 ? 1ull : 0; /* a barrier stays */
    ops_cache_clear(c);
    c->cache_epoch++; /* the rounds check every rank did the same */
    LOGW("kolo", "rank %d: the coordinator found the ranks' response caches in disagreement "
         "after its restart; %u cached tensor(s) negotiate afresh", c->rank, held);
    pthread_cond_signal(&c->wake); /* the background thread sends the ops */
}

bool fast_submit(struct kolo_ctx *c, struct op *op)
{
    /* barriers, allreduces and host broadcasts (a broadcast_object, an
     * elastic commit's check) */
    if (!c->fast ||
        (op->req.coll != KOLO_COLL_BARRIER && op->req.coll != KOLO_COLL_ALLREDUCE &&
         !(op->req.coll == KOLO_COLL_BROADCAST && op->req.device < 0)))
        return false;
    if (c->round_busy) {
        /* placed by fast_round once this round's outcome is known */
        op_queue_push(&c->defer_head, &c->defer_tail, op);
        return true;
    }
    if (c->join_mode || c->joined || c->slow_mode) {
        moded_set(c, op);
        return false;
    }
    if (op->req.coll == KOLO_COLL_BARRIER) {
        op_queue_push(&c->bar_head, &c->bar_tail, op);
        c->ready_bits[0] |= 1;
    } else {
        uint32_t id = ops_cache_lookup(c, op);
        if (!id) {
            /* Known under another signature: drop the id everywhere at the
             * next round; this op goes to the coordinator in full. */
            uint32_t old = ops_cache_id_of(c, op->name);
            if (old) {
                round_set(c->invalid_bits, old);
                fast_news(c);
            }
            return false;
        }
        if (id > ROUND_MAX_ID || c->pending[id])
            return false;
        op->cache_id = id;
        op->fast_since_us = 0; /* the next round's start (oldest_wait_us) */
        c->pending[id] = op;
        round_set(c->ready_bits, id);
    }
    op->state = OP_SENT;
    op->fast = true;
    c->inflight++;
    fast_news(c);
    return true;
}

/* ---------------------------------------------------------------- the payload */

/* Lays the payload's slots out from the cache (mu held): every cached
 * host allreduce of 1..ROUND_PAY_ITEM_BYTES bytes, in id order, while
 * they fit in ROUND_PAY_MAX_WORDS. The same cache gives every rank the
 * same slots (round.h, "The payload"). */
static void pay_layout(struct kolo_ctx *c)
{
    c->pay_seen = c->cache_changes;
    c->npay = c->pay_words = 0;
    uint32_t top = tcache_top(c->cache);
    for (uint32_t id = 1; id <= top; id++) {
        const struct tensor_req *t = tcache_sig(c->cache, id);
        if (!t || t->coll != KOLO_COLL_ALLREDUCE || t->device >= 0 ||
            t->dtype >= KOLO_DTYPE_COUNT || t->op >= KOLO_OP_COUNT)
            continue;
        int64_t elems = 1;
        for (int d = 0; d < t->ndim && elems > 0 && elems <= ROUND_PAY_ITEM_BYTES; d++)
            elems *= t->shape[d];
        size_t bytes = (size_t)elems * kolo_dtype_size((kolo_dtype)t->dtype);
        if (elems <= 0 || bytes > ROUND_PAY_ITEM_BYTES)
            continue;
        uint32_t words = (uint32_t)((bytes + 7) / 8);
        if (c->pay_words + 2 + words > ROUND_PAY_MAX_WORDS)
            break;
        c->pay[c->npay++] = (struct pay_slot){
            .id = id, .at = c->pay_words,
            .hdr = round_pay_hdr(id, t->dtype, t->op, (uint32_t)elems, words)};
        c->pay_words += 2 + words;
    }
}

/* This rank's payload (mu held): its prescaled data in the slot of every
 * tiny op it has pending, zeros in the others. */
static void pay_fill(struct kolo_ctx *c, uint64_t *pay)
{
    for (uint32_t i = 0; i < c->npay; i++) {
        const struct pay_slot *sl = &c->pay[i];
        uint64_t *item = pay + sl->at;
        item[0] = sl->hdr;
        item[1] = ~sl->hdr;
        memset(item + 2, 0, round_pay_words(sl->hdr) * sizeof(uint64_t));
        const struct op *op = c->fast_leaving ? NULL : c->pending[sl->id];
        if (!op)
            continue;
        uint32_t count = round_pay_count(sl->hdr);
        memcpy(item + 2, op->req.sendbuf, count * kolo_dtype_size(op->req.dtype));
        if (op->req.prescale != 1.0)
            reduce_scale(op->req.dtype, item + 2, count, op->req.prescale);
    }
}

/* The result of the agreed op under slot sl, from the round's payload
 * of vector v (mu held): its average and postscale, then into its
 * output. false: the ranks' slots disagreed, the op runs as an allreduce. */
static bool pay_take(struct kolo_ctx *c, const uint64_t *v, size_t nwords, uint32_t w,
                     const struct pay_slot *sl, struct op *op)
{
    size_t at = round_words(w) + sl->at;
    if (!round_pay_agreed(v, nwords, at, sl->hdr)) {
        LOGD("kolo", "rank %d: the ranks laid out the round's payload differently at %s",
             c->rank, op->name);
        return false;
    }
    struct plan p = {.op = op->req.op, .dt = op->req.dtype};
    plan_scales(&p, op->req.prescale, op->req.postscale, c->size);
    uint32_t count = round_pay_count(sl->hdr);
    size_t bytes = count * kolo_dtype_size(op->req.dtype);
    memcpy(op->req.recvbuf, v + at + 2, bytes);
    exec_post_scale(&p, op->req.recvbuf, count);
    return true;
}

/* ---------------------------------------------------------------- the round */

/* Cached ops pending longer than the stall limit: invalid at the next
 * round, so the coordinator's stall inspector sees them (mu held). */
static void check_stalls(struct kolo_ctx *c, uint64_t now)
{
    if (c->fast_stall_ms < 0)
        return;
    if (now - c->fast_last_stall_check < 100)
        return;
    c->fast_last_stall_check = now;
    uint64_t now_us = now_mono_us();
    for (uint32_t id = 1; id <= tcache_top(c->cache); id++) {
        struct op *op = c->pending[id];
        /* (not stamped yet: no round since it was submitted) */
        uint64_t waited_ms = op && op->fast_since_us ? (now_us - op->fast_since_us) / 1000 : 0;
        if (op && waited_ms > (uint64_t)c->fast_stall_ms && !round_test(c->invalid_bits, id)) {
            LOGI("kolo", "rank %d: %s waited %llu ms for the other ranks; asking the "
                 "coordinator", c->rank, op->name, (unsigned long long)waited_ms);
            round_set(c->invalid_bits, id);
            c->fast_dirty = true;
        }
    }
}

/* A round failed, or a peer left (ROUND_F_SHUTDOWN): the generation is
 * over for this rank. The coordinator's log is about to say why in
 * Horovod's words (a shutdown entry naming the rank); wait a moment for
 * it and report that, else `fallback`. */
static void round_failed(struct kolo_ctx *c, int rc, const char *fallback)
{
    char why[512];
    snprintf(why, sizeof(why), "%s", fallback);
    struct timespec ts;
    mono_deadline(&ts, FAST_LEFT_WAIT_MS);
    for (;;) {
        for (size_t i = 0; i < c->resp_cap; i++) {
            Kolo__Response *r = c->resp[i];
            if (r && r->shutdown) {
                ctx_fail(c, r->error_code ? r->error_code : KOLO_ESHUTDOWN, r->error);
                return;
            }
        }
        if (c->sticky || c->stopping ||
            pthread_cond_timedwait(&c->done, &c->mu, &ts) != 0)
            break;
    }
    ctx_fail(c, rc, why);
}

/* One fused response of agreed ids, run like a log entry (mu not held;
 * the ops are pinned, so they outlive a failure on another thread). */
static void run_agreed(struct kolo_ctx *c, struct op **ops, size_t n)
{
    int64_t *sizes = calloc(n, sizeof(*sizes));
    if (!sizes) {
        ops_finish(c, ops, n, KOLO_ENOMEM, "out of memory", NULL, 0);
        return;
    }
    for (size_t i = 0; i < n; i++)
        sizes[i] = request_elems(&ops[i]->req);
    /* no names: exec_pinned takes the ops themselves; a broadcast runs
     * alone (fusion_item.alone) */
    Kolo__Response r = KOLO__RESPONSE__INIT;
    r.coll = (uint32_t)ops[0]->req.coll;
    r.root = ops[0]->req.root;
    r.n_names = n;
    r.dtype = (uint32_t)ops[0]->req.dtype;
    r.op = (uint32_t)ops[0]->req.op;
    r.prescale = ops[0]->req.prescale;
    r.postscale = ops[0]->req.postscale;
    r.sizes = sizes;
    r.n_sizes = n;
    exec_pinned(c, &r, ops);
    free(sizes);
}

/* The round's work outside mu (held on entry and on return): the taken
 * ops' spans (ttrace, nt) go out, the agreed ops run, fused, and their
 * spans (trace) go out. */
static void run_outside(struct kolo_ctx *c, struct op **agreed, const struct fusion_item *items,
                        size_t na, Kolo__TraceSpan *ttrace, size_t nt, Kolo__TraceSpan *trace)
{
    pthread_mutex_unlock(&c->mu);
    if (ttrace) {
        report_trace(c, ttrace, nt);
        free(ttrace);
    }
    for (size_t i = 0; i < na;) {
        size_t run = fusion_run(items + i, na - i, c->fused_threshold);
        run_agreed(c, agreed + i, run);
        for (size_t x = i; trace && x < i + run; x++)
            trace[x].done_us = ops_done_since(trace[x].agreed_us);
        i += run;
    }
    if (trace) {
        size_t m = 0;
        for (size_t x = 0; x < na; x++)
            if (trace[x].name) /* not moved to a GPU op */
                trace[m++] = trace[x];
        report_trace(c, trace, m);
        free(trace);
    }
    pthread_mutex_lock(&c->mu);
    if (na)
        c->round_end_us = 0; /* ops ran since: kolo_wait reads the clock */
}

static struct fusion_item fusion_of(const struct op *op)
{
    struct fusion_item f = {.dtype = (uint32_t)op->req.dtype,
                            .op = (uint32_t)op->req.op,
                            .prescale = op->req.prescale,
                            .postscale = op->req.postscale,
                            .gpu = op->req.device >= 0,
                            .alone = op->req.coll != KOLO_COLL_ALLREDUCE,
                            .bytes = request_elems(&op->req) *
                                     (int64_t)kolo_dtype_size(op->req.dtype)};
    return f;
}

/* How long this rank's oldest pending cached op has waited, in µs (mu
 * held): the round's telemetry field, reduced by MAX. An op submitted
 * since the last round starts waiting now (fast_submit reads no clock:
 * the first round after a submission does, and what the op waited
 * before it, for its own rank's thread, is not a wait for the peers). */
static uint64_t oldest_wait_us(struct kolo_ctx *c, uint32_t w, uint64_t now)
{
    uint64_t oldest = now;
    for (uint32_t i = 0; i < w; i++)
        for (uint64_t bits = c->ready_bits[i] & (i ? ~0ull : ~1ull); bits; bits &= bits - 1) {
            struct op *op = c->pending[i * 64 + (uint32_t)__builtin_ctzll(bits)];
            if (op && !op->fast_since_us)
                op->fast_since_us = now;
            if (op && op->fast_since_us < oldest)
                oldest = op->fast_since_us;
        }
    return now - oldest;
}

/* The timeline is on (ROUND_F_TRACE, the same on every rank): spans of
 * this round's agreed ops for the coordinator, which writes them from
 * every rank's (report.c; mu held, before the ops run: their names and
 * shapes are copied while they are sure to exist). NULL: out of memory,
 * the round goes untraced. The data-plane op's end is filled in as each
 * fusion run returns; a GPU op's span moves to the op (its name left
 * NULL here), which sends it when its kernels are done (ops_complete). */
static Kolo__TraceSpan *trace_begin(struct kolo_ctx *c, uint64_t k, struct op **agreed, size_t na)
{
    if (!na)
        return NULL;
    Kolo__TraceSpan *t = calloc(na, sizeof(*t));
    uint64_t now = now_mono_us();
    for (size_t i = 0; t && i < na; i++) {
        const struct op *op = agreed[i];
        if (!report_span_fill(&t[i], op->name, op->req.shape, op->req.ndim)) {
            while (i--)
                report_span_free(&t[i]);
            free(t);
            LOGW("kolo", "rank %d: out of memory tracing round %llu", c->rank,
                 (unsigned long long)k);
            return NULL;
        }
        t[i].round = k;
        t[i].ready_us = op->fast_since_us;
        t[i].agreed_us = now;
        t[i].coll = (uint32_t)op->req.coll;
        t[i].dtype = (uint32_t)op->req.dtype;
        if (op->req.device >= 0 && !op->trace && (agreed[i]->trace = malloc(sizeof(*t)))) {
            *agreed[i]->trace = t[i];
            t[i].name = NULL;
            t[i].shape = NULL;
        }
    }
    return t;
}

/* The moving average of this rank's own wait per agreed op: the rank the
 * others wait for waits least (coordinator: stragglers, /ranks lag). */
#define WAIT_AVG_ALPHA 0.05

/*
 * One round and its outcome (mu and the token held; mu released during the
 * exchange and while ops run), the exchange bounded by deadline; now_us
 * is a clock reading from just before. See DESIGN above for the order.
 */
static void fast_round(struct kolo_ctx *c, uint64_t deadline, uint64_t now_us)
{
    uint32_t w = round_bitmap_words(tcache_top(c->cache));
    if (c->pay_seen != c->cache_changes)
        pay_layout(c);
    size_t nwords = round_words(w) + c->pay_words;
    uint64_t k = c->round + 1;
    uint64_t flags = (c->joined ? ROUND_F_JOIN : 0) | (c->moded_ops ? ROUND_F_SLOW : 0) |
                     (c->timeline_heard || c->timeline_asked ? ROUND_F_TRACE : 0) |
                     (c->fast_leaving ? ROUND_F_SHUTDOWN : 0);
    uint64_t *v = c->vec;
    round_init(v, k, c->cache_epoch, w, c->cursor, flags);
    /* a leaving rank agrees to nothing more (round_init cleared the bits) */
    if (!c->fast_leaving)
        memcpy(round_ready(v), c->ready_bits, w * sizeof(uint64_t));
    memcpy(round_invalid(v), c->invalid_bits, w * sizeof(uint64_t));
    pay_fill(c, v + round_words(w));
    v[ROUND_WAIT] = oldest_wait_us(c, w, now_us);
    LOGD("kolo", "rank %d: round %llu starts (%s, cursor %llu)", c->rank,
         (unsigned long long)k, c->fast_dirty ? "news here" : "a peer started it",
         (unsigned long long)c->cursor);
    c->fast_dirty = false;
    c->round_busy = true;
    c->coll->waited = false;
    pthread_mutex_unlock(&c->mu);
    int rc = c->coll->ops->round(c->coll, v, nwords, deadline);
    pthread_mutex_lock(&c->mu);
    /* a round that never waited long enough to read the clock took a few
     * microseconds at most: now_us stands for its end (coll.h) */
    bool quick = c->coll->tracks_waits && !c->coll->waited;
    c->round_busy = false;
    if (rc) {
        if (!c->fast_leaving) /* leaving, it goes anyway */
            round_failed(c, rc, c->coll->why[0] ? c->coll->why : kolo_strerror(rc));
        return;
    }
    /* Failed meanwhile (the generation closed, an abort): every pending op
     * was completed, and may be gone already. */
    if (c->sticky)
        return;
    char why[300];
    if (round_check(v, k, c->cache_epoch, w, why, sizeof(why)) != 0) {
        ctx_fail(c, KOLO_EPROTO, why);
        return;
    }
    if (v[ROUND_FLAGS] & ROUND_F_SHUTDOWN) {
        /* a rank left: every rank ends the generation at this round */
        if (!c->fast_leaving) {
            /* the text if the coordinator's, which names the rank, is late */
            char text[300];
            mismatch_shutdown_text(text, sizeof text, -1, "kolo_fini");
            round_failed(c, KOLO_ESHUTDOWN, text);
        }
        return;
    }
    c->round = k;
    c->fast_rounds++;
    uint64_t *ready = round_ready(v), *invalid = round_invalid(v);

    /* 1. invalidated ids leave every cache; their ops go in full */
    for (uint32_t i = 0; i < w; i++) {
        for (uint64_t bits = invalid[i]; bits; bits &= bits - 1) {
            uint32_t id = i * 64 + (uint32_t)__builtin_ctzll(bits);
            c->invalid_bits[i] &= ~(1ull << (id % 64));
            struct op *op = c->pending[id];
            ops_cache_forget_id(c, id);
            if (op)
                to_slow_path(c, op, false);
        }
    }
    /* 2. join mode, or slow mode (some rank still has an op a join sent
     * to the coordinator): everything waiting goes to the coordinator
     * (slow mode ends at the first round without the flag, on every rank
     * at once). Entering slow mode, the ops this very round agreed go
     * too (every rank sees the same flags and bits, so all agree). */
    bool to_join = (v[ROUND_FLAGS] & ROUND_F_JOIN) && !c->join_mode;
    bool to_slow = (v[ROUND_FLAGS] & ROUND_F_SLOW) && !c->slow_mode;
    c->slow_mode = (v[ROUND_FLAGS] & ROUND_F_SLOW) != 0;
    if (to_join || to_slow) {
        c->join_mode = c->join_mode || to_join;
        for (uint32_t id = 1; id <= tcache_top(c->cache); id++)
            if (c->pending[id] && (to_slow || !round_test(ready, id)))
                to_slow_path(c, c->pending[id], true);
        /* one barrier may be agreed in this very round (step 4); every
         * other one goes to the coordinator */
        struct op *keep = round_test(ready, 0) ? op_queue_pop(&c->bar_head, &c->bar_tail) : NULL;
        while (c->bar_head)
            to_slow_path(c, op_queue_pop(&c->bar_head, &c->bar_tail), false);
        if (keep)
            op_queue_push(&c->bar_head, &c->bar_tail, keep);
        else
            c->ready_bits[0] &= ~1ull;
    }
    /* ops submitted during the exchange, placed by this round's outcome,
     * in their order (for the next round or the coordinator) */
    while (c->defer_head) {
        struct op *op = op_queue_pop(&c->defer_head, &c->defer_tail);
        if (!fast_submit(c, op))
            ops_queue_slow(c, op);
    }
    /* 3. the agreed ids, in id order (the arrays hold every id); a tiny
     * one's result is in the payload already (taken, done below) */
    struct op **agreed = c->agreed;
    struct fusion_item *items = c->agreed_items;
    struct op *taken[ROUND_PAY_MAX_WORDS / 3];
    size_t na = 0, nt = 0;
    uint32_t slot = 0;
    for (uint32_t i = 0; i < w && !to_slow; i++) {
        for (uint64_t bits = ready[i] & ~invalid[i] & (i ? ~0ull : ~1ull); bits; bits &= bits - 1) {
            uint32_t id = i * 64 + (uint32_t)__builtin_ctzll(bits);
            struct op *op = c->pending[id];
            if (!op) { /* cannot happen: our own bit was in the AND */
                ctx_fail(c, KOLO_EINTERNAL, "readiness round agreed on an id this rank lacks");
                return;
            }
            c->pending[id] = NULL;
            ready_clear(c, id);
            while (slot < c->npay && c->pay[slot].id < id)
                slot++;
            if (slot < c->npay && c->pay[slot].id == id &&
                pay_take(c, v, nwords, w, &c->pay[slot], op)) {
                taken[nt++] = op;
                continue;
            }
            items[na] = fusion_of(op);
            agreed[na++] = op;
        }
    }
    /* run with mu released below: from here only their executor completes
     * them (exec.c unpins what runs on a GPU) */
    for (size_t i = 0; i < na; i++)
        agreed[i]->pinned = true;
    c->fast_agreed += na + nt;
    c->fast_inline += nt;
    /* (a traced round's spans must not end before trace_begin's reading) */
    if (!quick || (v[ROUND_FLAGS] & ROUND_F_TRACE))
        now_us = now_mono_us();
    c->round_end_us = now_us; /* kolo_wait's end, too */
    for (size_t i = 0; i < na + nt; i++) {
        const struct op *op = i < na ? agreed[i] : taken[i - na];
        /* an op another thread submitted after now_us was read waited 0 */
        uint64_t since = op->fast_since_us < now_us ? op->fast_since_us : now_us;
        double waited = (double)(now_us - since) / 1e6;
        c->fast_wait_avg_s += WAIT_AVG_ALPHA * (waited - c->fast_wait_avg_s);
    }
    if (c->telemetry)
        report_round(c, (uint32_t)(na + nt), c->fast_wait_avg_s, v[ROUND_WAIT]);
    LOGD("kolo", "rank %d: round %llu agreed %zu op(s) (%zu in the round itself)%s, log to %llu",
         c->rank, (unsigned long long)k, na + nt, nt, round_test(ready, 0) ? " and a barrier" : "",
         (unsigned long long)v[ROUND_CURSOR]);
    /* the taken ops are done (their spans copied first: a waiter may
     * free one once mu is released) */
    Kolo__TraceSpan *ttrace = nt && (v[ROUND_FLAGS] & ROUND_F_TRACE) ? trace_begin(c, k, taken, nt)
                                                                      : NULL;
    for (size_t x = 0; x < nt; x++) {
        if (ttrace)
            ttrace[x].done_us = now_us;
        ops_complete(c, taken[x], 0, NULL);
    }
    /* 4. the barrier bit */
    struct op *barrier = NULL;
    if (round_test(ready, 0) && (barrier = op_queue_pop(&c->bar_head, &c->bar_tail))) {
        barrier->pinned = true; /* every rank reached it: it completes below */
        if (!c->bar_head)
            c->ready_bits[0] &= ~1ull;
    }
    uint64_t log_end = v[ROUND_CURSOR];
    Kolo__TraceSpan *trace = (v[ROUND_FLAGS] & ROUND_F_TRACE) ? trace_begin(c, k, agreed, na) : NULL;
    /* slow-path ops that changed hands go out now */
    ctx_send_queued(c);
    if (na || ttrace || trace) /* else (tiny ops only) mu stays held */
        run_outside(c, agreed, items, na, ttrace, nt, trace);
    if (barrier)
        ops_complete(c, barrier, 0, NULL);
    /* 5. the log, up to the agreed cursor */
    while (!c->sticky && c->resp_base < log_end && c->resp_cap && c->resp[0])
        ctx_run_log_entry(c);
}

static bool fast_work(struct kolo_ctx *c)
{
    return c->fast_dirty || c->coll->ops->peer_started(c->coll);
}

bool fast_try(struct kolo_ctx *c, uint64_t now_us)
{
    /* Not while another thread sits in idle_wait: it reads the backend's
     * state (event counters, poll set) that a round changes. Its bell was
     * rung with the news; it leaves at once and broadcasts done. */
    if (c->executing || c->sticky || c->stopping || c->idling || c->fast_leaving)
        return false;
    if (!now_us)
        now_us = now_mono_us();
    uint64_t now_ms = now_us / 1000;
    check_stalls(c, now_ms); /* may make the rank dirty */
    if (!fast_work(c))
        return false;
    c->executing = true;
    c->exec_since = now_ms;
    fast_round(c, now_ms + (uint64_t)c->timeout_ms, now_us);
    ctx_token_release(c);
    return true;
}

bool fast_idle(struct kolo_ctx *c, int ms, bool spin)
{
    if (c->idling || c->executing || c->sticky || c->fast_leaving)
        return false;
    c->idling = true;
    uint64_t seen = c->coll->ops->bell_seen(c->coll);
    if (!fast_work(c)) {
        pthread_mutex_unlock(&c->mu);
        c->coll->ops->idle_wait(c->coll, seen, ms, spin);
        pthread_mutex_lock(&c->mu);
    }
    c->idling = false;
    pthread_cond_broadcast(&c->done); /* a waiter may take the place now */
    return true;
}

void fast_leave(struct kolo_ctx *c, int ms)
{
    if (!c->fast || c->sticky || !c->coll || c->size < 2)
        return;
    /* The token, once the thread in idle_wait (rung out) or in a round has
     * let it go; fast_leaving keeps either from taking it back. All this
     * rank's agreed ops have run then, so the peers' next exchange with
     * it is a round: this one. */
    c->fast_leaving = true;
    uint64_t deadline = now_mono_ms() + (uint64_t)ms;
    struct timespec ts;
    mono_deadline(&ts, (uint64_t)ms);
    while ((c->executing || c->idling) && !c->sticky) {
        if (c->idling)
            c->coll->ops->bell_ring(c->coll);
        if (pthread_cond_timedwait(&c->done, &c->mu, &ts) != 0)
            break;
    }
    if (!c->executing && !c->idling && !c->sticky) {
        c->executing = true;
        c->exec_since = now_mono_ms();
        LOGD("kolo", "rank %d: leaving; telling the peers in a last round", c->rank);
        fast_round(c, deadline, now_mono_us());
        ctx_token_release(c);
    }
    c->fast_leaving = false;
}
