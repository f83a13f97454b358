/*
 * coord_internal.h - the coordinator's in-memory state, shared by its files.
 *
 * Threading: everything in struct coord below the "state" line belongs to
 * whoever holds c->mtx, and only coord_post (one RPC or HTTP request, on
 * the nng thread that received it) and the tick thread (coord_cron:
 * leases, parked-call deadlines, pending jobs) take it. So handlers run
 * one at a time, as in redis's single-owner model, but without handing
 * each request to another thread: negotiation latency is a goal. A
 * handler answers at once or parks the call (heartbeats, output streams,
 * rendezvous, negotiation) until something changes or its deadline
 * passes. Handlers never block: no network waits, only SQLite writes.
 */
#ifndef KOLO_COORDINATOR_COORD_INTERNAL_H
#define KOLO_COORDINATOR_COORD_INTERNAL_H

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

#define COORD_CRON_MS 100
#define COORD_MAX_NP  65536

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
    int64_t order;
    uint64_t registered_ms;  /* wall clock, first registration */
    uint64_t last_seen_ms;   /* wall clock */
    uint64_t lease_deadline; /* monotonic */
    uint64_t last_seen_mono;
    char session[40]; /* empty when no live session */
    char agent_instance[64];
    char superseded_instance[64]; /* instance replaced by a newer one */
    uint64_t superseded_mono;
    uint64_t last_batch_seq;
    uint64_t desired_counter; /* bumped when the host's worker set changes */
    struct rpc_call *parked_hb;
    uint64_t parked_deadline; /* monotonic */
};

struct rank {
    int rank;
    struct host *host; /* NULL if the host is unknown (after reload) */
    char host_id[64];
    int local_rank, local_size, cross_rank, cross_size;
    enum rank_state state;
    int exit_code;
    int term_signal;
    int pid;
};

struct waiter {
    struct waiter *next;
    struct rpc_call *call;
    uint64_t after_seq;
    uint32_t max_lines;
    uint64_t deadline; /* monotonic */
};

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
    int exit_code;
    char *reason; /* why it is pending, or why it ended */
    uint64_t generation;
    uint32_t start_timeout_ms;
    uint64_t submitted_ms, started_ms, ended_ms;
    uint64_t pending_deadline; /* monotonic, 0 = none */
    struct rank *ranks;
    int nranks;
    uint64_t out_seq;       /* last output sequence number assigned */
    struct waiter *waiters; /* parked StreamOutput calls */
    struct negot *negot;    /* rendezvous and negotiation of the generation */
};

enum work_kind { WORK_RPC, WORK_HTTP };

struct work {
    struct work *next;
    enum work_kind kind;
    struct rpc_call *call;
    nng_aio *aio;
};

/* RPC methods, for dispatch and per-method metrics. */
#define COORD_METHODS(X)                                                                           \
    X(AGENT_REGISTER, "AgentService.RegisterHost")                                                 \
    X(AGENT_HEARTBEAT, "AgentService.Heartbeat")                                                   \
    X(AGENT_REPORT, "AgentService.Report")                                                         \
    X(ADMIN_SUBMIT, "AdminService.SubmitJob")                                                      \
    X(ADMIN_STOP, "AdminService.StopJob")                                                          \
    X(ADMIN_GET_JOB, "AdminService.GetJob")                                                        \
    X(ADMIN_LIST_JOBS, "AdminService.ListJobs")                                                    \
    X(ADMIN_LIST_HOSTS, "AdminService.ListHosts")                                                  \
    X(ADMIN_STREAM, "AdminService.StreamOutput")                                                   \
    X(WORKER_RENDEZVOUS, "WorkerService.Rendezvous")                                               \
    X(WORKER_NEGOTIATE, "WorkerService.Negotiate")                                                 \
    X(UNKNOWN, "unknown")

enum coord_method {
#define COORD_METHOD_ENUM(id, name) M_##id,
    COORD_METHODS(COORD_METHOD_ENUM)
#undef COORD_METHOD_ENUM
        M_COUNT
};

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
    uint64_t store_errors;
    uint64_t output_lines;
    uint64_t stale_generation; /* fenced requests from older generations */
};

struct coord {
    struct coord_config cfg;
    char *listen, *http_addr, *db_path, *token, *dashboard_dir; /* owned copies */
    char rpc_url[256];
    char http_url[256];
    char instance[17]; /* random per coordinator process */
    uint64_t started_ms;

    struct rpc_server *rpc;
    nng_http_server *http;
    pthread_t thread;

    pthread_mutex_t mtx; /* the state lock: see the top of this file */
    pthread_cond_t cond;
    bool stopping;
    bool draining; /* set by the main thread: answer new work at once */

    /* ---- state: under mtx ---- */
    struct store *store;
    struct host *hosts; /* by order */
    struct job *jobs;   /* by id, ascending */
    struct coord_metrics m;
    uint64_t last_cron;
};

/* coord.c */
int coord_send_pb(struct rpc_call *call, const ProtobufCMessage *msg);
void coord_post(struct coord *c, struct work *w);
void coord_event(struct coord *c, uint64_t job_id, const char *host_id, const char *kind,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void coord_store_failed(struct coord *c, const char *what);

/* coord_hosts.c */
struct host *coord_host_find(struct coord *c, const char *id);
struct host *coord_host_by_session(struct coord *c, const char *session);
int coord_host_slots_used(struct coord *c, const struct host *h);
void coord_hosts_cron(struct coord *c, uint64_t now);
void coord_host_persist(struct coord *c, struct host *h);
void coord_host_wake(struct coord *c, struct host *h);
void coord_rpc_agent_register(struct coord *c, struct rpc_call *call);
void coord_rpc_agent_heartbeat(struct coord *c, struct rpc_call *call);
void coord_rpc_agent_report(struct coord *c, struct rpc_call *call);
void coord_hosts_shutdown(struct coord *c);
void coord_hosts_free(struct coord *c);

/* coord_jobs.c */
struct job *coord_job_find(struct coord *c, uint64_t id);
const char *coord_job_state_name(enum job_state s);
const char *coord_rank_state_name(enum rank_state s);
int coord_job_submit(struct coord *c, char **argv, int argc, char **env, int nenv, const char *cwd,
                     int np, const char *hosts, const char *name, uint32_t start_timeout_ms,
                     uint64_t *job_id, char *err, size_t errlen);
int coord_job_stop(struct coord *c, struct job *j, const char *reason);
int coord_job_ranks_alive(const struct job *j);
void coord_jobs_place_pending(struct coord *c);
void coord_jobs_cron(struct coord *c, uint64_t now);
void coord_jobs_host_lost(struct coord *c, struct host *h, const char *why);
void coord_job_worker_event(struct coord *c, struct host *h, uint64_t job_id, uint64_t gen,
                            int rank, int kind, int pid, int exit_code, int term_signal,
                            const char *message);
void coord_job_output_added(struct coord *c, struct job *j);
int coord_job_desired_for_host(struct coord *c, struct host *h, void ***specs, size_t *n);
void coord_job_desired_free(void **specs, size_t n);
void coord_rpc_admin(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_jobs_shutdown(struct coord *c);
void coord_jobs_free(struct coord *c);
int coord_jobs_load(struct coord *c);

/* coord_negot.c */
struct negot;
void coord_rpc_worker(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_negot_job_ended(struct coord *c, struct job *j, int code, const char *why);
void coord_negot_cron(struct coord *c, struct job *j, uint64_t now);
void coord_negot_drop_parked(struct coord *c, struct job *j);
void coord_negot_free(struct negot *n);
struct jw;
void coord_negot_render_stalls(struct job *j, struct jw *w, uint64_t min_age_ms);

/* coord_http.c */
int coord_http_start(struct coord *c, char *err, size_t errlen);
void coord_http_handle(struct coord *c, nng_aio *aio);
void coord_http_stop(struct coord *c);

#endif
