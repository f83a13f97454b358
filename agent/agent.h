/*
 * agent.h - the host agent (`kolo agent`): registers this host with the
 * coordinator, keeps its lease with long-polling heartbeats, and runs the
 * set of worker processes the coordinator wants on this host, reporting
 * their lifecycle events and output lines back.
 *
 * Threads. agent_start returns after starting three threads: the libuv
 * loop (owns every worker process and pipe), the link (Register, then
 * Heartbeat in a loop) and the reporter (batched Report calls from an
 * outbound queue). The link hands desired sets to the loop through a
 * mailbox and uv_async_send; the loop hands events and lines to the
 * reporter through the queue. Nothing that blocks runs on the loop.
 */
#ifndef KOLO_AGENT_AGENT_H
#define KOLO_AGENT_AGENT_H

#include <stddef.h>
#include <stdint.h>

struct agent;

struct tls_files; /* common/tls.h */

struct agent_config {
    const char *coordinator_url; /* "tcp://host:port" (or inproc:// in tests) */
    const char *token;           /* cluster token; NULL = none */
    const char *name;            /* name in host lists; NULL = hostname */
    const char *addr;            /* address other hosts reach this one at; NULL = detect */
    const char *state_dir;       /* holds the host-id file; NULL = XDG state dir */
    int slots;                   /* 0 = number of GPUs if any, else number of CPUs */
    int64_t stop_grace_ms;       /* SIGTERM -> SIGKILL delay; 0 = 5000 */
    const char *exec_path;       /* the kolo binary, run as `exec_path __exec -- argv...` */
    const struct tls_files *tls; /* NULL or off: plain tcp:// (common/tls.h) */
    const char *job_user;        /* run workers as this user (job_user.c); NULL = the agent's */
};

/* Counters for tests and `--log-level debug` diagnostics. */
struct agent_stats {
    uint64_t registrations; /* successful Register calls */
    uint64_t reports;       /* Report calls the coordinator accepted */
    uint64_t dropped_lines; /* output lines dropped because the queue was over its cap */
    int workers_alive;      /* worker processes that have not exited */
};

/*
 * agent_start validates cfg, loads or creates the host id, probes the
 * inventory, opens the RPC client and starts the agent's threads. It does
 * not wait for the coordinator: an unreachable coordinator is retried in
 * the background. On failure returns a kolo error code with a message in
 * err and starts nothing.
 */
int agent_start(struct agent **out, const struct agent_config *cfg, char *err, size_t errlen);

/*
 * agent_stop stops every worker (SIGTERM to its process group, SIGKILL
 * after the grace), waits for their exits (bounded), sends a last Report
 * if the coordinator answers within 2 s, stops the threads, closes every
 * libuv handle and frees the agent. NULL is a no-op.
 */
void agent_stop(struct agent *a);

/* agent_host_id copies the host id (32 hex digits unless the host-id file
 * was written by hand) into out; 0, or KOLO_EINVAL when n is too small. */
int agent_host_id(const struct agent *a, char *out, size_t n);

/*
 * agent_drain_self asks the coordinator to drain this host because the
 * agent is shutting down (a spot notice, systemd stop): no new work, and
 * elastic jobs leave at their next commit, which stops the workers here;
 * the host is undrained when an agent registers for it again. 0, or the
 * error with the reason in err (the coordinator unreachable or refusing
 * within timeout_ms).
 */
int agent_drain_self(struct agent *a, int timeout_ms, char *err, size_t errlen);

/* agent_get_stats fills st with a consistent snapshot of the counters. */
void agent_get_stats(struct agent *a, struct agent_stats *st);

/*
 * cmd_agent is `kolo agent`: argv[0] is the subcommand name ("agent"), the
 * rest are flags (see --help). Runs until SIGINT or SIGTERM, then stops
 * the agent; returns the process exit code.
 */
int cmd_agent(int argc, char **argv);

/*
 * cmd_exec_shim is the internal `kolo __exec -- argv...` that the agent
 * runs every worker through (argv[0] is "__exec"). It ties the worker to
 * the agent's life (PR_SET_PDEATHSIG), forwards termination signals to the
 * worker's process group with a SIGKILL escalation, and exits the way the
 * worker did. See exec_shim.c.
 */
int cmd_exec_shim(int argc, char **argv);

#endif
