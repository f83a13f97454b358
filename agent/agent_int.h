/*
 * agent_int.h - the agent's internal structures, shared by its files:
 *
 *   agent.c      lifecycle, host id, the loop thread and its mailbox
 *   supervise.c  worker processes: spawn, output, exit, stop, reconcile
 *   lines.c      splitting a byte stream into output lines
 *   outbox.c     the outbound queue of events and lines
 *   link.c       the coordinator link: Register/Heartbeat and Report threads
 *   inventory.c  what this host has (CPUs, GPUs, memory, address)
 *   agent_cmd.c  `kolo agent`
 *   exec_shim.c  `kolo __exec`
 *   job_user.c   running workers as --job-user
 *
 * Locking. One mutex, agent.mu, guards everything more than one thread
 * touches: the mailbox to the loop, the snapshot of running workers, the
 * session, the outbound queue and the counters. Every critical section is
 * short and none makes a call that blocks. agent.cond is broadcast when
 * the session changes or on stop, and signalled when the queue has work.
 */
#ifndef KOLO_AGENT_AGENT_INT_H
#define KOLO_AGENT_AGENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "agent.h"
#include "kolo.pb-c.h"
#include "tls.h"

/* A line longer than this is cut into pieces of this size. */
#define AGENT_LINE_MAX (64 * 1024)
/* Output bytes the outbound queue holds before it drops the oldest lines. */
#define AGENT_OUTBOX_CAP ((size_t)64 << 20)
/* One Report carries at most this many lines and bytes... */
#define AGENT_BATCH_LINES 1000
#define AGENT_BATCH_BYTES ((size_t)256 << 10)
/* ...and is sent at most this often unless a full batch is waiting. */
#define AGENT_REPORT_PACE_MS 50
/* A worker's exit is reported at most this long after it happened even if
 * something still holds its output pipes open. */
#define AGENT_EXIT_FLUSH_MS    1000
#define AGENT_DEFAULT_GRACE_MS 5000

/* ---------------------------------------------------------------- lines.c */

typedef void (*line_emit_fn)(void *arg, const char *line, size_t len);

/* A line splitter owns a buffer the reader writes into directly (no copy),
 * and emits every complete line without its "\n" or "\r\n". */
struct line_splitter {
    char *buf;
    size_t used;
    size_t cap;
    bool skip_lf; /* a forced cut just happened: a "\n" right after it ends that line */
    line_emit_fn emit;
    void *arg;
};

int line_splitter_init(struct line_splitter *ls, size_t max_line, line_emit_fn emit, void *arg);
void line_splitter_free(struct line_splitter *ls);
/* line_splitter_space returns the free space the next read may fill. */
void line_splitter_space(struct line_splitter *ls, char **p, size_t *n);
/* line_splitter_commit takes n bytes written into that space. */
void line_splitter_commit(struct line_splitter *ls, size_t n);
/* line_splitter_feed copies data in and commits it (tests, small inputs). */
void line_splitter_feed(struct line_splitter *ls, const char *data, size_t len);
/* line_splitter_finish emits a last line that had no newline. */
void line_splitter_finish(struct line_splitter *ls);

/* ---------------------------------------------------------------- outbox.c */

struct outbox_item {
    struct outbox_item *next;
    bool is_event;
    size_t cost; /* bytes this item counts against the batch and queue caps */
    union {
        Kolo__WorkerEvent ev;
        Kolo__OutputLine line;
    } u;
    char data[]; /* the event's message or the line's text */
};

/* A batch: items taken off the queue, in order, that go out in one Report.
 * All its lines precede all its events in time (see outbox_take). */
struct outbox_batch {
    struct outbox_item *head, *tail;
    size_t n_events, n_lines;
    uint64_t seq; /* ReportRequest.batch_seq, kept across resends */
};

/* The queue. Not locked by itself: callers hold agent.mu. */
struct outbox {
    struct outbox_item *head, *tail;
    size_t n_lines;
    size_t line_bytes;
    size_t cap;
    uint64_t dropped;
    uint64_t batch_seq; /* the last one handed out */
    bool dropping;      /* over the cap since the last drain; logs once per episode */
};

void outbox_init(struct outbox *o, size_t cap);
void outbox_free(struct outbox *o);
bool outbox_empty(const struct outbox *o);
/* outbox_full_batch: enough waits to fill a batch, so pacing can be skipped. */
bool outbox_full_batch(const struct outbox *o);
/* The push functions return true when the reporter should be woken (the
 * queue was empty or now holds a full batch); false also on ENOMEM. */
bool outbox_push_event(struct outbox *o, const Kolo__WorkerEvent *ev);
bool outbox_push_line(struct outbox *o, uint64_t job_id, int32_t rank, uint64_t worker_id, int stream, const char *text,
                      size_t len, uint64_t ts_ms);
/* outbox_take moves the next batch off the queue into b (which is empty). */
void outbox_take(struct outbox *o, struct outbox_batch *b);
void outbox_batch_free(struct outbox_batch *b);
/* outbox_batch_pack builds the ReportRequest for b; *data is malloc'd. */
int outbox_batch_pack(const struct outbox_batch *b, const char *session, uint8_t **data,
                      size_t *len);

/* ---------------------------------------------------------------- inventory.c */

struct inventory {
    int cpus;
    int gpus;
    char **gpu_names;
    size_t n_gpu_names;
    uint64_t mem_bytes;
};

void inventory_probe(struct inventory *inv);
void inventory_free(struct inventory *inv);
/* host_default_addr writes this host's first non-loopback IPv4 address, or
 * "127.0.0.1" when it has none. */
void host_default_addr(const char *hostname, char *out, size_t n);

/* ---------------------------------------------------------------- agent */

struct worker;

struct agent {
    /* Configuration: owned copies, read-only once the threads run. */
    char *url;
    char *token;
    struct tls_files tls; /* off when the coordinator speaks plain TCP */
    char *name;
    char *addr;
    char *state_dir;
    char *exec_path;
    char hostname[256];
    char host_id[64];
    char instance[17]; /* random per agent process (RegisterRequest.agent_instance) */
    int slots;
    int64_t stop_grace_ms;
    char *job_user; /* the shim becomes this user (--user); NULL: no switch */
    struct inventory inv;
    int pid;

    pthread_mutex_t mu;
    pthread_cond_t cond;

    /* Loop thread only. */
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t stop_timer; /* bounds the shutdown when a worker will not die */
    pthread_t loop_thread;
    struct worker *workers;
    bool shutting_down;
    int64_t grace_ms; /* current stop grace: the config's, or the coordinator's */

    /* Under mu. */
    bool loop_alive; /* wake may be sent to */
    Kolo__HeartbeatReply *mail_desired;
    bool mail_stop;
    Kolo__RunningWorker *running; /* snapshot of live workers, for Register */
    size_t n_running, cap_running;
    uint64_t *stopped_since; /* [cap_running], running[i] seen stopped since (mono ms), 0 not */
    int *stacks_fd;          /* [cap_running], running[i]'s stacks file (stacks.c), -1 none */
    uint64_t stacks_seen;    /* HeartbeatReply.stacks_seq last answered */
    struct outbox outbox;
    struct agent_stats stats;
    char session[128];    /* "" until registered */
    uint64_t session_gen; /* bumped by every registration */
    bool link_stopping;
    uint64_t flush_deadline; /* mono ms: the reporter's last chance to flush */

    /* Link threads. */
    struct rpc_client *rpc;    /* reports */
    struct rpc_client *hb_rpc; /* registration and heartbeats (link thread) */
    pthread_t link_thread, report_thread;
    bool link_running, report_running;
};

/* A worker as the coordinator named it: (job_id, worker_id) is the key;
 * generation and rank are the ones it was started with (an elastic job
 * re-ranks running workers without telling the agent). worker_id 0 comes
 * from a coordinator that predates elastic jobs: then (job_id,
 * generation, rank) is the key. */
struct worker_key {
    uint64_t job_id, generation, worker_id;
    int32_t rank;
};

bool worker_key_eq(const struct worker_key *a, const struct worker_key *b);

/* agent.c */
/* agent_running_add takes stacks_fd (the worker's stacks file, -1 none):
 * agent_running_remove closes it. */
void agent_running_add(struct agent *a, const struct worker_key *k, int32_t pid, int stacks_fd);
void agent_running_remove(struct agent *a, const struct worker_key *k);
/* agent_running_stopped: the live workers stopped by a signal (state T in
 * /proc/PID/stat), each with how long the agent has seen it so, in a
 * block the caller frees; *n 0 (NULL) when none is. Reads /proc: the
 * link thread calls it before each heartbeat. */
Kolo__RunningWorker *agent_running_stopped(struct agent *a, size_t *n);
/* agent_proc_state: the /proc state letter of a worker's command (the
 * first child of its shim, whose pid *pid_out gets), 0 unreadable. */
char agent_proc_state(int shim, int *pid_out);

/* stacks.c: `kolo stacks`. stacks_file makes a worker's stacks file (an
 * anonymous file in append mode, -1 when it cannot): the worker inherits
 * it as KOLO_STACKS_FD (STACKS_CHILD_FD) and its Python writes every
 * thread's stack there on STACKS_SIGNAL (kolo/_stacks.py).
 * stacks_collect, on the link thread, signals the job's workers, waits
 * for what they write (at most STACKS_WAIT_MS) and sends it with the
 * process states (AgentService.Stacks). */
#define STACKS_CHILD_FD 3
#define STACKS_WAIT_MS  2000
int stacks_file(void);
int stacks_signal(void);
/* wait_ms: at most this long for what the workers write (the caller keeps
 * it well under its lease: this thread sends the heartbeats) */
void stacks_collect(struct agent *a, const char *session, uint64_t job_id, uint64_t seq,
                    uint32_t wait_ms);
/* agent_post_desired hands a HeartbeatReply to the loop (takes ownership). */
void agent_post_desired(struct agent *a, Kolo__HeartbeatReply *rep);
/* Loop thread: a worker's last handle closed; the shutdown may be done. */
void agent_loop_check_done(struct agent *a);
/* Queue an event / a line for the reporter (any thread). */
void agent_queue_event(struct agent *a, const Kolo__WorkerEvent *ev);
void agent_queue_line(struct agent *a, const struct worker_key *k, int stream, const char *text,
                      size_t len);

/* supervise.c (loop thread) */
void supervise_reconcile(struct agent *a, const Kolo__HeartbeatReply *rep);
void supervise_stop_all(struct agent *a);
void supervise_force_close(struct agent *a);
bool supervise_idle(const struct agent *a);

/* link.c */
int link_start(struct agent *a, char *err, size_t errlen);

/* job_user_resolve looks name up and checks that this process can run
 * workers as that user (root, or CAP_SETUID, CAP_SETGID and CAP_KILL);
 * root is refused. 0, or -1 with the reason in err. */
int job_user_resolve(const char *name, uid_t *uid, gid_t *gid, char *err, size_t errlen);
/* job_user_become makes this process name (its uid, gid and groups) and
 * drops every capability; for the exec shim, before anything else. 0, or
 * -1 with the reason in err. */
int job_user_become(const char *name, char *err, size_t errlen);
void link_stop(struct agent *a);

#endif
