/*
 * run.h - the pieces of `kolo run` around its main loop: the flag table
 * (kolo's own and horovodrun's), the job environment the flags produce,
 * --check-build, and the per-rank files of --output-filename.
 */
#ifndef KOLO_CLI_RUN_H
#define KOLO_CLI_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "knobs.h"

struct rpc_client;
struct run_output;

/* Room for every knob of kolo run's table. */
#define RUN_MAX_KNOBS 80

struct run_opts {
    int64_t np;
    char *hosts, *hostfile, *coordinator, *token_file, *name, *http, *state_dir, *log_level;
    char *output_filename, *config_file, *timeline_filename, *cycle_time_ms, *metadata;
    char *tls_cert, *tls_key, *tls_ca, *tls_dir; /* common/tls.h */
    int64_t start_timeout, slots, grace;
    int64_t fusion_threshold_mb, cache_capacity, stall_warning_s, stall_shutdown_s;
    bool verbose, quiet, stall_check, version, check_build, encrypt_data, detach;
    bool raw; /* --raw: output bytes untouched on a terminal too (job_lines.c) */
    bool slurm; /* --slurm; see run_slurm.c (on by itself inside an allocation) */
    /* elastic (horovodrun's names); any of min/max-np or a discovery script
     * makes the job elastic */
    int64_t min_np, max_np, reset_limit, elastic_timeout;
    char *discovery, *cooldown_range;
    char *straggler_policy;
    int64_t spares;
    int64_t straggler_window;
    uint32_t cooldown_lo_s, cooldown_hi_s; /* parsed from cooldown_range */
    bool elastic;
};

/* run_flags_table fills tab (RUN_MAX_KNOBS entries) with kolo run's knobs,
 * which write into o, and returns how many there are. */
size_t run_flags_table(struct knob *tab, struct run_opts *o);

/*
 * run_flags_finish checks what the knob types cannot (the log level, the
 * cycle time, -H together with --hostfile), turns --hostfile into
 * o->hosts, and prints one line to stderr for every ignored horovodrun
 * flag that was given. 0, or KOLO_EINVAL (a usage error) with err set.
 */
int run_flags_finish(struct knob *tab, size_t n, struct run_opts *o, char *err, size_t errlen);

/* run_flags_log_level is the level kolo run itself logs at. */
int run_flags_log_level(const struct run_opts *o);

/*
 * run_job_env returns the "NAME=value" variables the flags set in the
 * job's environment (HOROVOD_FUSION_THRESHOLD, ...), NULL-terminated, or
 * NULL when out of memory. They override what the job inherits. Free with
 * run_job_env_free.
 */
char **run_job_env(struct knob *tab, size_t n, const struct run_opts *o);
/*
 * run_follow prints the job's output as kolo run does ([rank]<stream>:),
 * its epoch lines and why it is pending, until it ends; returns its exit
 * code (1 when it could not be followed). A SIGINT/SIGTERM that kolo run
 * caught stops the job, waiting up to grace + 10 s; files: NULL, or
 * --output-filename's files (always the raw bytes). On a terminal the
 * output's control bytes are escaped unless raw (job_lines.c).
 */
/* run_timeline_final writes the job's finished timeline at path (its
 * HOROVOD_TIMELINE) once the job is over: for jobs of an embedded
 * coordinator, whose ranks ran on this host (run_timeline.c). */
void run_timeline_final(struct rpc_client *cli, uint64_t job_id, const char *path);

/* quiet: no [kolo] line for elastic events (run_quiet_kind) */
int run_follow(struct rpc_client *cli, uint64_t job_id, int64_t grace, struct run_output *files,
               bool raw, bool quiet);

/* ---- run_slurm.c: kolo run inside a Slurm allocation ---- */

struct slurm_alloc {
    char job_id[32];
    int nnodes;
    char **nodes; /* host names, in the allocation's order */
    int *tasks;   /* tasks per node */
    int tasks_max, cpus_min;
    pid_t *srun; /* the agents' srun, one per node (slurm_agents_start) */
};
/* true when SLURM_JOB_ID and SLURM_JOB_NODELIST are set (inline: the
 * flag parser, which the fuzzer builds alone, asks it) */
static inline bool slurm_in_allocation(void)
{
    const char *id = getenv("SLURM_JOB_ID"), *nodes = getenv("SLURM_JOB_NODELIST");
    return id && id[0] && nodes && nodes[0];
}
/* Reads the allocation (0), KOLO_ENOTFOUND outside one, or an error with
 * the reason in err. */
int slurm_detect(struct slurm_alloc *a, char *err, size_t errlen);
void slurm_alloc_free(struct slurm_alloc *a);
/* "tcp://ADDR:0" for the coordinator: this host's first non-loopback IPv4
 * address (what the nodes reach), else loopback */
void slurm_listen_url(char *out, size_t n);
/* "node:tasks,..." for -H (malloc'd), NULL when out of memory */
char *slurm_hosts(const struct slurm_alloc *a);
/* Starts one agent per node, each its own srun step (a->srun). */
int slurm_agents_start(struct slurm_alloc *a, const char *url, const char *token_file,
                       int64_t stop_grace_ms, const char *log_level, char *err, size_t errlen);
/* Waits until every node's agent is alive on the coordinator. */
int slurm_agents_wait(struct rpc_client *cli, struct slurm_alloc *a, int64_t timeout_ms, char *err,
                      size_t errlen);
/* Ends the steps: SIGTERM to the agents (scancel --signal), each srun
 * killed after wait_ms. */
void slurm_agents_stop(struct slurm_alloc *a, int64_t wait_ms);
void run_job_env_free(char **env);

/* run_print_check_build prints what this kolo was built with, in the
 * shape of `horovodrun --check-build`. */
void run_print_check_build(FILE *out);

/*
 * Per-rank output files, as horovodrun writes them with Gloo:
 * DIR/rank.<N>/stdout and DIR/rank.<N>/stderr, N zero-padded to the width
 * of np - 1 so the directories sort in rank order.
 */
struct run_output;

/* run_output_open creates every rank's directory and empty files. 0, or
 * an error with a message in err. */
int run_output_open(struct run_output **out, const char *dir, int np, char *err, size_t errlen);

/* run_output_write appends one line (without its newline) to the rank's
 * file; ranks outside [0, np) are dropped. The first failure is reported
 * once on stderr and writing goes on for the other files. */
void run_output_write(struct run_output *o, int rank, bool err_stream, const void *data,
                      size_t len);

/* run_output_close flushes and closes every file; NULL is fine. */
void run_output_close(struct run_output *o);

#endif
