/*
 * worker_int.h - libkolo's context, operations and background thread.
 *
 * Threads. User threads submit operations (ops.c) and wait on them; one
 * background thread per context (ctx.c) sends the queued requests to the
 * coordinator, receives the ordered response log, and executes each
 * response on the data plane (exec.c). Negotiation calls are asynchronous
 * (their replies arrive on nng threads and are handed to the background
 * thread), so a new request never waits behind a parked call: the
 * coordinator answers the older call as soon as a newer one arrives.
 *
 * Everything below the mutex is guarded by it; the data-plane state
 * (coll, fusion buffer) belongs to the background thread alone.
 */
#ifndef KOLO_WORKER_WORKER_INT_H
#define KOLO_WORKER_WORKER_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "coll.h"
#include "kolo.h"
#include "kolo.pb-c.h"
#include "round.h"
#include "rpc.h"
#include "tls.h"

#define WORKER_NEGOTIATE_WAIT_MS 1000
#define WORKER_NAME_MAX 512
/* How long the background thread watches a user thread's wait every
 * 5 ms before it looks ever less often (ctx.c, bg_main); a waiter that
 * ends a wait this long wakes it (ops.c, kolo_wait). */
#define BG_WATCH_LONG_MS 20

enum op_state { OP_QUEUED, OP_SENT, OP_DONE };

struct op {
    kolo_handle handle;
    enum op_state state;
    int status;
    char *error;
    /* the request, with owned copies of name, shape and splits */
    kolo_request req;
    char *name;
    int64_t *shape;
    int32_t *splits;
    uint32_t cache_id; /* submitted by cache id */
    uint64_t fast_since_us; /* monotonic µs it began waiting in rounds */
    bool fast;           /* the readiness rounds own it (not the coordinator) */
    bool answered;     /* its response has arrived (it may not have run yet) */
    /* An executor is running it with mu released: only that executor
     * completes it (a failure elsewhere does not), so its buffers and the
     * struct stay alive until the data plane is done with them. */
    bool pinned;
    bool moded; /* at the coordinator because of a mode (counted in moded_ops) */
    uint64_t group;
    uint32_t group_size;
    /* results (allgather, alltoall, join) */
    void *result;
    size_t result_bytes;
    int64_t result_rows;
    int32_t *recv_splits;
    int64_t value;
    bool has_result;
    /* GPU operations (gpu.h): the producer's event, recorded at submit;
     * a device-resident result (allgather, alltoall) and the stream its
     * last copy went to, where it is freed. */
    void *gpu_event;
    void *gpu_result;
    void *gpu_result_stream;
    /* A traced GPU op's timeline span (fastpath.c), sent when the op
     * completes: its kernels end after the launch returned. */
    Kolo__TraceSpan *trace;
    struct op *next;      /* submit queue */
    struct op *name_next; /* in-flight name table chain */
};

#define NAME_BUCKETS 1024
/* Responses kept (packed) after they arrive, for a coordinator that
 * restarted and rebuilds the log from what the ranks hold. */
#define WORKER_HISTORY 256

struct held_resp {
    uint64_t index;
    uint8_t *bytes; /* NULL: empty slot */
    size_t len;
};

struct kolo_ctx {
    /* identity and topology (read-only after init) */
    uint64_t job, generation;
    uint32_t session;   /* re-joins of this generation by this process (ctx.c) */
    int process_set;    /* 0: the job; else a set of its ranks (kolo_process_set_init) */
    bool elastic;
    bool solo;          /* one rank without a coordinator: no rpc, a local log (solo.c) */
    /* what a process set's context is made from (kolo_process_set_init) */
    char *host_id, *data_addr;
    bool disable_shm;
    bool encrypt_data; /* seal the TCP data plane (seal.h) */
    char **peer_hosts;  /* [size]: each rank's host id, from the rendezvous */
    uint64_t update_ms; /* pending membership update (under mu) */
    int update_kind;
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    int timeout_ms;
    int64_t fusion_threshold;
    int64_t stall_warning_ms, stall_shutdown_ms;
    struct rpc_client *rpc;
    struct coll *coll;

    pthread_t bg;
    bool bg_running;
    /* The watch thread keeps a negotiation call open while a response runs
     * long (the background thread cannot: it is running it), so that a
     * restarted coordinator can ask this rank to resume. */
    pthread_t watch;
    bool watch_running;
    pthread_cond_t watch_cv;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the background thread waits on it */
    pthread_cond_t done; /* user threads waiting for ops */

    /* ---- under mu ---- */
    bool stopping;
    bool leaving;        /* send shutdown to the coordinator */
    char leave_reason[200];
    int sticky;          /* once set, every op fails with it */
    char sticky_msg[512];
    char last_error[1024];
    /* handles */
    struct op **slots;
    uint32_t *slot_seq;
    uint32_t nslots, slot_cap;
    uint32_t *free_slots;
    uint32_t nfree;
    /* in-flight names */
    struct op *names[NAME_BUCKETS];
    /* submit queue: ops not yet sent */
    struct op *q_head, *q_tail;
    int inflight;       /* ops sent and not done */
    int calls;          /* negotiate calls outstanding */
    uint64_t cursor;    /* next log index to receive */
    /* received, not yet executed responses, by log index */
    Kolo__Response **resp;
    uint64_t resp_base; /* log index of resp[0] == next to execute */
    size_t resp_cap;
    uint64_t unnamed;
    uint64_t groups;
    uint64_t barriers;
    struct tensor_cache *cache; /* the response cache (negotiation/cache.h) */
    bool joined;
    bool executing; /* someone runs a response: the executor token */
    bool resume;    /* the coordinator restarted: send a resume request */
    uint64_t exec_since; /* monotonic ms the running response started, 0: none */
    bool exec_stale;     /* the running response predates a resume: its cache ids are void */
    struct held_resp history[WORKER_HISTORY];
    int gpu_join_device; /* the device a join named, -1 none (gpu.h) */

    /* ---- snapshot.c (under mu) ---- */
    char *coord_url, *coord_token; /* kolo_init's, for the snapshot connection */
    bool coord_token_job; /* coord_token is the job's credential, not the cluster's */
    struct tls_files tls; /* KOLO_TLS_*: how to reach a TLS coordinator (common/tls.h) */
    struct rpc_client *snap_rpc;   /* its own connection, opened on first use */
    int snap_calls;                /* snapshot calls running (kolo_fini waits) */
    uint64_t snap_seq;             /* puts so far */
    bool snap_closed;              /* kolo_snapshot_cancel: no new calls */

    /* ---- report.c (issue 6): its own lock; created on the first report ---- */
    struct report *report;

    /* ---- the fast path (fastpath.c): readiness rounds; under mu ---- */
    bool fast;         /* rounds on: KOLO_FAST_PATH != 0 and the backend has them */
    bool fast_dirty;   /* something new to contribute since the last round */
    bool fast_leaving; /* kolo_fini's last round (ROUND_F_SHUTDOWN) is due or runs */
    bool join_mode;    /* a rank joined: every op goes through the coordinator */
    bool timeline_heard; /* the coordinator writes a timeline: ROUND_F_TRACE */
    bool timeline_asked; /* this rank started it (kolo_timeline): TRACE at once, not
                          * once the long-poll tells, so the ops right after
                          * start_timeline are in it */
    bool slow_mode;      /* some rank asked for ROUND_F_SLOW in the last round */
    /* Where a cached allreduce or a barrier goes (rounds or coordinator)
     * must be decided from the same round's outcome on every rank:
     * submitted while a round is in flight, it waits for that outcome
     * (defer_*); sent to the coordinator because of a mode (join),
     * it keeps ROUND_F_SLOW up until it is done (moded_ops), so the ranks
     * that submit it later send it there too. */
    bool round_busy;
    uint64_t wait_reported; /* the waiting_since_ms already logged (ctx.c) */
    struct op *defer_head, *defer_tail;
    uint32_t moded_ops;
    bool idling;       /* a thread sits in coll->idle_wait (one at a time) */
    int drivers;       /* user threads inside kolo_wait */
    uint64_t undriven_since_us; /* when drivers last fell to 0 */
    uint64_t round;    /* rounds completed */
    uint64_t cache_epoch;
    struct op **pending;         /* [ROUND_MAX_ID + 1]: the op waiting under each id */
    uint64_t ready_bits[64];     /* ids pending here (bit 0: a barrier) */
    uint64_t invalid_bits[64];   /* ids to drop everywhere at the next round */
    struct op *bar_head, *bar_tail; /* barriers waiting for the barrier bit */
    int64_t fast_stall_ms;       /* a cached op pending this long is invalidated */
    uint64_t fast_last_stall_check;
    uint64_t poll_retry_at;      /* monotonic ms: no long-poll before (it failed) */
    uint64_t *vec;               /* the round vector (executor only) */
    /* The round's payload (round.h): a slot per tiny cached allreduce,
     * laid out from the cache again when it changed (cache_changes,
     * counted by ops.c's cache functions; pay_seen: when laid out). */
    struct pay_slot {
        uint32_t id, at, count, words; /* at: word offset in the payload */
        uint64_t hdr;
    } *pay;
    uint32_t npay, pay_words;
    uint64_t cache_changes, pay_seen;
    uint64_t fast_inline;        /* agreed ops the round's payload completed */
    struct op **agreed;          /* [ROUND_MAX_ID]: a round's agreed ops (executor only) */
    struct fusion_item *agreed_items; /* [ROUND_MAX_ID]: their fusion keys */
    int64_t fused_threshold;     /* rank 0's, from the rendezvous */
    uint64_t fast_rounds, fast_agreed; /* counters, for tests and debugging */
    uint64_t fast_evicted;             /* cache ids the coordinator gave to another name */
    double fast_wait_avg_s; /* moving average of this rank's wait per agreed op */

    /* ---- background thread only ---- */
    void *fusion;
    size_t fusion_cap;
    void *zeros;
    size_t zeros_cap;
    struct gpu *gpu; /* the GPU backend, NULL until a GPU op (nccl_exec.c) */
};

/* ctx.c */
/* ctx_deadline: the monotonic ms by which an operation of c must be done
 * (its timeout from now). */
uint64_t ctx_deadline(const struct kolo_ctx *c);
void ctx_set_error(struct kolo_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* timeline.c: rank 0's copy of the job's timeline goes on in (or, with
 * HOROVOD_TIMELINE, starts with) a new context, and is made current and
 * a valid file when one ends. Contexts of process sets leave it alone. */
void timeline_ctx_init(struct kolo_ctx *c);
void timeline_ctx_fini(struct kolo_ctx *c);
/* ctx_error records the detail of a refused call and returns code. */
int ctx_error(struct kolo_ctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ctx_wake(struct kolo_ctx *c);
/* ctx_fail sets the sticky error and fails everything pending (mu held). */
void ctx_fail(struct kolo_ctx *c, int code, const char *msg);
/* ctx_run_log_entry executes the next response of the log, which must
 * have arrived (mu and the executor token held; mu released meanwhile). */
void ctx_run_log_entry(struct kolo_ctx *c);
void ctx_send_queued(struct kolo_ctx *c);
bool ctx_try_execute(struct kolo_ctx *c);
/* ctx_token_release gives the executor token back and wakes whoever waits
 * for it or for an op it completed (mu held). */
void ctx_token_release(struct kolo_ctx *c);
/* ctx_rpc_config fills what every coordinator connection of c is opened
 * with (url, credential, identity written into ident); c's fields are
 * read, so callers hold mu where they may change. */
struct rpc_client_config;
void ctx_rpc_config(const struct kolo_ctx *c, char *ident, size_t identlen,
                    struct rpc_client_config *rc);
/* ctx_log_put keeps response x, for log index x->index, until it runs
 * (mu held); false when it is not kept (already run, a repeat, no
 * memory), and then x is freed. */
bool ctx_log_put(struct kolo_ctx *c, Kolo__Response *x);

/* solo.c: the one-rank context of a process started without kolo run */
/* solo_config checks a configuration without a coordinator (a size above
 * 1 is refused, with the reason in err) and fills cfg with one rank's. */
int solo_config(const kolo_config *given, kolo_config *cfg, char *err, size_t errlen);
/* solo_setup makes the data plane of one rank (a ring of one). */
int solo_setup(struct kolo_ctx *c);
/* solo_negotiate answers every queued op at once with the log entry a
 * coordinator writes for one rank, appended to the log (mu held). */
void solo_negotiate(struct kolo_ctx *c);

/* ops.c (caller holds mu unless noted) */
/* request_elems: the number of elements of r's tensor (product of its shape). */
int64_t request_elems(const kolo_request *r);
/* op_queue_push appends op to the singly linked list head..tail (op->next). */
void op_queue_push(struct op **head, struct op **tail, struct op *op);
/* op_queue_pop takes the first op off head..tail (NULL when empty). */
struct op *op_queue_pop(struct op **head, struct op **tail);
struct op *ops_lookup(struct kolo_ctx *c, kolo_handle h);
/* ops_finished: the op of handle h once it has finished (and, ok, with
 * success), else NULL with *rv the reason: KOLO_ENOTFOUND, KOLO_ESTATE
 * (recorded as the last error) or its failure (mu held). */
struct op *ops_finished(struct kolo_ctx *c, kolo_handle h, bool ok, int *rv);
struct op *ops_by_name(struct kolo_ctx *c, const char *name);
void ops_complete(struct kolo_ctx *c, struct op *op, int status, const char *error);
void ops_fail_all(struct kolo_ctx *c, int status, const char *error);
/* Queues op for the coordinator (mu held; the caller sends the queue). */
void ops_queue_slow(struct kolo_ctx *c, struct op *op);
void ops_free_all(struct kolo_ctx *c);
uint32_t ops_cache_lookup(struct kolo_ctx *c, const struct op *op);
void ops_cache_put(struct kolo_ctx *c, const struct op *op, uint32_t id);
/* ops_cache_clear forgets every cache id (the coordinator lost its cache). */
void ops_cache_clear(struct kolo_ctx *c);
/* ops_cache_id_of: the id name is cached under, whatever its signature (0: none). */
uint32_t ops_cache_id_of(struct kolo_ctx *c, const char *name);
/* ops_cache_forget_id drops the signature cached under id. */
void ops_cache_forget_id(struct kolo_ctx *c, uint32_t id);
/* ops_cache_name_of: the name cached under id, NULL if none. */
const char *ops_cache_name_of(struct kolo_ctx *c, uint32_t id);

/* ops.c: kolo_submit with the stream GPU requests wait on (gpu.h) */
int ops_submit(struct kolo_ctx *c, const kolo_request *reqs, int n, void *stream,
               kolo_handle *handles);

/* snapshot.c: kolo_fini stops the snapshot calls (mu not held), then
 * ctx_free frees what they used. */
void snapshot_ctx_stop(struct kolo_ctx *c);
void snapshot_ctx_free(struct kolo_ctx *c);

/* report.c (issue 6): kolo_fini flushes and stops the report sender
 * (mu not held); ctx_free frees it. */
void report_ctx_stop(struct kolo_ctx *c);
/* report_start starts the sender before any report (readiness rounds send
 * telemetry from the first round; call it without c->mu). report_round
 * queues one round's telemetry: ops agreed, this rank's moving average
 * wait per op, and the round's reduced longest wait in microseconds. */
int report_start(struct kolo_ctx *c);
void report_round(struct kolo_ctx *c, uint32_t agreed, double wait_avg_s, uint64_t wait_us);
void report_ctx_free(struct kolo_ctx *c);
/* The timeline's spans (fastpath.c, ctx.c): report_span_fill makes s a
 * span with copies of name and shape (false: out of memory);
 * report_trace hands n spans to the sender, which owns their copies from
 * then (a full queue drops them, counted); report_span_free frees one's
 * copies. */
bool report_span_fill(Kolo__TraceSpan *s, const char *name, const int64_t *shape, int ndim);
void report_span_free(Kolo__TraceSpan *s);
void report_trace(struct kolo_ctx *c, Kolo__TraceSpan *spans, size_t n);

/* fastpath.c: readiness rounds among the ranks (docs/design.md) */
int fast_init(struct kolo_ctx *c);   /* after the data plane is up */
void fast_free(struct kolo_ctx *c);
/* fast_submit classifies a new op (mu held): true when the fast path took
 * it (a cached allreduce, or a barrier); false: it goes to the
 * coordinator, with op->cache_id set where the coordinator's cache path
 * applies (join mode). */
bool fast_submit(struct kolo_ctx *c, struct op *op);
/* fast_cache_reset: a log entry clears every rank's response cache (a
 * restarted coordinator found the ranks' tables in disagreement): ops
 * waiting under a cache id go to the coordinator in full (mu held). */
void fast_cache_reset(struct kolo_ctx *c);
/* fast_evict: a log entry gives cache id to name; if another name holds
 * it, that one leaves the cache and its pending op goes to the
 * coordinator in full (mu held; every rank runs the entry at the same
 * point). */
void fast_evict(struct kolo_ctx *c, uint32_t id, const char *name);
/* fast_try runs one round and its outcome if there is a reason to (mu
 * held; takes the executor token); false when there was nothing to do. */
bool fast_try(struct kolo_ctx *c);
/* fast_idle waits in the backend's idle_wait for up to ms (mu held,
 * released meanwhile), if no other thread does; false if it did not. */
bool fast_idle(struct kolo_ctx *c, int ms, bool spin);
/* fast_news: a local event worth a round (mu held). */
void fast_news(struct kolo_ctx *c);
/* fast_leave: kolo_fini's last round, which tells the peers this rank
 * leaves (ROUND_F_SHUTDOWN) so that their pending ops fail at once in
 * Horovod's words, the coordinator reachable or not (mu held; at most
 * ms, then the rank leaves without it). */
void fast_leave(struct kolo_ctx *c, int ms);

/* exec.c (background thread, mu not held) */
void exec_response(struct kolo_ctx *c, const Kolo__Response *r);
/* Runs a response on ops the caller already holds (the agreed ops of a
 * readiness round), pinned by the caller under mu (op.pinned); r's names
 * are not read. */
void exec_pinned(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops);
/* exec_post_scale: a reduction's average and postscale, after it
 * (plan.h: post_divisor, post_factor). */
struct plan;
void exec_post_scale(const struct plan *p, void *buf, size_t count);
/* exec_done_since: when the ops this thread ran since `since` ended (its
 * last exec_finish, before their waiters could submit anything else), for
 * the timeline's spans (fastpath.c, ctx.c); now if it finished none since
 * then (a GPU op of the coordinator's log, which its finaliser completes
 * on its own thread: the time its launch returned; the rounds' GPU ops
 * carry their span to ops_complete instead). */
uint64_t exec_done_since(uint64_t since);
/* Completes ops[0..n) with rc (recording cache ids on success); a
 * failure becomes the context's sticky error. Takes mu. */
void exec_finish(struct kolo_ctx *c, struct op **ops, size_t n, int rc, const char *why,
                 const uint32_t *cache_ids, size_t ncache);

#endif
