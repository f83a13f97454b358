/*
 * agent_cmd.c - `kolo agent`: the knob table, signals, and the daemon's
 * life around agent_start / agent_stop.
 *
 * Termination signals are blocked before any thread exists, so every
 * thread inherits the mask and only the main thread, in sigtimedwait,
 * ever sees them; no async-signal-safety puzzles in the agent's threads.
 * libuv resets the mask in the children it spawns.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent.h"
#include "errors.h"
#include "knobs.h"
#include "log.h"
#include "tls.h"
#include "util.h"

static const char usage[] =
    "usage: kolo agent --coordinator tcp://HOST:PORT [--slots N] [--name NAME] "
    "[--token-file PATH] [--addr ADDR] [--state-dir DIR] [--stop-grace 5s] [--drain-grace 30s] "
    "[--log-level L]\n\n"
    "Runs the host agent: it registers this host's slots with the coordinator,\n"
    "starts and watches the workers the coordinator places here, sends their\n"
    "output and exits, and takes their stacks when asked.";

/* A signal to stop (a spot notice's handler, systemd, Ctrl-C): drain the
 * host so elastic jobs leave it at their next commit (no step lost), wait
 * until the workers are gone or grace_ms passed (then agent_stop stops
 * what is left and those jobs fall back to their last commit), or a
 * second signal says not to wait. */
static void drain_then_wait(struct agent *a, int sig, const sigset_t *set, int64_t grace_ms)
{
    struct agent_stats st;
    agent_get_stats(a, &st);
    if (st.workers_alive == 0) {
        LOGI("agent", "received %s, stopping (no workers running)", strsignal(sig));
        return;
    }
    char err[512];
    uint64_t deadline = now_mono_ms() + (uint64_t)grace_ms;
    int timeout = grace_ms < 5000 ? (int)grace_ms : 5000;
    if (agent_drain_self(a, timeout, err, sizeof err) != 0) {
        LOGW("agent", "received %s; cannot drain the host through the coordinator (%s): "
             "stopping %d worker(s) now", strsignal(sig), err, st.workers_alive);
        return;
    }
    LOGI("agent", "received %s: host drained, waiting up to %lld ms for %d worker(s) to leave "
         "(elastic jobs leave at their next commit; a second signal stops them now)",
         strsignal(sig), (long long)grace_ms, st.workers_alive);
    const struct timespec poll = {0, 100 * 1000000L};
    siginfo_t si;
    for (;;) {
        agent_get_stats(a, &st);
        if (st.workers_alive == 0) {
            LOGI("agent", "every worker left; stopping");
            return;
        }
        if (now_mono_ms() >= deadline) {
            LOGW("agent", "%d worker(s) still running after the drain grace; stopping them",
                 st.workers_alive);
            return;
        }
        int again = sigtimedwait(set, &si, &poll);
        if (again > 0) {
            LOGW("agent", "received %s again: stopping %d worker(s) now", strsignal(again),
                 st.workers_alive);
            return;
        }
    }
}

int cmd_agent(int argc, char **argv)
{
    char *coordinator = NULL, *name = NULL, *token_file = NULL, *addr = NULL;
    char *state_dir = NULL, *log_level = NULL, *token = NULL, *job_user = NULL;
    char *tls_cert = NULL, *tls_key = NULL, *tls_ca = NULL, *tls_dir = NULL;
    int64_t slots = 0, grace = 0, drain_grace = 0;
    struct knob tab[] = {
        {"coordinator", NULL, NULL, KNOB_STR, NULL, 1, 0,
         "coordinator RPC address, tcp://HOST:PORT", &coordinator, NULL},
        {"slots", NULL, NULL, KNOB_INT, "0", 0, 4096,
         "worker slots this host offers; 0 = its GPUs if any, else its CPUs", &slots, NULL},
        {"name", NULL, NULL, KNOB_STR, NULL, 1, 0,
         "name of this host in host lists (default: the hostname)", &name, NULL},
        {"token-file", NULL, NULL, KNOB_STR, NULL, 1, 0,
         "file holding the cluster token (not readable by group or others)", &token_file, NULL},
        {"addr", NULL, NULL, KNOB_STR, NULL, 1, 0,
         "address other hosts reach this one at (default: the hostname's first non-loopback "
         "IPv4)",
         &addr, NULL},
        {"state-dir", NULL, NULL, KNOB_STR, NULL, 1, 0,
         "directory holding the host id (default: $XDG_STATE_HOME/kolo/agent-NAME)", &state_dir,
         NULL},
        {"stop-grace", NULL, NULL, KNOB_DURATION, "5s", 0, 3600000,
         "how long a stopped worker gets between SIGTERM and SIGKILL", &grace, NULL},
        {"drain-grace", NULL, NULL, KNOB_DURATION, "30s", 0, 3600000,
         "on SIGTERM or SIGINT, drain the host first: elastic jobs leave at their next commit "
         "and the agent waits up to this long for its workers to go before it stops them "
         "(0: stop at once)",
         &drain_grace, NULL},
        {"job-user", NULL, NULL, KNOB_STR, NULL, 1, 0,
         "run workers as this user, with its groups and no capabilities (the agent must run "
         "as root or hold CAP_SETUID, CAP_SETGID and CAP_KILL); default: the agent's own user",
         &job_user, NULL},
        {"log-level", NULL, "KOLO_LOG_LEVEL", KNOB_STR, NULL, 1, 0,
         "trace, debug, info, warn, error or off (default: info)", &log_level, NULL},
        TLS_KNOBS(tls_cert, tls_key, tls_ca, tls_dir),
    };
    const size_t ntab = sizeof(tab) / sizeof(tab[0]);
    char err[1024];
    int rest = 0, code = 0;

    log_set_default(LOG_INFO);
    int rc = knobs_parse(tab, ntab, argc, argv, &rest, usage, stdout, err, sizeof(err));
    if (rc == KNOBS_HELP || rc == KNOBS_DUMPED) {
        knobs_free(tab, ntab);
        return 0;
    }
    if (rc != KNOBS_OK) {
        fprintf(stderr, "kolo agent: %s\n%s\n", err, usage);
        knobs_free(tab, ntab);
        return 2;
    }
    if (rest < argc) {
        fprintf(stderr, "kolo agent: unexpected argument '%s'\n%s\n", argv[rest], usage);
        code = 2;
        goto out;
    }
    if (log_level) {
        int level = log_parse_level(log_level);
        if (level < 0) {
            fprintf(stderr, "kolo agent: unknown log level '%s'\n", log_level);
            code = 2;
            goto out;
        }
        log_set_level(level);
    }
    if (!coordinator || !*coordinator) {
        fprintf(stderr, "kolo agent: --coordinator is required\n%s\n", usage);
        code = 2;
        goto out;
    }
    if (token_file && read_token_file(token_file, &token, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo agent: %s\n", err);
        code = 1;
        goto out;
    }
    struct tls_files tls;
    if (tls_files_init(&tls, tls_cert, tls_key, tls_ca, tls_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo agent: %s\n", err);
        code = 2;
        goto out;
    }
    if (!token && !addr_is_loopback(coordinator))
        LOGW("agent",
             "no cluster token configured for a non-loopback coordinator (%s); "
             "expect it to refuse this agent",
             coordinator);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* A write to a closed pipe (our stderr under a dead pager) must not
     * kill the agent and, with it, every worker. */
    signal(SIGPIPE, SIG_IGN);

    struct agent_config cfg = {0};
    cfg.coordinator_url = coordinator;
    cfg.token = token;
    cfg.tls = &tls;
    cfg.name = name;
    cfg.addr = addr;
    cfg.state_dir = state_dir;
    cfg.slots = (int)slots;
    cfg.stop_grace_ms = grace;
    cfg.job_user = job_user;
    cfg.exec_path = NULL; /* agent_start resolves /proc/self/exe */
    struct agent *a = NULL;
    if ((rc = agent_start(&a, &cfg, err, sizeof(err))) != 0) {
        fprintf(stderr, "kolo agent: %s\n", err);
        code = 1;
        goto out;
    }

    siginfo_t si;
    const struct timespec tick = {1, 0};
    int sig;
    while ((sig = sigtimedwait(&set, &si, &tick)) <= 0) {
    }
    if (drain_grace > 0)
        drain_then_wait(a, sig, &set, drain_grace);
    else
        LOGI("agent", "received %s, stopping", strsignal(sig));
    agent_stop(a);

out:
    if (token) {
        /* The secret should not linger in freed memory. */
        memset(token, 0, strlen(token));
        free(token);
    }
    knobs_free(tab, ntab);
    return code;
}
