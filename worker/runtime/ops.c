/*
 * ops.c - submitting operations, handles, waiting, results.
 *
 * A handle is (sequence << 32 | slot): slots are reused, sequence numbers
 * are not, so a released or made-up handle is recognised and refused
 * (KOLO_ENOTFOUND) instead of pointing at another operation.
 */
#include "ops.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "log.h"
#include "round.h"
#include "util.h"
#include "coll.h"
#include "ctx.h"
#include "fastpath.h"
#include "nccl_exec.h"
#include "report.h"

/* ---------------------------------------------------------------- handles */

static int slot_alloc(struct kolo_ctx *c, struct op *op)
{
    uint32_t slot;
    if (c->nfree) {
        slot = c->free_slots[--c->nfree];
    } else {
        if (c->nslots == c->slot_cap) {
            uint32_t cap = c->slot_cap ? c->slot_cap * 2 : 256;
            struct op **ns = realloc(c->slots, cap * sizeof(*ns));
            if (!ns)
                return KOLO_ENOMEM;
            c->slots = ns;
            uint32_t *nq = realloc(c->slot_seq, cap * sizeof(*nq));
            if (!nq)
                return KOLO_ENOMEM;
            c->slot_seq = nq;
            uint32_t *nf = realloc(c->free_slots, cap * sizeof(*nf));
            if (!nf)
                return KOLO_ENOMEM;
            c->free_slots = nf;
            c->slot_cap = cap;
        }
        slot = c->nslots++;
        c->slot_seq[slot] = 0;
    }
    c->slot_seq[slot]++;
    c->slots[slot] = op;
    op->handle = ((int64_t)c->slot_seq[slot] << 32) | slot;
    return 0;
}

struct op *ops_lookup(struct kolo_ctx *c, kolo_handle h)
{
    if (h <= 0)
        return NULL;
    uint32_t slot = (uint32_t)(h & 0xffffffff), seq = (uint32_t)(h >> 32);
    if (slot >= c->nslots || c->slot_seq[slot] != seq)
        return NULL;
    return c->slots[slot];
}

struct op *ops_finished(struct kolo_ctx *c, kolo_handle h, bool ok, int *rv)
{
    struct op *op = ops_lookup(c, h);
    *rv = 0;
    if (!op)
        *rv = KOLO_ENOTFOUND;
    else if (op->state != OP_DONE)
        *rv = ctx_error(c, KOLO_ESTATE, "the operation has not finished");
    else if (ok && op->status)
        *rv = op->status;
    return *rv ? NULL : op;
}

/* ---------------------------------------------------------------- op memory
 *
 * Finished ops are recycled: a training step submits the same tensors
 * again and again, and calloc, strdup, malloc and their three frees were
 * ~500 of the ~3,700 instructions of a cached 4 B allreduce. A recycled
 * op keeps its name and shape buffers for the next. Sanitizer builds
 * recycle nothing, so that a use after free still shows. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OP_POOL_ON 0
#else
#define OP_POOL_ON 1
#endif
#define OP_POOL_MAX 256u

/* An op with every field zero but its kept buffers (mu held). */
static struct op *op_get(struct kolo_ctx *c)
{
    struct op *op = c->op_pool;
    if (!op)
        return calloc(1, sizeof(*op));
    c->op_pool = op->next;
    c->op_pooled--;
    struct op keep = {.name = op->name, .name_cap = op->name_cap,
                      .shape = op->shape, .shape_cap = op->shape_cap};
    *op = keep;
    return op;
}

/* Frees the buffers of one use of op, and forgets them (a kept name and
 * shape stay). */
static void op_clear(struct op *op)
{
    if (op->gpu_event || op->gpu_result)
        gpu_op_free(op);
    if (op->trace) {
        report_span_free(op->trace);
        free(op->trace);
    }
    if (op->error || op->splits || op->result || op->recv_splits) {
        free(op->error);
        free(op->splits);
        free(op->result);
        free(op->recv_splits);
    }
    op->gpu_event = op->gpu_result = NULL;
    op->trace = NULL;
    op->error = NULL;
    op->splits = NULL;
    op->result = NULL;
    op->recv_splits = NULL;
}

static void op_free(struct op *op)
{
    op_clear(op);
    free(op->name);
    free(op->shape);
    free(op);
}

/* op is done with (mu held): kept for the next submission, or freed. */
static void op_put(struct kolo_ctx *c, struct op *op)
{
    if (!OP_POOL_ON || c->op_pooled >= OP_POOL_MAX) {
        op_free(op);
        return;
    }
    op_clear(op);
    op->next = c->op_pool;
    c->op_pool = op;
    c->op_pooled++;
}

/* Room for n bytes in *buf of *cap (kept when it fits); false: no memory. */
static bool buf_fit(void **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return true;
    size_t want = n < 64 ? 64 : n;
    void *b = malloc(want);
    if (!b)
        return false;
    free(*buf);
    *buf = b;
    *cap = want;
    return true;
}

static void name_remove(struct kolo_ctx *c, struct op *op);

static void slot_release(struct kolo_ctx *c, struct op *op)
{
    name_remove(c, op); /* seen, if kolo_wait or kolo_poll did not say so */
    uint32_t slot = (uint32_t)(op->handle & 0xffffffff);
    c->slots[slot] = NULL;
    c->slot_seq[slot]++; /* the old handle is now stale */
    c->free_slots[c->nfree++] = slot;
    op_put(c, op);
}

/* ---------------------------------------------------------------- names
 *
 * A name is taken from its op's submission until the caller has seen the
 * op end: kolo_wait returned it, kolo_poll said it is done, or the handle
 * was released. Horovod frees a name when its op completes, but its
 * background loop completes nothing within a cycle (about a millisecond),
 * so a second submission of a name right after the first always meets
 * its "same name" error there; kolo completes a small op in microseconds,
 * and freeing the name at completion let a second submission slip
 * through after all (Horovod's own duplicate-name tests failed 3 runs in
 * 10). Responses find their ops in the same table (ops_by_name), which
 * skips a done op. */

static struct op *by_name_hashed(struct kolo_ctx *c, const char *name, uint64_t hash)
{
    for (struct op *o = c->names[hash % NAME_BUCKETS]; o; o = o->name_next)
        if (o->name_hash == hash && strcmp(o->name, name) == 0)
            return o;
    return NULL;
}

struct op *ops_by_name(struct kolo_ctx *c, const char *name)
{
    /* responses are for ops in flight: a done op waits to be seen */
    struct op *op = by_name_hashed(c, name, str_hash(name));
    return op && op->state != OP_DONE ? op : NULL;
}

static void name_add(struct kolo_ctx *c, struct op *op)
{
    uint64_t b = op->name_hash % NAME_BUCKETS;
    op->name_next = c->names[b];
    c->names[b] = op;
}

static void name_remove(struct kolo_ctx *c, struct op *op)
{
    struct op **pp = &c->names[op->name_hash % NAME_BUCKETS];
    while (*pp && *pp != op)
        pp = &(*pp)->name_next;
    if (*pp)
        *pp = op->name_next;
}

int64_t request_elems(const kolo_request *r)
{
    int64_t count = 1;
    for (int i = 0; i < r->ndim; i++)
        count *= r->shape[i];
    return count;
}

void op_queue_push(struct op **head, struct op **tail, struct op *op)
{
    op->next = NULL;
    if (*tail)
        (*tail)->next = op;
    else
        *head = op;
    *tail = op;
}

struct op *op_queue_pop(struct op **head, struct op **tail)
{
    struct op *op = *head;
    if (op) {
        *head = op->next;
        if (!*head)
            *tail = NULL;
    }
    return op;
}

/* ---------------------------------------------------------------- completion */

void ops_complete(struct kolo_ctx *c, struct op *op, int status, const char *error)
{
    if (op->state == OP_DONE)
        return;
    if (op->state == OP_SENT)
        c->inflight--;
    op->state = OP_DONE;
    op->pinned = false;
    if (op->moded) {
        op->moded = false;
        if (--c->moded_ops == 0)
            fast_news(c); /* the next round may end the mode */
    }
    op->status = status;
    if (status && error)
        op->error = strdup(error);
    if (op->trace) { /* a GPU op's span ends with its kernels */
        op->trace->done_us = now_mono_us();
        report_trace(c, op->trace, 1);
        free(op->trace);
        op->trace = NULL;
    }
    pthread_cond_broadcast(&c->done);
    /* A waiter may sleep in the rounds' idle_wait rather than on done: an
     * op completed by another thread (the GPU finaliser, an abort) must
     * wake it, or it sleeps out its slice (100 ms per GPU op). */
    if (c->idling)
        c->coll->ops->bell_ring(c->coll);
}

void ops_fail_all(struct kolo_ctx *c, int status, const char *error)
{
    /* A pinned op is in the data plane's hands on another thread: its
     * executor completes it (soon: a failure interrupts the collective). */
    for (uint32_t s = 0; s < c->nslots; s++) {
        struct op *op = c->slots[s];
        if (op && op->state != OP_DONE && !op->pinned)
            ops_complete(c, op, status, error);
    }
    c->q_head = c->q_tail = NULL;
    c->defer_head = c->defer_tail = NULL;
}

void ops_free_all(struct kolo_ctx *c)
{
    for (uint32_t s = 0; s < c->nslots; s++)
        if (c->slots[s])
            op_free(c->slots[s]);
    free(c->slots);
    free(c->slot_seq);
    free(c->free_slots);
    c->slots = NULL;
    c->nslots = c->slot_cap = c->nfree = 0;
    while (c->op_pool) {
        struct op *op = c->op_pool;
        c->op_pool = op->next;
        op_free(op);
    }
    c->op_pooled = 0;
    ops_cache_clear(c);
}

void ops_cache_clear(struct kolo_ctx *c)
{
    if (!c->cache)
        return;
    tcache_clear(c->cache);
    tcache_reap(c->cache);
    c->cache_changes++;
}

/* ---------------------------------------------------------------- the cache
 *
 * The table is negotiation/cache.h's; these read it with an op's request
 * as the signature. */

/* sig_of: op's request as a cache signature (borrowing its shape). */
static struct tensor_req sig_of(const struct op *op)
{
    const kolo_request *r = &op->req;
    struct tensor_req t = {.coll = (uint32_t)r->coll, .dtype = (uint32_t)r->dtype,
                           .op = (uint32_t)r->op, .ndim = r->ndim, .shape = (int64_t *)r->shape,
                           .prescale = r->prescale, .postscale = r->postscale,
                           .root = r->root, .device = r->device};
    return t;
}

uint32_t ops_cache_id_of(struct kolo_ctx *c, const char *name)
{
    return tcache_id(c->cache, name);
}

const char *ops_cache_name_of(struct kolo_ctx *c, uint32_t id)
{
    return tcache_name(c->cache, id);
}

void ops_cache_forget_id(struct kolo_ctx *c, uint32_t id)
{
    tcache_drop(c->cache, id);
    tcache_reap(c->cache); /* nobody borrows a worker's signatures */
    c->cache_changes++;
}

uint32_t ops_cache_lookup(struct kolo_ctx *c, const struct op *op)
{
    uint32_t id = tcache_id_hashed(c->cache, op->name, op->name_hash);
    struct tensor_req t = sig_of(op);
    return id && tensor_sig_equal(tcache_sig(c->cache, id), &t) ? id : 0;
}

void ops_cache_put(struct kolo_ctx *c, const struct op *op, uint32_t id)
{
    if (id < 1 || id > ROUND_MAX_ID)
        return;
    /* one name per id: a holder the log entry's run did not drop yet (a
     * GPU op binds its id when its finaliser completes it) goes now */
    fast_evict(c, id, op->name);
    struct tensor_req t = sig_of(op);
    if (tcache_bind(c->cache, id, op->name, &t) != 0)
        LOGW("kolo", "rank %d: out of memory caching %s", c->rank, op->name);
    tcache_reap(c->cache);
    c->cache_changes++;
}

/* ---------------------------------------------------------------- submit */

/* The device a request runs on. A join's zeros go to the others'
 * allreduces: a process started alone has no others, so its join needs
 * no GPU (-1), as Horovod's without a launcher. */
static int request_device(const struct kolo_ctx *c, const kolo_request *r)
{
    return r->coll == KOLO_COLL_JOIN && c->solo ? -1 : r->device;
}

static int validate(struct kolo_ctx *c, const kolo_request *r)
{
    if ((unsigned)r->coll >= KOLO_COLL_COUNT)
        return ctx_error(c, KOLO_EINVAL, "invalid collective %d", (int)r->coll);
    if (r->coll == KOLO_COLL_BARRIER || r->coll == KOLO_COLL_JOIN)
        return 0;
    if ((unsigned)r->dtype >= KOLO_DTYPE_COUNT)
        return ctx_error(c, KOLO_EINVAL, "invalid dtype %d", (int)r->dtype);
    if (r->ndim < 0 || r->ndim > 64 || (r->ndim > 0 && !r->shape))
        return ctx_error(c, KOLO_EINVAL, "invalid shape (ndim %d)", r->ndim);
    for (int i = 0; i < r->ndim; i++)
        if (r->shape[i] < 0)
            return ctx_error(c, KOLO_EINVAL, "negative dimension %lld", (long long)r->shape[i]);
    if (request_device(c, r) >= 0) {
        int rc = gpu_validate(c, r); /* the reason is in last_error */
        if (rc)
            return rc;
    }
    int64_t count = request_elems(r);
    if (count > 0 && !r->sendbuf && r->coll != KOLO_COLL_BROADCAST)
        return ctx_error(c, KOLO_EINVAL, "sendbuf is NULL");
    switch (r->coll) {
    case KOLO_COLL_ALLREDUCE:
        if ((unsigned)r->op >= KOLO_OP_COUNT)
            return ctx_error(c, KOLO_EINVAL, "invalid reduction op %d", (int)r->op);
        if (count > 0 && !r->recvbuf)
            return ctx_error(c, KOLO_EINVAL, "recvbuf is NULL");
        break;
    case KOLO_COLL_REDUCESCATTER:
        if (r->op != KOLO_SUM && r->op != KOLO_AVERAGE)
            return ctx_error(c, KOLO_EINVAL, "Reducescatter currently only supports AVERAGE and SUM.");
        if (r->ndim < 1)
            return ctx_error(c, KOLO_EINVAL, "reducescatter needs a tensor of rank >= 1");
        break;
    case KOLO_COLL_BROADCAST:
        if (r->root < 0 || r->root >= c->size)
            return ctx_error(c, KOLO_EINVAL, "broadcast root %d out of range [0, %d)", r->root,
                        c->size);
        if (count > 0 && !r->recvbuf)
            return ctx_error(c, KOLO_EINVAL, "broadcast buffer is NULL");
        break;
    case KOLO_COLL_ALLGATHER:
        if (r->ndim < 1)
            return ctx_error(c, KOLO_EINVAL, "allgather needs a tensor of rank >= 1");
        break;
    case KOLO_COLL_ALLTOALL:
        if (r->ndim < 1)
            return ctx_error(c, KOLO_EINVAL, "alltoall needs a tensor of rank >= 1");
        if (r->splits) {
            if (r->nsplits != c->size)
                return ctx_error(c, KOLO_EINVAL, "splits must have %d entries, one per rank",
                            c->size);
            int64_t sum = 0;
            for (int i = 0; i < r->nsplits; i++) {
                if (r->splits[i] < 0)
                    return ctx_error(c, KOLO_EINVAL, "negative split");
                sum += r->splits[i];
            }
            if (sum > r->shape[0])
                return ctx_error(c, KOLO_EINVAL,
                            "the splits add up to %lld rows, more than the tensor's %lld",
                            (long long)sum, (long long)r->shape[0]);
        } else if (r->shape[0] % c->size != 0) {
            return ctx_error(c, KOLO_EINVAL,
                        "alltoall without splits needs the first dimension (%lld) divisible by "
                        "the number of ranks (%d)",
                        (long long)r->shape[0], c->size);
        }
        break;
    default:
        break;
    }
    return 0;
}

/* hash: str_hash of r's name if the caller has it, else 0 */
static struct op *op_new(struct kolo_ctx *c, const kolo_request *r, uint64_t hash)
{
    struct op *op = op_get(c);
    if (!op)
        return NULL;
    op->req = *r;
    char auto_name[64];
    const char *name = r->name;
    if (!name || !name[0]) {
        if (r->coll == KOLO_COLL_BARRIER)
            snprintf(auto_name, sizeof(auto_name), "kolo.barrier.%llu",
                     (unsigned long long)++c->barriers);
        else if (r->coll == KOLO_COLL_JOIN)
            snprintf(auto_name, sizeof(auto_name), "kolo.join");
        else
            snprintf(auto_name, sizeof(auto_name), "%s.noname.%llu", kolo_coll_name(r->coll),
                     (unsigned long long)++c->unnamed);
        name = auto_name;
    }
    size_t name_len = strlen(name) + 1;
    bool fits = buf_fit((void **)&op->name, &op->name_cap, name_len) &&
                buf_fit((void **)&op->shape, &op->shape_cap, ((size_t)r->ndim + 1) * sizeof(int64_t));
    op->splits = r->splits ? malloc(((size_t)r->nsplits + 1) * sizeof(int32_t)) : NULL;
    if (!fits || (r->splits && !op->splits)) {
        op_put(c, op);
        return NULL;
    }
    memcpy(op->name, name, name_len);
    op->name_hash = hash && name == r->name ? hash : str_hash(op->name);
    if (r->ndim)
        memcpy(op->shape, r->shape, (size_t)r->ndim * sizeof(int64_t));
    if (r->splits)
        memcpy(op->splits, r->splits, (size_t)r->nsplits * sizeof(int32_t));
    op->req.name = op->name;
    op->req.shape = op->shape;
    op->req.splits = op->splits;
    if (op->req.prescale == 0)
        op->req.prescale = 1.0;
    if (op->req.postscale == 0)
        op->req.postscale = 1.0;
    if (op->req.coll == KOLO_COLL_BARRIER || op->req.coll == KOLO_COLL_JOIN) {
        op->req.dtype = KOLO_UINT8;
        op->req.ndim = 0;
    }
    op->req.device = request_device(c, r);
    return op;
}

void ops_queue_slow(struct kolo_ctx *c, struct op *op)
{
    /* A cached allreduce goes by its id on the coordinator-only path
     * (KOLO_FAST_PATH=0: Horovod's response cache). With readiness rounds
     * the ids belong to the ranks' rounds: what they send the coordinator
     * (join, timeline, invalidated ops) goes in full, since a coordinator
     * that restarted never gave those ids. */
    if (op->req.coll == KOLO_COLL_ALLREDUCE && !c->joined && !c->fast)
        op->cache_id = ops_cache_lookup(c, op);
    op->state = OP_QUEUED;
    op_queue_push(&c->q_head, &c->q_tail, op);
}

int kolo_submit(kolo_ctx *c, const kolo_request *reqs, int n, kolo_handle *handles)
{
    return ops_submit(c, reqs, n, NULL, handles);
}

int ops_submit(kolo_ctx *c, const kolo_request *reqs, int n, void *stream, kolo_handle *handles)
{
    if (!c)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rv = 0;
    if (!reqs || n < 1 || !handles) { /* said, or the last refusal's text would stand */
        rv = ctx_error(c, KOLO_EINVAL, "%s", n < 1 ? "no request to submit (an empty group)"
                                              : "requests or handles NULL");
        goto out;
    }
    /* A request that is wrong in itself is refused for that reason first,
     * whatever became of the job: the same error on every rank, however
     * far its peers got (one that already left makes every later op fail
     * with the sticky error below). */
    for (int i = 0; i < n; i++)
        if ((rv = validate(c, &reqs[i])) != 0)
            goto out;
    if (c->sticky) {
        rv = ctx_error(c, c->sticky, "%s", c->sticky_msg);
        goto out;
    }
    uint64_t hash0 = 0; /* the first request's name's (one request: the usual case) */
    for (int i = 0; i < n; i++) {
        const char *nm = reqs[i].name;
        if (nm && nm[0]) {
            if (strlen(nm) >= WORKER_NAME_MAX) {
                rv = ctx_error(c, KOLO_EINVAL, "operation name longer than %d bytes",
                          WORKER_NAME_MAX - 1);
                goto out;
            }
            uint64_t hash = str_hash(nm);
            if (i == 0)
                hash0 = hash;
            bool dup = by_name_hashed(c, nm, hash) != NULL;
            for (int k = 0; k < i && !dup; k++)
                dup = reqs[k].name && strcmp(reqs[k].name, nm) == 0;
            if (dup) {
                rv = ctx_error(c, KOLO_EEXIST,
                          "Requested to collective-operate a tensor with the same name as "
                          "another tensor that is currently being processed. If you want to "
                          "request another tensor, use a different tensor name. (%s)",
                          nm);
                goto out;
            }
        }
    }
    uint64_t group = n > 1 ? ++c->groups : 0;
    for (int i = 0; i < n; i++) {
        struct op *op = op_new(c, &reqs[i], i == 0 ? hash0 : 0);
        if (op && op->req.device >= 0 && (rv = gpu_op_attach(c, op, stream)) != 0) {
            op_put(c, op); /* the reason is in last_error */
            goto out;
        }
        if (!op || slot_alloc(c, op) != 0) {
            if (op)
                op_put(c, op);
            rv = ctx_error(c, KOLO_ENOMEM, "out of memory");
            goto out; /* ops already queued run; their handles are lost to the caller */
        }
        op->group = group;
        op->group_size = (uint32_t)n;
        if (op->req.coll != KOLO_COLL_JOIN)
            name_add(c, op);
        handles[i] = op->handle;
        /* A cached allreduce or a barrier: agreed by the ranks' rounds. */
        if (fast_submit(c, op))
            continue;
        if (op->req.coll == KOLO_COLL_JOIN) {
            c->joined = true;
            fast_news(c); /* the JOIN flag goes out at the next round */
        }
        ops_queue_slow(c, op);
    }
    ctx_send_queued(c);
out:
    pthread_mutex_unlock(&c->mu);
    return rv;
}

/* ---------------------------------------------------------------- waiting */

int kolo_poll(kolo_ctx *c, kolo_handle h, int *done)
{
    if (!c || !done)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    struct op *op = ops_lookup(c, h);
    if (op)
        *done = op->state == OP_DONE;
    if (op && *done)
        name_remove(c, op); /* seen: its name is free */
    pthread_mutex_unlock(&c->mu);
    return op ? 0 : KOLO_ENOTFOUND;
}

int kolo_wait(kolo_ctx *c, kolo_handle h, int timeout_ms)
{
    if (!c)
        return KOLO_EINVAL;
    /* one clock read on the path of every op: the deadline's base, where
     * the wait starts if the op is not done (the time split), and the
     * "now" of the round this thread may run at once */
    uint64_t in_us = now_mono_us(), round_now = in_us;
    uint64_t end_ms = timeout_ms >= 0 ? in_us / 1000 + (uint64_t)timeout_ms : UINT64_MAX;
    pthread_mutex_lock(&c->mu);
    struct op *op = ops_lookup(c, h);
    if (!op) {
        pthread_mutex_unlock(&c->mu);
        return KOLO_ENOTFOUND;
    }
    c->drivers++;
    /* where the time goes: waiting from here on, unless it is done */
    bool blocks = c->telemetry && op->state != OP_DONE;
    if (blocks)
        time_split_blocked(&c->split, in_us, +1);
    /* the rounds and collectives this thread runs meanwhile may spin
     * longer: it has nothing else to do (coll.h) */
    bool was_idle = coll_thread_idle;
    coll_thread_idle = true;
    bool ran = false; /* the last thing this thread did was a round */
    while (op->state != OP_DONE) {
        ran = ctx_try_execute(c, round_now);
        round_now = 0;
        if (ran)
            continue;
        /* Fast path: wait for a peer's round or local news right here, so
         * the round runs on this thread without a hand-off. */
        if (c->fast) {
            uint64_t now = now_mono_ms();
            if (now >= end_ms)
                break;
            int slice = end_ms - now < 100 ? (int)(end_ms - now) : 100;
            if (fast_idle(c, slice, true))
                continue;
            if (c->idling) /* the background thread: hand the place over */
                c->coll->ops->bell_ring(c->coll);
            /* it broadcasts done when it leaves; the bound is a safety net */
            struct timespec brief;
            mono_deadline(&brief, 50);
            pthread_cond_timedwait(&c->done, &c->mu, &brief);
            continue;
        }
        struct timespec ts;
        mono_ts_us(&ts, in_us + (uint64_t)(timeout_ms >= 0 ? timeout_ms : 0) * 1000);
        int rv = timeout_ms >= 0 ? pthread_cond_timedwait(&c->done, &c->mu, &ts)
                                 : pthread_cond_wait(&c->done, &c->mu);
        if (rv == ETIMEDOUT && op->state != OP_DONE)
            break;
    }
    coll_thread_idle = was_idle;
    /* the op done in a round this thread ran: that round's clock reading
     * is now to within the round's last steps */
    uint64_t now_us = ran && c->round_end_us >= in_us ? c->round_end_us : 0;
    if (blocks && !now_us)
        now_us = now_mono_us();
    if (blocks)
        time_split_blocked(&c->split, now_us, -1);
    /* The background thread answers the peers' rounds once no user thread
     * has waited for BG_TAKEOVER_US (ctx.c): it is not woken here, since
     * a caller that waits again at once (the next op of a loop, the next
     * handle of synchronize) would then find it in idle_wait and have to
     * ring it out - two thread switches on the path of a small op. */
    if (--c->drivers == 0 && c->fast) {
        if (!now_us)
            now_us = now_mono_us();
        /* Except after a long wait (BG_WATCH_LONG_MS, counted as bg_main
         * counts it: from when drivers last fell to 0), in which the
         * background thread may sleep for up to BG_NAP_MS (ctx.c): it
         * must hear at once that the peers' rounds are its own again. */
        if (now_us - c->undriven_since_us >= (uint64_t)BG_WATCH_LONG_MS * 1000)
            pthread_cond_signal(&c->wake);
        c->undriven_since_us = now_us;
    }
    if (op->state != OP_DONE) {
        pthread_mutex_unlock(&c->mu);
        return KOLO_ETIMEDOUT;
    }
    int status = op->status;
    if (status)
        snprintf(c->last_error, sizeof(c->last_error), "%s", op->error ? op->error : "");
    if (op->has_result)
        name_remove(c, op); /* seen: its name is free (slot_release says so too) */
    else
        slot_release(c, op);
    pthread_mutex_unlock(&c->mu);
    return status;
}

int kolo_result(kolo_ctx *c, kolo_handle h, const void **data, size_t *bytes, int64_t *rows,
                const int32_t **recv_splits, int64_t *value)
{
    if (!c)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rv;
    struct op *op = ops_finished(c, h, true, &rv);
    if (op) {
        if (data) /* device memory for a GPU operation */
            *data = op->result ? op->result : op->gpu_result;
        if (bytes)
            *bytes = op->result_bytes;
        if (rows)
            *rows = op->result_rows;
        if (recv_splits)
            *recv_splits = op->recv_splits;
        if (value)
            *value = op->value;
    }
    pthread_mutex_unlock(&c->mu);
    return rv;
}

int kolo_release(kolo_ctx *c, kolo_handle h)
{
    if (!c)
        return KOLO_EINVAL;
    pthread_mutex_lock(&c->mu);
    int rv;
    struct op *op = ops_finished(c, h, false, &rv);
    if (op)
        slot_release(c, op);
    pthread_mutex_unlock(&c->mu);
    return rv;
}

/* ---------------------------------------------------------------- the short forms */

int kolo_allreduce_async(kolo_ctx *c, const char *name, const void *sendbuf, void *recvbuf,
                         size_t count, kolo_dtype dtype, kolo_op op, kolo_handle *handle)
{
    int64_t shape[1] = {(int64_t)count};
    kolo_request r = {.coll = KOLO_COLL_ALLREDUCE,
                      .name = name,
                      .sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .dtype = dtype,
                      .ndim = 1,
                      .shape = shape,
                      .op = op,
                      .device = -1};
    return kolo_submit(c, &r, 1, handle);
}

int kolo_allgather_async(kolo_ctx *c, const char *name, const void *sendbuf, int ndim,
                         const int64_t *shape, kolo_dtype dtype, kolo_handle *handle)
{
    kolo_request r = {.coll = KOLO_COLL_ALLGATHER,
                      .name = name,
                      .sendbuf = sendbuf,
                      .dtype = dtype,
                      .ndim = ndim,
                      .shape = shape,
                      .device = -1};
    return kolo_submit(c, &r, 1, handle);
}

int kolo_broadcast_async(kolo_ctx *c, const char *name, void *buf, size_t count,
                         kolo_dtype dtype, int root, kolo_handle *handle)
{
    int64_t shape[1] = {(int64_t)count};
    kolo_request r = {.coll = KOLO_COLL_BROADCAST,
                      .name = name,
                      .sendbuf = buf,
                      .recvbuf = buf,
                      .dtype = dtype,
                      .ndim = 1,
                      .shape = shape,
                      .root = root,
                      .device = -1};
    return kolo_submit(c, &r, 1, handle);
}

int kolo_alltoall_async(kolo_ctx *c, const char *name, const void *sendbuf, int ndim,
                        const int64_t *shape, kolo_dtype dtype, const int32_t *splits,
                        kolo_handle *handle)
{
    kolo_request r = {.coll = KOLO_COLL_ALLTOALL,
                      .name = name,
                      .sendbuf = sendbuf,
                      .dtype = dtype,
                      .ndim = ndim,
                      .shape = shape,
                      .splits = splits,
                      .nsplits = splits && c ? c->size : 0,
                      .device = -1};
    return kolo_submit(c, &r, 1, handle);
}

int kolo_reducescatter_async(kolo_ctx *c, const char *name, const void *sendbuf, void *recvbuf,
                             int ndim, const int64_t *shape, kolo_dtype dtype, kolo_op op,
                             kolo_handle *handle)
{
    kolo_request r = {.coll = KOLO_COLL_REDUCESCATTER,
                      .name = name,
                      .sendbuf = sendbuf,
                      .recvbuf = recvbuf,
                      .dtype = dtype,
                      .ndim = ndim,
                      .shape = shape,
                      .op = op,
                      .device = -1};
    return kolo_submit(c, &r, 1, handle);
}

int kolo_barrier_async(kolo_ctx *c, kolo_handle *handle)
{
    kolo_request r = {.coll = KOLO_COLL_BARRIER, .device = -1};
    return kolo_submit(c, &r, 1, handle);
}

int kolo_join_async(kolo_ctx *c, kolo_handle *handle)
{
    kolo_request r = {.coll = KOLO_COLL_JOIN, .device = -1};
    return kolo_submit(c, &r, 1, handle);
}

/* ---------------------------------------------------------------- completion by an executor */

/* when this thread's last ops_finish began (ops_done_since) */
static __thread uint64_t done_us;

uint64_t ops_done_since(uint64_t since)
{
    return done_us >= since ? done_us : now_mono_us();
}

/* Completes the ops of a response; a failure becomes sticky. Cache ids
 * are recorded first: once complete, an op may be freed by its waiter. */
void ops_finish(struct kolo_ctx *c, struct op **ops, size_t n, int rc, const char *why,
                const uint32_t *cache_ids, size_t ncache)
{
    done_us = now_mono_us(); /* before a waiter may submit the next op */
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n && i < ncache && rc == 0 && !c->exec_stale; i++)
        if (ops[i] && cache_ids[i])
            ops_cache_put(c, ops[i], cache_ids[i]);
    for (size_t i = 0; i < n; i++)
        if (ops[i])
            ops_complete(c, ops[i], rc, why);
    if (rc && !c->sticky) {
        c->sticky = rc;
        snprintf(c->sticky_msg, sizeof(c->sticky_msg), "%s", why ? why : kolo_strerror(rc));
        ops_fail_all(c, c->sticky, c->sticky_msg);
        LOGW("kolo", "rank %d: data plane failed: %s", c->rank, c->sticky_msg);
    }
    pthread_mutex_unlock(&c->mu);
}
