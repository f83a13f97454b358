/*
 * ctx_model.h - libkolo's context and operations: the state every file
 * of runtime/ shares, and the few functions that only read or write it
 * (ctx_model.c). What each file does with it is in that file's header:
 * ctx.h (init, the background thread, the log), ops.h (handles, submit,
 * wait), fastpath.h (readiness rounds), exec.h and nccl_exec.h (the
 * executors), solo.h, report.h, snapshot.h, timeline.h.
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
#ifndef KOLO_WORKER_CTX_MODEL_H
#define KOLO_WORKER_CTX_MODEL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "coll.h"
#include "kolo.h"
#include "kolo.pb-c.h"
#include "round.h"
#include "time_split.h"
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
    size_t name_cap, shape_cap; /* their sizes, kept when the op is recycled */
    uint64_t name_hash;         /* str_hash(name), computed once */
    uint32_t cache_id; /* submitted by cache id */
    uint64_t fast_since_us; /* monotonic µs it began waiting in rounds (0: not
                             * yet, set by the next round's start) */
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
    /* GPU operations (nccl_exec.h): the producer's event, recorded at submit;
     * a device-resident result (allgather, alltoall) and the stream its
     * last copy went to, where it is freed. */
    void *gpu_event;
    void *gpu_result;
    void *gpu_result_stream;
    /* A traced GPU op's timeline span (fastpath.c), sent when the op
     * completes: its kernels end after the launch returned. */
    Kolo__TraceSpan *trace;
    struct op *next;      /* submit queue; the free ops' list (ops.c) */
    struct op *name_next; /* name table chain: from submission until seen done */
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
    uint64_t worker_id; /* elastic: the worker, which keeps its host segment (keep.h) */
    bool solo;          /* one rank without a coordinator: no rpc, a local log (solo.c) */
    /* what a process set's context is made from (kolo_process_set_init) */
    char *host_id, *data_addr;
    bool disable_shm;
    bool encrypt_data; /* seal the TCP data plane (seal.h) */
    char **peer_hosts;  /* [size]: each rank's host id, from the rendezvous (one block) */
    uint64_t update_ms; /* pending membership update (under mu) */
    int update_kind;
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    /* this generation's ranks on this machine, other hosts' on it
     * included (RendezvousRequest.machine): whether waits may spin */
    int machine_ranks;
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
    /* finished ops kept for the next submissions (ops.c, op_get) */
    struct op *op_pool;
    uint32_t op_pooled;
    /* taken names: ops in flight, and ops done that their caller has not
     * seen end yet (ops.c, "names") */
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
    struct tensor_cache *carried; /* the rendezvous's, until fast_init makes it the cache */
    bool joined;
    bool executing; /* someone runs a response: the executor token */
    bool resume;    /* the coordinator restarted: send a resume request */
    uint64_t exec_since; /* monotonic ms the running response started, 0: none */
    bool exec_stale;     /* the running response predates a resume: its cache ids are void */
    struct held_resp history[WORKER_HISTORY];
    int gpu_join_device; /* the device a join named, -1 none (nccl_exec.h) */

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
        uint32_t id, at; /* at: word offset in the payload */
        uint64_t hdr;    /* round_pay_hdr: dtype, op, elements, data words */
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
    uint64_t round_end_us;  /* now_mono_us() when the last round's exchange ended */

    /* ---- where the rank's time goes (time_split.h); under mu ---- */
    bool telemetry; /* KOLO_TELEMETRY: the split and the rounds' waits reported */
    struct time_split split;

    /* ---- background thread only ---- */
    void *fusion;
    size_t fusion_cap;
    void *zeros;
    size_t zeros_cap;
    struct gpu *gpu; /* the GPU backend, NULL until a GPU op (nccl_exec.c) */
};

/* ctx_model.c */
/* ctx_deadline: the monotonic ms by which an operation of c must be done
 * (its timeout from now). */
uint64_t ctx_deadline(const struct kolo_ctx *c);
/* ctx_error records the detail of a refused call and returns code. */
int ctx_error(struct kolo_ctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ctx_set_error(struct kolo_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ctx_wake(struct kolo_ctx *c);
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

#endif
