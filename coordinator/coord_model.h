/*
 * coord_model.h - the coordinator's in-memory state: hosts, jobs and their
 * ranks, metrics, and struct coord. The bottom of the coordinator's
 * layers (README, "Layout"); every coordinator file may include it.
 *
 * Threading: everything in struct coord below the "state" line belongs to
 * whoever holds c->mtx, and only coord_post (one RPC or HTTP request, on
 * the nng thread that received it), the tick thread (coord_cron:
 * leases, parked-call deadlines, pending jobs) and the writer threads
 * (coord_writer.h, to finish a write they did without it) take it. So
 * handlers run one at a time, as in redis's single-owner model, but
 * without handing each request to another thread: negotiation latency is
 * a goal. A
 * handler answers at once or parks the call (heartbeats, output streams,
 * rendezvous, negotiation) until something changes or its deadline
 * passes. Handlers never block: no network waits, only small SQLite
 * writes; snapshot commits and output appends go to the writer threads.
 * (One more exception, explained in coord_snap.c: a snapshot chunk is
 * hashed with the lock released.)
 */
#ifndef KOLO_COORDINATOR_COORD_MODEL_H
#define KOLO_COORDINATOR_COORD_MODEL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include <protobuf-c/protobuf-c.h>

#include "buf.h"
#include "coord.h"
#include "rpc.h"
#include "store.h"
#include "tls.h"

struct jw;           /* json.h */
struct negot;        /* coord_negot.h */
struct timeline;     /* coord_timeline.h */
struct coord_writer; /* coord_writer.h */

#define COORD_CRON_MS 100
#define COORD_MAX_NP  65536
/* --straggler-policy: a host whose ranks cost the job's steps at least
 * STRAGGLER_COST for the window (default STRAGGLER_WINDOW_MS) */
#define STRAGGLER_COST      0.15
#define STRAGGLER_WINDOW_MS 120000u
/* What a worker's call parked at the stop is answered, with KOLO_EIO (a
 * code workers retry): a restarted coordinator resumes them. */
#define COORD_STOPPING_WHY "the coordinator is stopping (it may be restarting): ask again"

enum host_state { HOST_ALIVE, HOST_LOST };
enum job_state { JOB_PENDING, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED, JOB_STOPPED };
enum rank_state { RANK_ASSIGNED, RANK_RUNNING, RANK_EXITED, RANK_LOST };

struct host {
    struct host *next;
    char id[64];
    char name[128];
    char hostname[256];
    char addr[256];
    int slots;
    int cpus;
    int gpus;
    char *gpu_names_json;
    uint64_t mem_bytes;
    enum host_state state;
    bool drained; /* POST /api/v1/hosts/{id}/drain: no new work, elastic jobs leave */
    bool leaving; /* drained by its agent's shutdown: undrained when it registers again */
    int64_t order;
    uint64_t registered_ms;  /* wall clock, first registration */
    uint64_t last_seen_ms;   /* wall clock */
    uint64_t lease_deadline; /* monotonic */
    uint64_t last_seen_mono;
    char session[40]; /* empty when no live session */
    char agent_instance[64];
    char superseded_instance[64]; /* instance replaced by a newer one */
    uint64_t superseded_mono;
    uint64_t last_batch_seq;       /* the last report applied */
    uint64_t lines_batch_seq;      /* the last report whose lines are stored */
    struct out_write *out_pending; /* its report whose lines are being stored */
    uint64_t desired_counter;      /* bumped when the host's worker set changes */
    struct rpc_call *parked_hb;
    uint64_t parked_deadline; /* monotonic */
    /* kolo stacks asked of this host (coord_stacks.c): every heartbeat
     * reply carries it until the host's answer came; 0 none */
    uint64_t stacks_job, stacks_seq;
};

struct rank {
    int rank;
    uint64_t wid;      /* worker id: the process, stable across generations */
    struct host *host; /* NULL if the host is unknown (after reload) */
    char host_id[64];
    int local_rank, local_size, cross_rank, cross_size;
    enum rank_state state;
    int exit_code;
    int term_signal;
    int pid;
    /* elastic: since when (monotonic ms) this member has been placed in
     * generations it did not join; 0 once it joins one */
    uint64_t unjoined_since;
    /* how long its agent has seen its process stopped by a signal
     * (HeartbeatRequest.stopped), 0 when not; told: the notice was sent */
    uint32_t stopped_ms;
    int stopped_pid; /* the stopped process (the command, under the agent's shim) */
    bool stopped_told;
    bool in_init; /* a spare (job.spares) waiting in hvd.init() for a place */
};

struct waiter {
    struct waiter *next;
    struct rpc_call *call;
    uint64_t after_seq;
    uint32_t max_lines;
    bool notices; /* StreamOutputRequest.notices, after_notice */
    uint64_t after_notice;
    uint64_t deadline; /* monotonic */
};

/* A host an elastic job does not use for now (its workers failed, or it
 * lost its lease). until == 0: for good (no cooldown range). */
struct exclusion {
    struct exclusion *next;
    char host_id[64];
    int count;      /* times excluded */
    uint64_t until; /* monotonic ms; 0 = for good */
    bool active;
    bool evict; /* its members leave too (a straggler), while active */
};

/* What a submission asks for; elastic false: a fixed-size job. */
struct elastic_opts {
    bool elastic;
    int min_np, max_np, reset_limit;
    uint32_t cooldown_lo_s, cooldown_hi_s, timeout_ms;
    const char *discovery;
    int slots_per_host;
    int spares; /* hot spares kept started, waiting in hvd.init() (coord_elastic.c) */
    /* every job, not only elastic ones (coord_report.c's straggler watch) */
    const char *straggler_policy; /* NULL, "", "warn" or "exclude" */
    uint32_t straggler_window_ms; /* 0: STRAGGLER_WINDOW_MS */
};

/* A job as submitted (AdminService.SubmitJob, REST POST /jobs). env and
 * meta are "NAME=value" / "key=value" strings; eo NULL: fixed size. */
struct job_request {
    char **argv;
    int argc;
    char **env;
    int nenv;
    const char *cwd;
    int np;
    const char *hosts; /* -H spec, NULL or "" = any */
    const char *name;  /* NULL or "": the command */
    uint32_t start_timeout_ms;
    const struct elastic_opts *eo;
    char **meta;
    int nmeta;
};

/* Job metadata limits (coord_job_submit checks them). */
#define JOB_META_MAX       32   /* entries */
#define JOB_META_KEY_MAX   64   /* bytes of a key: [A-Za-z0-9._-] */
#define JOB_META_VALUE_MAX 8192 /* bytes of a value */

/* The elastic part of a job (coord_elastic.c); NULL for a fixed-size job. */
struct elastic {
    int min_np, max_np;
    int spares_want;    /* --spares */
    int spare_failures; /* spares in a row that died before a place was theirs */
    int reset_limit; /* 0: unlimited */
    int resets;
    uint32_t cooldown_lo_s, cooldown_hi_s; /* 0 0: excluded for good */
    uint32_t timeout_ms;                   /* waiting for min_np slots */
    char *discovery;                       /* host discovery script, or NULL */
    int slots_per_host;
    /* the current generation is closed and the next one cannot form yet */
    bool waiting;
    uint64_t wait_deadline; /* monotonic */
    char *wait_cause;       /* what closed the generation */
    /* a membership update the workers have not acted on (Horovod's
     * HostsUpdatedInterrupt): wall-clock stamp and kind (1 removed, 2
     * added, 3 mixed) */
    uint64_t update_ms;
    int update_kind;
    char leave_why[160];  /* why hosts are being left ("host b drained"), for the cause */
    bool finishing;       /* a member exited 0: the job is ending, no new generations */
    /* members that exited with an error of their own (a code, no signal)
     * since a generation last formed in full, and the first of them: when
     * no member is left, the job fails with it at once (the code is at
     * fault, not the cluster; Horovod's "all workers failed") */
    int fail_streak;
    int fail_first_code;
    char fail_first_why[600];
    /* the error line (a traceback's last) of the latest worker that failed
     * with an error of its own, and how many failed with it in a row: the
     * same error every time is the code's (SAME_ERROR_LIMIT, coord_jobs.c) */
    char same_error[400];
    int same_error_count;
    uint64_t closed_mono; /* monotonic ms the generation closed; 0 once the next one joined */
    /* The last failure's recovery (issue 32): detected at rec_mono (a
     * member failed or its host was lost); the generation that formed
     * next (rec_gen, 0 until then) and how long that took; its rank 0
     * reports the rest (WorkerReportRequest.recovery): job.recovered. */
    uint64_t rec_mono, rec_gen, rec_formed_ms;
    char rec_why[200];
    struct exclusion *excl;
    struct parked_assign *assign; /* workers waiting for their place */
    /* discovery results (coord_elastic.c's discovery thread) */
    struct disc_host *disc;
    int ndisc;
    bool disc_ok;     /* at least one run succeeded */
    char *disc_error; /* last failure, or NULL */
};

/* Why an elastic job's member is gone. */
enum elastic_cause { CAUSE_FAILURE, CAUSE_HOST_LOST, CAUSE_RESET, CAUSE_CAPACITY };

struct job {
    struct job *next;
    uint64_t id;
    char *name;
    enum job_state state;
    int np;
    char **argv;
    int argc;
    char **env;
    int nenv;
    char *cwd;
    char *hosts; /* -H spec, "" = any */
    char **meta; /* "key=value" labels fixed at submit (JOB_META_*) */
    int nmeta;
    int exit_code;
    char *reason; /* why it is pending, or why it ended */
    uint64_t generation;
    uint32_t start_timeout_ms;
    uint64_t submitted_ms, started_ms, ended_ms;
    /* A rank exited with a HorovodInternalError (another rank's failure
     * caused it): the job fails with it at this monotonic time unless a
     * rank with a cause of its own exits before (coord_jobs.c). */
    uint64_t fail_consequence_at;
    int fail_consequence_code;
    char fail_consequence_why[600];
    uint64_t pending_deadline; /* monotonic, 0 = none */
    struct rank *ranks;
    int nranks;
    uint64_t out_seq;       /* last output sequence number assigned */
    uint64_t out_stored;    /* last one the output writer is done with */
    struct waiter *waiters; /* parked StreamOutput calls */
    uint64_t last_notice;   /* id of the job's newest notice event (coord_event_notice) */
    struct stacks *stacks;  /* kolo stacks being taken (coord_stacks.c), NULL none */
    /* elastic hot spares (coord_elastic.c): processes started outside the
     * generation, waiting in hvd.init() for a place; rank -1, state
     * ASSIGNED until their agent reports them started, then RUNNING */
    struct rank *spares;
    int nspares;
    /* --straggler-policy (coord_report.c): exclude or only warn, after
     * how long; the hosts being watched */
    bool straggler_exclude;
    uint32_t straggler_window_ms;
    struct straggler_watch *sw;
    int nsw;
    uint64_t sw_checked; /* monotonic ms of the last look */
    struct negot *negot;    /* rendezvous and negotiation of the generation */
    /* process sets of the generation (kolo_process_set_init): a rendezvous
     * and negotiation each, made at its first rendezvous */
    struct job_set {
        uint32_t id;
        struct negot *n;
    } * sets;
    int nsets;
    uint64_t next_wid;   /* worker ids handed out so far */
    struct elastic *el;  /* NULL: fixed size */
    struct timeline *tl; /* coord_timeline.c: HOROVOD_TIMELINE, or NULL */
    /* one stopped at run time under readiness rounds: it takes the ranks'
     * spans of what ran before the stop for a moment, then closes */
    struct timeline *tl_draining;
    bool tl_checked;     /* the job's env was looked at for it */
    char *tl_last;       /* the file of a timeline stopped at run time, or NULL */
};

enum work_kind { WORK_RPC, WORK_HTTP };

struct work {
    struct work *next;
    enum work_kind kind;
    struct rpc_call *call;
    nng_aio *aio;
};

/* RPC methods, for dispatch and per-method metrics. */
/*
 * The RPC methods: X(ID, wire name, who may call it, handler). Every
 * handler takes (c, call, m). Who: HOST (agents; the cluster token),
 * WORKER (training processes; their job's credential is enough), ADMIN
 * (users; the cluster token, or without one the coordinator's own uid).
 * coord.c dispatches from this table; the metrics name methods by it.
 */
#define COORD_METHODS(X)                                                                           \
    X(AGENT_REGISTER, "AgentService.RegisterHost", HOST, coord_rpc_agent_register)                 \
    X(AGENT_HEARTBEAT, "AgentService.Heartbeat", HOST, coord_rpc_agent_heartbeat)                  \
    X(AGENT_REPORT, "AgentService.Report", HOST, coord_rpc_agent_report)                           \
    X(ADMIN_SUBMIT, "AdminService.SubmitJob", ADMIN, coord_rpc_admin)                              \
    X(ADMIN_STOP, "AdminService.StopJob", ADMIN, coord_rpc_admin)                                  \
    X(ADMIN_GET_JOB, "AdminService.GetJob", ADMIN, coord_rpc_admin)                                \
    X(ADMIN_LIST_JOBS, "AdminService.ListJobs", ADMIN, coord_rpc_admin)                            \
    X(ADMIN_LIST_HOSTS, "AdminService.ListHosts", ADMIN, coord_rpc_admin)                          \
    X(ADMIN_STREAM, "AdminService.StreamOutput", ADMIN, coord_rpc_admin)                           \
    X(WORKER_RENDEZVOUS, "WorkerService.Rendezvous", WORKER, coord_rpc_worker)                     \
    X(WORKER_NEGOTIATE, "WorkerService.Negotiate", WORKER, coord_rpc_worker)                       \
    X(WORKER_PUT_SNAPSHOT, "WorkerService.PutSnapshot", WORKER, coord_rpc_snapshot)                \
    X(WORKER_GET_SNAPSHOT, "WorkerService.GetSnapshot", WORKER, coord_rpc_snapshot)                \
    X(WORKER_REPORT, "WorkerService.Report", WORKER, coord_rpc_report)                             \
    X(WORKER_TIMELINE, "WorkerService.Timeline", WORKER, coord_rpc_timeline)                       \
    X(WORKER_TIMELINE_READ, "WorkerService.TimelineRead", WORKER, coord_rpc_timeline_read)         \
    X(ADMIN_GET_EPOCHS, "AdminService.GetEpochs", ADMIN, coord_rpc_report)                         \
    X(ADMIN_GET_RANKS, "AdminService.GetRanks", ADMIN, coord_rpc_report)                           \
    X(ADMIN_DRAIN, "AdminService.DrainHost", ADMIN, coord_rpc_admin)                               \
    X(ADMIN_STACKS, "AdminService.Stacks", ADMIN, coord_rpc_stacks)                                \
    X(AGENT_STACKS, "AgentService.Stacks", HOST, coord_rpc_stacks)                                 \
    X(UNKNOWN, "unknown", NONE, NULL)

enum coord_method {
#define COORD_METHOD_ENUM(id, name, who, handler) M_##id,
    COORD_METHODS(COORD_METHOD_ENUM)
#undef COORD_METHOD_ENUM
        M_COUNT
};

/* A Prometheus histogram of seconds over the fixed bounds of coord.c
 * (10 ms to 60 s): counts per bucket (the last is +Inf) and the sum. */
#define COORD_HIST_BUCKETS 12
struct coord_hist {
    uint64_t counts[COORD_HIST_BUCKETS + 1];
    double sum;
};
/* coord_snap.c's counters; commit and write times as histograms. */
struct coord_snap_metrics {
    uint64_t commits;         /* snapshots acknowledged */
    uint64_t commit_bytes;    /* their bytes */
    uint64_t commit_failures; /* uploads refused or failed after their first chunk */
    uint64_t gets, get_bytes; /* GetSnapshot chunks served */
    uint64_t uploads_dropped; /* abandoned, superseded or of an ended job */
    uint64_t pruned;          /* deleted by retention */
    struct coord_hist commit; /* first chunk to ack */
    struct coord_hist write;  /* the store transaction */
};

/* coord_report.c's counters (issue 6). */
struct coord_report_metrics {
    uint64_t batches, epochs, step_rows, step_rows_pruned, refused;
    uint64_t worker_dropped_max;
    uint64_t step_flushes, step_rows_lost; /* group commits; rows a failed one lost */
};

#define COORD_DP_REASONS 16

struct coord_metrics {
    uint64_t rpc_requests[M_COUNT];
    uint64_t rpc_errors[M_COUNT];
    uint64_t registrations[4];    /* new, reregister, restart, refused */
    uint64_t heartbeats_rejected; /* unknown or expired session */
    uint64_t leases_expired;
    uint64_t reports_duplicate;
    uint64_t http_requests;
    uint64_t http_errors_4xx;
    uint64_t http_errors_5xx;
    uint64_t http_auth_failed;
    uint64_t http_closed[3]; /* HTTP_CLOSED_*: connections coord_http_guard shut down */
    uint64_t http_conns;     /* HTTP connections at its last look */
    uint64_t store_errors;
    uint64_t output_lines;
    uint64_t stale_generation;   /* fenced requests from older generations */
    uint64_t generations;        /* new generations formed after the first */
    uint64_t resets_by_cause[4]; /* failure, host lost, reset requested, capacity */
    uint64_t exclusions;
    uint64_t resumes;       /* negotiations rebuilt after a restart */
    uint64_t sessions;      /* generations whose ranks joined again after a clean shutdown */
    uint64_t admin_refused; /* admin calls from another user to a coordinator without token */
    uint64_t scope_refused; /* calls beyond its job made with a job's credential */
    /* the state store refused a write and no write succeeded since
     * (coord.c: coord_store_failed, store_probe) */
    bool store_degraded;
    uint64_t store_degraded_since, store_probed; /* mono ms */
    char store_why[256];
    /* data-plane connections the ranks refused, by reason (WorkerReport) */
    struct coord_dp_rejected {
        char reason[24];
        uint64_t count;
    } dp_rejected[COORD_DP_REASONS];
    struct coord_hist negotiation_wait; /* first rank's request to ready, per tensor */
    uint64_t rounds, round_ops;       /* readiness rounds the ranks reported, and ops they agreed */
    uint64_t log_ops;                 /* operations the coordinator's logs answered */
    uint64_t carried_ids;             /* cache ids new elastic generations started with */
    struct coord_hist reset_duration; /* generation closed to the next one joined */
    uint64_t last_store_error_ms;     /* wall clock; the degraded flag */
    struct coord_snap_metrics snap;
    struct coord_report_metrics report; /* issue 6 */
};

/*
 * What the domain modules do when the core's jobs and hosts change. The
 * core (coord_jobs.c, coord_hosts.c) calls these and no domain module by
 * name, so its arrows point down only; coord.c, on top, fills them from
 * the modules (negotiation, elastic, timeline) at start.
 */
struct coord_hooks {
    /* a job ended: its workers learn it (code, why); elastic stops */
    void (*job_ended)(struct coord *c, struct job *j, int code, const char *why);
    /* each job, every tick; terminal: the job has ended */
    void (*job_cron)(struct coord *c, struct job *j, bool terminal, uint64_t now);
    /* the coordinator stops: the job's parked calls are answered */
    void (*job_shutdown)(struct coord *c, struct job *j);
    /* a running job is about to stop or to lose a frozen member (why):
     * its ranks' stacks are taken first (coord_stacks.c) */
    void (*job_stopping)(struct coord *c, struct job *j, const char *why);
    /* the job's domain parts are freed (the job itself is the core's) */
    void (*job_free)(struct job *j);
    /* elastic jobs: see coord_elastic.h */
    int (*elastic_init)(struct job *j, const struct elastic_opts *o, char *err, size_t errlen);
    char *(*elastic_to_json)(const struct job *j);
    void (*elastic_from_json)(struct job *j, const char *text);
    int (*elastic_free_slots)(struct coord *c, struct job *j, struct host *h);
    bool (*host_usable)(struct coord *c, struct job *j, const struct host *h);
    void (*member_gone)(struct coord *c, struct job *j, struct host *h, bool exclude,
                        enum elastic_cause cause, const char *why);
    void (*host_drained)(struct coord *c, struct host *h);
    /* a worker event about wid, which is not a member: true when it is one
     * of the job's hot spares (handled), false to go on as usual */
    bool (*spare_event)(struct coord *c, struct job *j, struct host *h, uint64_t wid, int kind,
                        int pid, int exit_code, int term_signal);
};

struct coord {
    struct coord_config cfg;
    struct tls_files tls;                                       /* cfg.tls copied; off when none */
    char *listen, *http_addr, *db_path, *token, *dashboard_dir; /* owned copies */
    /* without a token: a random secret of this process, from which the
     * jobs' mesh keys are derived (coord_negot.c); empty with a token */
    char mesh_secret[65];
    char *timeline_dir; /* coord_timeline.c's own directory, made on first use */
    char view_key[33];  /* coord_http.c: reads argv, cwd and output (creds_view) */
    char rpc_url[256];
    char http_url[256];
    char instance[17]; /* random per coordinator process */
    uint64_t started_ms;

    struct rpc_server *rpc;
    nng_http_server *http;
    int http_port;         /* bound */
    uint64_t http_guarded; /* mono ms of coord_http_guard's last look */
    pthread_t thread;

    pthread_mutex_t mtx; /* the state lock: see the top of this file */
    pthread_cond_t cond;
    bool stopping;
    bool draining; /* set by the main thread: answer new work at once */
    /* handlers running (coord_post), some with the lock released for a
     * while (coord_read, a snapshot chunk's hash): the drain waits for them */
    int handlers_out;
    /* nng's HTTP server did not stop in time (coord_http_stop): the struct
     * and its lock outlive coord_stop, since a late handler would take it */
    bool http_left;
    /* a view of a kept database (coord_view_open): opened read-only,
     * nothing runs */
    bool read_only;

    struct coord_hooks hooks; /* set by coord_start, then read only */

    /* ---- state: under mtx ---- */
    struct store *store;
    struct host *hosts; /* by order */
    struct job *jobs;   /* by id, ascending */
    struct coord_metrics m;
    uint64_t last_cron;
    struct snap_upload *snap_uploads; /* coord_snap.c: partial uploads */
    struct coord_writer *snap_writer; /* coord_snap.c: snapshot commits (coord_writer.h) */
    struct coord_writer *out_writer;  /* coord_hosts.c: output appends (coord_writer.h) */
    /* REST's big reads (output, events) run on their own read-only
     * connection with the state lock released (coord_core.h, coord_read) */
    struct store *reader;
    pthread_mutex_t reader_mu; /* the reader's: one read at a time */
    int readers_out;           /* reads running without the state lock */
    struct report_job *report_jobs;   /* coord_report.c (issue 6): last steps per rank */
    struct step_pending *steps_pend;  /* coord_report.c: step rows not yet stored */
    size_t steps_npend, steps_cap;
    uint64_t steps_flushed_ms;

    /* host discovery scripts of elastic jobs (coord_elastic.c) */
    pthread_t disc_thread;
    bool disc_running;
};

#endif
