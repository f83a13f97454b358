/*
 * coord_main.c - `kolo coordinator`: knobs, signals, run until told to stop.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "errors.h"
#include "knobs.h"
#include "log.h"
#include "tls.h"
#include "util.h"

static const char usage[] =
    "usage: kolo coordinator [--listen tcp://ADDR:PORT] [--http ADDR:PORT] [--db PATH]\n"
    "                        [--token-file PATH] [options]\n\n"
    "Runs the cluster's coordinator: it keeps hosts, jobs, their negotiation and\n"
    "committed state in one SQLite file, serves the agents, workers and operators\n"
    "over RPC and the REST API, /metrics and the dashboard over HTTP, and picks up\n"
    "where it was after a restart.";

/* The stop runs on its own thread so that the main thread can bound it:
 * coord_stop answers every parked call, stops the writers and closes the
 * servers, and each step waits on something (a writer's last commit,
 * nng's reaper). Past --stop-timeout, or at a second SIGINT/SIGTERM, the
 * process exits at once with status 1: every acknowledged write is
 * already in the database, so this is no worse than kill -9, which the
 * coordinator is built to survive. */
struct stopper {
    struct coord *c;
    atomic_bool done;
};

static void *stop_main(void *arg)
{
    thread_name("kolo-stop");
    struct stopper *s = arg;
    coord_stop(s->c);
    atomic_store(&s->done, true);
    return NULL;
}

/* Returns 0 once the coordinator stopped, 1 when it was given up on. */
static int stop_bounded(struct coord *c, const sigset_t *set, int64_t timeout_ms)
{
    struct stopper s = {.c = c};
    pthread_t t;
    if (pthread_create(&t, NULL, stop_main, &s) != 0) {
        coord_stop(c);
        return 0;
    }
    uint64_t deadline = now_mono_ms() + (uint64_t)timeout_ms;
    while (!atomic_load(&s.done)) {
        if (now_mono_ms() >= deadline) {
            LOGE("coord", "the stop did not finish within %lld ms (--stop-timeout): exiting "
                 "without it", (long long)timeout_ms);
            return 1;
        }
        struct timespec slice = {.tv_nsec = 50 * 1000000L};
        int sig = sigtimedwait(set, NULL, &slice);
        if (sig > 0) {
            LOGW("coord", "signal %d again: exiting without waiting for the stop", sig);
            return 1;
        }
    }
    pthread_join(t, NULL);
    return 0;
}

/* The dashboard's link with its view key (coord_dashboard_key: it opens
 * the jobs' argv, cwd and output to a browser) goes into "<db>.dashboard",
 * mode 0600, for the user who started the coordinator, never into a log. */
static void write_dashboard_link(struct coord *c, const char *db)
{
    if (!db || !db[0] || !coord_http_url(c)[0])
        return;
    char path[4200], link[600];
    snprintf(path, sizeof path, "%s.dashboard", db);
    int n = snprintf(link, sizeof link, "%s/?key=%s\n", coord_http_url(c), coord_dashboard_key(c));
    (void)unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, link, (size_t)n) != n)
        LOGW("coord", "cannot write the dashboard link to %s: %s", path, strerror(errno));
    else
        LOGI("coord", "the dashboard's link (with the key that shows jobs' output) is in %s",
             path);
    if (fd >= 0)
        close(fd);
}

int cmd_coordinator(int argc, char **argv)
{
    char *listen = NULL, *http = NULL, *db = NULL, *token_file = NULL, *dashboard = NULL,
         *log_level = NULL, *tls_cert = NULL, *tls_key = NULL, *tls_ca = NULL, *tls_dir = NULL;
    int64_t lease = 0, heartbeat = 0, grace = 0, max_msg = 0, contexts = 0;
    int64_t snap_keep = 0, snap_max = 0, snap_upload = 0, http_idle = 0, stop_timeout = 0;
    struct knob tab[] = {
        {"listen", NULL, NULL, KNOB_STR, "tcp://127.0.0.1:7070", 0, -1,
         "RPC address for agents, workers and clients (port 0 picks one)", &listen},
        {"http", NULL, NULL, KNOB_STR, "127.0.0.1:7080", 0, -1,
         "HTTP address for REST, /metrics and the dashboard (empty disables)", &http},
        {"db", NULL, NULL, KNOB_STR, "kolo.db", 0, -1, "SQLite database file", &db},
        {"token-file", NULL, NULL, KNOB_STR, NULL, 0, -1,
         "file holding the cluster token (required to listen beyond loopback)", &token_file},
        {"lease", NULL, NULL, KNOB_DURATION, "5s", 500, 3600000,
         "a host is lost when it sends no heartbeat for this long", &lease},
        {"heartbeat", NULL, NULL, KNOB_DURATION, "1s", 50, 600000,
         "agents' heartbeat period (must be well under the lease)", &heartbeat},
        {"stop-grace", NULL, NULL, KNOB_DURATION, "5s", 0, 3600000,
         "time agents give a worker between SIGTERM and SIGKILL", &grace},
        {"max-msg", NULL, NULL, KNOB_SIZE, "1M", 4096, 1LL << 20,
         "RPC request size cap: what one connection may make the coordinator hold before it "
         "authenticates anything (larger payloads go in chunks)",
         &max_msg},
        {"rpc-contexts", NULL, NULL, KNOB_INT, "4096", 4, 65536,
         "concurrent RPC calls, parked ones included (1/16 kept for agents' heartbeats and "
         "reports); a rank parks up to two, so the default serves jobs of about 1,900 ranks",
         &contexts},
        {"http-idle-timeout", NULL, NULL, KNOB_DURATION, "60s", 1000, 86400000,
         "an HTTP connection that moves no byte this long is closed (also: 64 connections per "
         "client address, 1024 in all)",
         &http_idle},
        {"dashboard-dir", NULL, NULL, KNOB_STR, NULL, 0, -1,
         "directory of the dashboard's static files served at /", &dashboard},
        {"snapshot-keep", NULL, NULL, KNOB_INT, "3", 1, 100000,
         "elastic-state snapshots kept per job, newest first (a job may ask for another "
         "number with KOLO_SNAPSHOT_KEEP)",
         &snap_keep},
        {"snapshot-max-bytes", NULL, NULL, KNOB_SIZE, "2G", 1, 1LL << 40,
         "largest snapshot accepted; also the in-memory upload bytes per job", &snap_max},
        {"snapshot-upload-timeout", NULL, NULL, KNOB_DURATION, "60s", 1000, 86400000,
         "a partial snapshot upload that makes no progress this long is dropped", &snap_upload},
        {"stop-timeout", NULL, NULL, KNOB_DURATION, "30s", 1000, 3600000,
         "on SIGTERM/SIGINT, exit with status 1 if the stop (answering parked calls, the last "
         "writes, closing the servers) takes longer; a second signal exits at once",
         &stop_timeout},
        {"log-level", NULL, "KOLO_LOG_LEVEL", KNOB_STR, "info", 0, -1,
         "trace, debug, info, warn, error or off", &log_level},
        TLS_KNOBS(tls_cert, tls_key, tls_ca, tls_dir),
    };
    size_t n = sizeof(tab) / sizeof(tab[0]);
    char err[512];
    int rest = 0, rv;
    log_set_default(LOG_INFO);
    rv = knobs_parse(tab, n, argc, argv, &rest, usage, stdout, err, sizeof(err));
    if (rv == KNOBS_HELP || rv == KNOBS_DUMPED) {
        knobs_free(tab, n);
        return 0;
    }
    if (rv != KNOBS_OK || rest < argc) {
        fprintf(stderr, "kolo coordinator: %s\n%s\n", rv != KNOBS_OK ? err : "unexpected argument",
                usage);
        knobs_free(tab, n);
        return 2;
    }
    int lvl = log_parse_level(log_level);
    if (lvl < 0) {
        fprintf(stderr, "kolo coordinator: unknown log level '%s'\n", log_level);
        knobs_free(tab, n);
        return 2;
    }
    log_set_level(lvl);
    if (heartbeat * 2 > lease) {
        fprintf(stderr, "kolo coordinator: --heartbeat must be at most half of --lease\n");
        knobs_free(tab, n);
        return 2;
    }
    struct tls_files tls;
    if (tls_files_init(&tls, tls_cert, tls_key, tls_ca, tls_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo coordinator: %s\n", err);
        knobs_free(tab, n);
        return 2;
    }
    char *token = NULL;
    if (token_file && read_token_file(token_file, &token, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo coordinator: %s\n", err);
        knobs_free(tab, n);
        return 1;
    }
    struct coord_config cfg = {
        .listen = listen,
        .http = http,
        .db_path = db,
        .token = token,
        .lease_ms = lease,
        .heartbeat_ms = heartbeat,
        .stop_grace_ms = grace,
        .max_msg = max_msg,
        .rpc_contexts = contexts,
        .dashboard_dir = dashboard,
        .snapshot_keep = snap_keep,
        .snapshot_max_bytes = snap_max,
        .snapshot_upload_ms = snap_upload,
        .tls = &tls,
        .http_idle_ms = http_idle,
    };
    /* Block the stop signals before threads start so only sigwait sees them. */
    sigset_t set;
    stop_signals_block(&set);
    /* Every rank keeps two connections (negotiation, reports) and every
     * agent one: a 1024-rank job needs more than the usual soft limit of
     * 1024 descriptors. Take what the hard limit allows. */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &nofile) != 0)
            LOGW("coord", "cannot raise the open-file limit to %llu",
                 (unsigned long long)nofile.rlim_max);
    }
    struct coord *c = NULL;
    rv = coord_start(&c, &cfg, err, sizeof(err));
    if (token) {
        memset(token, 0, strlen(token));
        free(token);
    }
    if (rv != 0) {
        fprintf(stderr, "kolo coordinator: %s\n", err);
        knobs_free(tab, n);
        return 1;
    }
    write_dashboard_link(c, cfg.db_path);
    /* One line on stdout that scripts can wait for. */
    printf("kolo coordinator ready rpc=%s http=%s\n", coord_rpc_url(c), coord_http_url(c));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    LOGI("coord", "signal %d: shutting down", sig);
    if (stop_bounded(c, &set, stop_timeout) != 0) {
        fflush(NULL);
        _exit(1); /* the stop thread still runs: no atexit, no free */
    }
    knobs_free(tab, n);
    return 0;
}
