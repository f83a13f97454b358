/*
 * store.h - the coordinator's durable state in one SQLite file.
 *
 * WAL mode, synchronous=FULL (a call that returned 0 survives a process
 * kill and a power cut), busy_timeout, foreign keys on, and a versioned
 * schema migrated forward at open (PRAGMA user_version). The API is narrow
 * and typed: no caller ever sees a sqlite3 handle or writes SQL. A store is
 * used by one thread at a time (the coordinator's main thread).
 *
 * Strings in the records below are owned by the caller on writes; on reads
 * they point into storage that is valid only during the callback.
 * A NULL string is stored as NULL and read back as NULL; the fields
 * documented as required make a write fail with KOLO_EINVAL when NULL.
 * Callbacks return 0 to continue, non-zero to stop (that value is returned).
 *
 * Writes return 0 or a kolo error code (common/errors.h): KOLO_EINVAL for
 * bad arguments, KOLO_ENOTFOUND when an update matches no row or a record
 * names a job or host that is not stored, KOLO_EEXIST when a key is already
 * taken (a generation or output seq stored twice), KOLO_ESTORE for any
 * other SQLite failure; store_last_error() then says what happened.
 */
#ifndef KOLO_STORE_STORE_H
#define KOLO_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_SCHEMA_VERSION 8

struct store;

struct store_host {
    const char *id;   /* stable host id chosen by the agent */
    const char *name; /* name in host lists */
    const char *hostname;
    const char *addr;
    int slots;
    int cpus;
    int gpus;
    const char *gpu_names; /* JSON array text, may be NULL */
    uint64_t mem_bytes;
    const char *state; /* "alive", "lost" */
    uint64_t registered_ms;
    uint64_t last_seen_ms;
    int64_t order;              /* first-registration order; assigned by the store on insert */
    const char *agent_instance; /* random per agent process; tells restarts apart */
};

struct store_job {
    uint64_t id; /* assigned by store_job_insert */
    const char *name;
    const char *state; /* pending, running, succeeded, failed, stopped */
    int np;
    const char *argv_json; /* JSON array of strings */
    const char *env_json;  /* JSON array of "K=V" strings */
    const char *cwd;
    const char *hosts; /* "h:2,h2:2" or "" */
    int exit_code;
    const char *reason;
    uint64_t generation;
    uint32_t start_timeout_ms;
    uint64_t submitted_ms;
    uint64_t started_ms;
    uint64_t ended_ms;
    const char *elastic_json; /* elastic settings and state (coordinator's JSON), NULL: fixed */
    const char *metadata_json; /* JSON array of "key=value" labels, NULL: none; insert only */
};

struct store_rank {
    uint64_t job_id;
    uint64_t generation;
    int rank;
    uint64_t worker_id; /* the process behind the rank (stable across generations) */
    const char *host_id;
    int local_rank, local_size, cross_rank, cross_size;
    const char *state; /* assigned, running, exited, lost */
    int exit_code;
    int term_signal;
    int pid;
};

struct store_event {
    int64_t id; /* assigned on insert */
    uint64_t ts_ms;
    uint64_t job_id;     /* 0: none */
    const char *host_id; /* NULL: none */
    const char *kind;    /* "host.registered", "host.lost", "job.failed", ... */
    const char *message;
};

struct store_output {
    uint64_t job_id;
    uint64_t seq; /* per job, assigned by the caller, increasing */
    int rank;
    int stream; /* 1 stdout, 2 stderr */
    const char *text;
    size_t text_len;
    uint64_t ts_ms;
};

/* store_open opens or creates the database at path and migrates it. A
 * database written by a newer kolo (user_version > STORE_SCHEMA_VERSION) is
 * refused with KOLO_ESTORE. On failure err holds the reason. */
int store_open(struct store **st, const char *path, char *err, size_t errlen);
void store_close(struct store *st);
/* store_open_readonly opens the database at path for reading only: it
 * never writes, creates or migrates the file (a kept run's database, for
 * `kolo dashboard`). A file of another schema version is refused with
 * KOLO_ESTORE, a missing one with KOLO_ENOTFOUND. */
int store_open_readonly(struct store **st, const char *path, char *err, size_t errlen);
/* store_query_only makes st refuse every write (PRAGMA query_only): a
 * connection that only reads, next to the one that writes (WAL lets it
 * read while the other commits). */
int store_query_only(struct store *st);
/* store_last_error returns the last SQLite message (for logs). */
const char *store_last_error(const struct store *st);
/* store_integrity_check runs PRAGMA integrity_check; 0 when "ok". */
int store_integrity_check(struct store *st, char *err, size_t errlen);
/* store_schema_version returns PRAGMA user_version, or -1 on error. */
int store_schema_version(struct store *st);
/* store_cache_bytes: the heap SQLite's page cache and schema hold for
 * this store now (it grows with the database up to the cache's cap). */
long long store_cache_bytes(struct store *st);
/* Group several writes into one durable transaction. Calls nest: only the
 * outermost begin/commit pair is a real transaction, inner levels are
 * savepoints, so an inner rollback undoes only its own writes. */
int store_begin(struct store *st);
int store_commit(struct store *st);
int store_rollback(struct store *st);

/* store_meta_get copies the value into value (NUL-terminated);
 * KOLO_ENOTFOUND if key is unset, KOLO_ETOOBIG if it does not fit. */
int store_meta_get(struct store *st, const char *key, char *value, size_t size);
int store_meta_put(struct store *st, const char *key, const char *value);

/* hosts */
/* store_host_put inserts or updates by id (id and state required). A re-put
 * keeps the host's original order and registered_ms; h->order is ignored. */
int store_host_put(struct store *st, const struct store_host *h); /* upsert by id */
/* store_host_set_state sets state and records ts_ms as last_seen_ms. */
int store_host_set_state(struct store *st, const char *id, const char *state, uint64_t ts_ms);
typedef int (*store_host_fn)(const struct store_host *h, void *arg);
int store_hosts_each(struct store *st, store_host_fn fn, void *arg); /* by order */

/* jobs */
int store_job_insert(struct store *st, struct store_job *job); /* sets job->id */
/* store_job_update writes the mutable fields of job->id: state, np, hosts,
 * exit_code, reason, generation, start_timeout_ms, started_ms, ended_ms,
 * elastic_json.
 * name, argv_json, env_json, cwd and submitted_ms are fixed at insert. */
int store_job_update(struct store *st, const struct store_job *job); /* all mutable fields */
typedef int (*store_job_fn)(const struct store_job *j, void *arg);
int store_jobs_each(struct store *st, store_job_fn fn, void *arg); /* by id */

/* generations and ranks */
int store_generation_add(struct store *st, uint64_t job_id, uint64_t generation, const char *cause,
                         int size, uint64_t ts_ms);
/* How the recovery a generation began with went, in ms (job.recovered):
 * the failure detected -> survivors told -> the generation formed ->
 * state restored -> first step done. */
struct store_recovery {
    uint32_t told_ms, formed_ms, restored_ms, step_ms;
};
int store_generation_recovery(struct store *st, uint64_t job_id, uint64_t generation,
                              const struct store_recovery *rec);
/* store_generations_each gives a job's generations in order: number,
 * cause (what ended the one before), size, when it formed, and its
 * recovery (NULL when it began otherwise). */
typedef int (*store_generation_fn)(uint64_t generation, const char *cause, int size,
                                   uint64_t ts_ms, const struct store_recovery *rec, void *arg);
int store_generations_each(struct store *st, uint64_t job_id, store_generation_fn fn, void *arg);
int store_ranks_put(struct store *st, const struct store_rank *ranks, size_t n);
int store_rank_update(struct store *st, const struct store_rank *r); /* state, exit, signal, pid */
typedef int (*store_rank_fn)(const struct store_rank *r, void *arg);
int store_ranks_each(struct store *st, uint64_t job_id, uint64_t generation, store_rank_fn fn,
                     void *arg);

/* events */
int store_event_add(struct store *st, struct store_event *ev); /* sets ev->id */
typedef int (*store_event_fn)(const struct store_event *ev, void *arg);
/* job_id 0 = all jobs. after_id >= 0: events with id > after_id, ascending,
 * at most limit (limit <= 0: no limit). after_id < 0 and limit > 0: the
 * newest `limit` events, still delivered in ascending id order. */
/* store_events_tail_except: the newest `limit` events of job_id whose kind
 * is not `except` (a job's starts, resets and failures among thousands of
 * commits), in ascending id order. */
int store_events_tail_except(struct store *st, uint64_t job_id, const char *except, int limit,
                             store_event_fn fn, void *arg);
int store_events_each(struct store *st, uint64_t job_id, int64_t after_id, int limit,
                      store_event_fn fn, void *arg);

/* worker output */
/* store_output_append stores n lines in one transaction (all or none). */
int store_output_append(struct store *st, const struct store_output *lines, size_t n);
typedef int (*store_output_fn)(const struct store_output *o, void *arg);
/* store_output_each gives a job's lines with seq > after_seq in seq order,
 * at most limit (<= 0: all). o->text holds text_len bytes, which may
 * include NUL; a NUL also follows them, at text[text_len]. */
int store_output_each(struct store *st, uint64_t job_id, uint64_t after_seq, int limit,
                      store_output_fn fn, void *arg);
/* store_output_rank_tail: one rank's last lines of one stream (1 stdout,
 * 2 stderr), newest first, at most limit. */
int store_output_rank_tail(struct store *st, uint64_t job_id, int rank, int stream, int limit,
                           store_output_fn fn, void *arg);
/* store_output_max_seq sets *seq to the job's highest seq, 0 if none. */
int store_output_max_seq(struct store *st, uint64_t job_id, uint64_t *seq);

/* stacks taken of a job's ranks (a packed StacksReply, opaque here) */
struct store_stacks {
    int64_t id; /* assigned on insert */
    uint64_t job_id;
    uint64_t taken_ms;
    const char *reason;  /* why they were taken: "stop: ...", "stall", ... */
    const char *verdict; /* the line kolo run printed, "" none */
    const void *reply;
    size_t reply_len;
};
/* store_stacks_add stores s and deletes all but the job's newest `keep`
 * (>= 1), in one transaction. */
int store_stacks_add(struct store *st, struct store_stacks *s, int keep);
typedef int (*store_stacks_fn)(const struct store_stacks *s, void *arg);
/* store_stacks_each gives a job's stacks newest first, at most limit
 * (<= 0: all). */
int store_stacks_each(struct store *st, uint64_t job_id, int limit, store_stacks_fn fn, void *arg);

/* ---------------------------------------------------------- snapshots
 *
 * Elastic-state snapshots: an opaque blob stored as numbered chunks, with
 * its metadata. Ids come from one sequence for every job and are never
 * handed out twice. store_snapshot_put writes the record and every chunk
 * in one transaction (nested in the caller's, if one is open): a snapshot
 * is there whole or not at all.
 */
struct store_snapshot {
    uint64_t id; /* assigned by store_snapshot_put */
    uint64_t job_id;
    uint64_t generation;
    int rank;
    uint64_t upload_id; /* the client's id for the upload; unique per job */
    uint64_t created_ms;
    const char *meta_json; /* required: a JSON object as text */
    uint64_t total_bytes;
    const char *checksum; /* required: hex SHA-256 of the whole blob */
    uint32_t nchunks;
    uint64_t duration_ms; /* first chunk received to commit; 0 if unknown */
};

struct store_blob {
    const void *data;
    size_t len;
};

/* store_snapshot_put stores s and its n chunks (n == s->nchunks, in
 * order, lengths adding up to s->total_bytes) and sets s->id. KOLO_EEXIST
 * if the job already has a snapshot from that upload_id, KOLO_ENOTFOUND
 * if the job is not stored. */
int store_snapshot_put(struct store *st, struct store_snapshot *s, const struct store_blob *chunks,
                       size_t n);
typedef int (*store_snapshot_fn)(const struct store_snapshot *s, void *arg);
/* These call fn once with the record, or return KOLO_ENOTFOUND: the job's
 * newest snapshot; snapshot id of the job; the job's snapshot stored from
 * upload_id. */
int store_snapshot_latest(struct store *st, uint64_t job_id, store_snapshot_fn fn, void *arg);
int store_snapshot_get(struct store *st, uint64_t job_id, uint64_t id, store_snapshot_fn fn,
                       void *arg);
int store_snapshot_by_upload(struct store *st, uint64_t job_id, uint64_t upload_id,
                             store_snapshot_fn fn, void *arg);
/* store_snapshots_each gives a job's snapshots newest first, at most limit
 * (<= 0: all). */
int store_snapshots_each(struct store *st, uint64_t job_id, int limit, store_snapshot_fn fn,
                         void *arg);
typedef int (*store_blob_fn)(const void *data, size_t len, void *arg);
/* store_snapshot_chunk calls fn with chunk `index` of the job's snapshot
 * id (data valid during the call), or returns KOLO_ENOTFOUND. */
int store_snapshot_chunk(struct store *st, uint64_t job_id, uint64_t id, uint32_t index,
                         store_blob_fn fn, void *arg);
/* store_snapshot_set_duration replaces the duration_ms of the job's
 * snapshot id (the coordinator knows the whole commit's duration only
 * after its transaction), or returns KOLO_ENOTFOUND. */
int store_snapshot_set_duration(struct store *st, uint64_t job_id, uint64_t id,
                                uint64_t duration_ms);
/* store_snapshot_prune deletes all but the newest `keep` (>= 1) snapshots
 * of the job, chunks included; *deleted (may be NULL) gets how many. */
int store_snapshot_prune(struct store *st, uint64_t job_id, int keep, int *deleted);

/* ---- reports (issue 6): begin ----
 *
 * Training progress reported by the workers (schema version 4). Times are
 * wall-clock ms; 0 means unknown.
 */
struct store_epoch {
    uint64_t job_id;
    uint64_t generation;
    int rank;
    int64_t epoch; /* >= 0 */
    uint64_t start_ms;
    uint64_t end_ms;          /* 0: not ended yet */
    int64_t samples;          /* >= 0 */
    const char *metrics_json; /* a JSON object as text, or NULL */
};

/* store_epoch_report records one boundary of (job, generation, rank,
 * epoch). phase 0 (start) sets start_ms; phase 1 (end) sets end_ms,
 * samples and metrics_json, and start_ms only when none was recorded.
 * KOLO_ENOTFOUND if the job is not stored. */
int store_epoch_report(struct store *st, const struct store_epoch *e, int phase);
typedef int (*store_epoch_fn)(const struct store_epoch *e, void *arg);
/* store_epochs_each gives a job's rows by epoch, generation, rank. */
int store_epochs_each(struct store *st, uint64_t job_id, store_epoch_fn fn, void *arg);

/* One downsampled step-time row: the mean of n steps of a rank in the
 * wall-clock second starting at ts_ms. */
struct store_step {
    uint64_t job_id;
    int rank;
    const char *host_id; /* may be NULL */
    uint64_t ts_ms;
    double seconds; /* >= 0 */
    uint32_t n;     /* >= 1 */
};

/* store_steps_add merges n rows in one transaction: a row whose (job,
 * rank, ts_ms) exists already becomes the weighted mean of both. */
int store_steps_add(struct store *st, const struct store_step *steps, size_t n);
typedef int (*store_step_fn)(const struct store_step *s, void *arg);
/* store_steps_each gives a job's rows with ts_ms >= since_ms by ts_ms, rank. */
int store_steps_each(struct store *st, uint64_t job_id, uint64_t since_ms, store_step_fn fn,
                     void *arg);
/* store_steps_prune deletes the job's rows older than the keep-th newest
 * (keep >= 1; rows of the same second as that one stay); *deleted (may be
 * NULL) counts them. */
int store_steps_prune(struct store *st, uint64_t job_id, int keep, int *deleted);
/* ---- reports (issue 6): end ---- */

#endif
