/*
 * dashboard.c - `kolo dashboard`: the dashboard of the runs `kolo run`
 * kept (<state dir>/runs/run-<ms>-<pid>.db, the newest RUNS_KEPT), served
 * after their embedded coordinator is gone.
 *
 * One HTTP server, three kinds of path:
 *   /runs/                 the dashboard's page, which lists the runs
 *   /api/v1/runs           the runs, newest first (JSON)
 *   /runs/RUN/...          RUN's own dashboard and REST API, answered by
 *                          the coordinator's HTTP code (coord_view_http)
 *                          from a view of RUN's database with the prefix
 *                          taken off: every job page works as it did live
 * and the dashboard's static files elsewhere. A view opens the database
 * read-only (store_open_readonly never writes or creates a file). The view
 * of a run that ended is kept until its file changes; that of a run still
 * going (its -wal file is there) only for the request: a connection of
 * ours open when its kolo run closes the database would keep it from
 * folding the WAL back into the file and removing it.
 *
 * Reads are served as by a coordinator without a token: timings, states
 * and events to anyone on loopback; argv, cwd and output with the key this
 * process makes up and prints (?key=, kept as a cookie by the first
 * /runs/RUN/ page that gets it); nothing can be changed.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "cli.h"
#include "coord.h"
#include "coord_static.h"
#include "errors.h"
#include "json.h"
#include "knobs.h"
#include "log.h"
#include "util.h"

#define VIEWS_MAX 32 /* open views; the least recently used goes first */

static const char usage[] = "usage: kolo dashboard [--http ADDR:PORT] [--state-dir DIR] [RUN]";

struct view {
    char name[64]; /* "run-<ms>-<pid>" */
    struct coord *c;
    struct timespec db_mtime, wal_mtime; /* of the files the view was loaded from */
    off_t db_size, wal_size;
    uint64_t used; /* dash.tick when last used */
};

static struct {
    pthread_mutex_t mu; /* the views; one request at a time */
    char runs[4096];    /* <state dir>/runs */
    char key[33];
    int port;
    struct view views[VIEWS_MAX];
    uint64_t tick;
} dash = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* run_name_ok: "run-<digits>-<digits>", the names kolo run gives. */
static bool run_name_ok(const char *s, size_t len)
{
    if (len < 7 || len >= sizeof dash.views[0].name || strncmp(s, "run-", 4) != 0)
        return false;
    int dashes = 0;
    for (size_t i = 4; i < len; i++) {
        if (s[i] == '-' && i > 4 && s[i - 1] != '-')
            dashes++;
        else if (s[i] < '0' || s[i] > '9')
            return false;
    }
    return dashes == 1 && s[len - 1] != '-';
}

static void file_sig(const char *path, struct timespec *mtime, off_t *size)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        *mtime = sb.st_mtim;
        *size = sb.st_size;
    } else {
        memset(mtime, 0, sizeof *mtime);
        *size = -1;
    }
}

static bool same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* The view of run name, loaded again when its files changed since; NULL
 * with err set when it cannot be opened. *transient: the caller closes it
 * after the request (a run still going). Under dash.mu. */
static struct coord *view_get(const char *name, bool *transient, char *err, size_t errlen)
{
    char db[4200], wal[4210];
    snprintf(db, sizeof db, "%s/%s.db", dash.runs, name);
    snprintf(wal, sizeof wal, "%s-wal", db);
    struct timespec dm, wm;
    off_t ds, ws;
    file_sig(db, &dm, &ds);
    file_sig(wal, &wm, &ws);
    if ((*transient = ws >= 0)) {
        struct coord *c = NULL;
        return coord_view_open(&c, db, dash.key, dash.port, err, errlen) == 0 ? c : NULL;
    }
    struct view *v = NULL, *lru = &dash.views[0];
    for (int i = 0; i < VIEWS_MAX && !v; i++) {
        if (dash.views[i].c && strcmp(dash.views[i].name, name) == 0)
            v = &dash.views[i];
        else if (!dash.views[i].c || (lru->c && dash.views[i].used < lru->used))
            lru = &dash.views[i];
    }
    if (v && (!same_time(&v->db_mtime, &dm) || v->db_size != ds || !same_time(&v->wal_mtime, &wm) ||
              v->wal_size != ws)) {
        coord_view_close(v->c);
        v->c = NULL;
    }
    if (!v) {
        v = lru;
        coord_view_close(v->c);
        v->c = NULL;
    }
    if (!v->c) {
        memset(v, 0, sizeof *v);
        if (coord_view_open(&v->c, db, dash.key, dash.port, err, errlen) != 0)
            return NULL;
        str_copy(v->name, name, sizeof v->name);
        v->db_mtime = dm;
        v->wal_mtime = wm;
        v->db_size = ds;
        v->wal_size = ws;
    }
    v->used = ++dash.tick;
    return v->c;
}

/* ------------------------------------------------------------ answers */

static void reply(nng_aio *aio, int status, const char *type, const char *body, size_t len,
                  const char *location)
{
    nng_http_res *res;
    if (nng_http_res_alloc(&res) != 0) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    nng_http_res_set_status(res, (uint16_t)status);
    nng_http_res_set_header(res, "Content-Type", type);
    nng_http_res_set_header(res, "Cache-Control", "no-store");
    nng_http_res_set_header(res, "X-Content-Type-Options", "nosniff");
    if (location)
        nng_http_res_set_header(res, "Location", location);
    nng_http_res_copy_data(res, body, len);
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static void reply_error(nng_aio *aio, int status, const char *msg)
{
    struct buf b;
    struct jw w;
    buf_init(&b);
    jw_init(&w, &b);
    jw_obj_begin(&w);
    jw_kstr(&w, "error", msg);
    jw_kint(&w, "status", status);
    jw_obj_end(&w);
    buf_putc(&b, '\n');
    reply(aio, status, "application/json", b.data ? b.data : "", b.len, NULL);
    buf_free(&b);
}

static void reply_static(nng_aio *aio, const char *path)
{
    const struct static_file *f = static_file_find(path);
    if (!f)
        reply_error(aio, 404, "no such route");
    else
        reply(aio, 200, static_content_type(f->path), (const char *)f->data, f->len, NULL);
}

static int name_desc(const struct dirent **a, const struct dirent **b)
{
    return -alphasort(a, b);
}

/* GET /api/v1/runs: every kept run, newest first (names sort by start). */
static void reply_runs(nng_aio *aio)
{
    struct buf b;
    struct jw w;
    buf_init(&b);
    jw_init(&w, &b);
    jw_obj_begin(&w);
    jw_kstr(&w, "dir", dash.runs);
    jw_key(&w, "runs");
    jw_arr_begin(&w);
    struct dirent **names = NULL;
    int n = scandir(dash.runs, &names, NULL, name_desc);
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        size_t len = strlen(nm);
        if (len > 3 && strcmp(nm + len - 3, ".db") == 0 && run_name_ok(nm, len - 3)) {
            unsigned long long ms = strtoull(nm + 4, NULL, 10);
            long pid = strtol(strrchr(nm, '-') + 1, NULL, 10);
            char db[4200], wal[4210];
            snprintf(db, sizeof db, "%s/%s", dash.runs, nm);
            snprintf(wal, sizeof wal, "%s-wal", db);
            struct stat sb;
            /* its kolo run still holds the database open (a run that
             * ended checkpointed it and removed its WAL) */
            bool running = access(wal, F_OK) == 0 && pid > 0 && kill((pid_t)pid, 0) == 0;
            jw_obj_begin(&w);
            jw_key(&w, "name");
            jw_strn(&w, nm, len - 3);
            jw_kuint(&w, "started_ms", ms);
            jw_kint(&w, "pid", pid);
            jw_kbool(&w, "running", running);
            long long bytes = stat(db, &sb) == 0 ? (long long)sb.st_size : 0;
            bytes += stat(wal, &sb) == 0 ? (long long)sb.st_size : 0;
            jw_kint(&w, "bytes", bytes);
            jw_kuint(&w, "modified_ms",
                     stat(access(wal, F_OK) == 0 ? wal : db, &sb) == 0
                         ? (uint64_t)sb.st_mtim.tv_sec * 1000 +
                               (uint64_t)sb.st_mtim.tv_nsec / 1000000
                         : 0);
            jw_obj_end(&w);
        }
        free(names[i]);
    }
    free(names);
    jw_arr_end(&w);
    jw_obj_end(&w);
    buf_putc(&b, '\n');
    reply(aio, 200, "application/json", b.data ? b.data : "", b.len, NULL);
    buf_free(&b);
}

static void http_cb(nng_aio *aio)
{
    nng_http_req *req = nng_aio_get_input(aio, 0);
    const char *uri = nng_http_req_get_uri(req);
    const char *method = nng_http_req_get_method(req);
    size_t plen = strcspn(uri, "?");
    const char *query = uri + plen;
    pthread_mutex_lock(&dash.mu);
    if (strncmp(uri, "/runs/", 6) == 0 && plen > 6) {
        const char *name = uri + 6;
        size_t nlen = strcspn(name, "/?");
        char nm[64], err[512], rest[1200];
        struct coord *c = NULL;
        bool transient = false;
        if (!run_name_ok(name, nlen)) {
            reply_error(aio, 404, "no such run");
        } else if (name[nlen] != '/') { /* /runs/RUN: its page is /runs/RUN/ */
            snprintf(rest, sizeof rest, "/runs/%.*s/%s", (int)nlen, name, query);
            reply(aio, 302, "text/plain", rest, strlen(rest), rest);
        } else {
            snprintf(nm, sizeof nm, "%.*s", (int)nlen, name);
            if (!(c = view_get(nm, &transient, err, sizeof err))) {
                reply_error(aio, 404, err);
            } else if (snprintf(rest, sizeof rest, "%s", name + nlen) >= (int)sizeof rest ||
                       nng_http_req_set_uri(req, rest) != 0) {
                reply_error(aio, 414, "URI too long");
            } else {
                coord_view_http(c, aio); /* answers before it returns */
            }
        }
        if (transient)
            coord_view_close(c);
    } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        reply_error(aio, 405, "kolo dashboard only reads");
    } else if (plen == 1 || (plen == 5 && strncmp(uri, "/runs", 5) == 0)) {
        char loc[600];
        snprintf(loc, sizeof loc, "/runs/%s", query);
        reply(aio, 302, "text/plain", loc, strlen(loc), loc);
    } else if (plen == 6 || (plen == 16 && strncmp(uri, "/runs/index.html", 16) == 0)) {
        reply_static(aio, "/index.html");
    } else if (plen == 12 && strncmp(uri, "/api/v1/runs", 12) == 0) {
        reply_runs(aio);
    } else {
        char path[256];
        snprintf(path, sizeof path, "%.*s", (int)(plen < 255 ? plen : 255), uri);
        if (strncmp(path, "/api/", 5) == 0)
            reply_error(aio, 404, "no such route (a run's API is under /runs/RUN/api/v1/)");
        else
            reply_static(aio, path);
    }
    pthread_mutex_unlock(&dash.mu);
}

static int serve(const char *addr, nng_http_server **srv, char *url_out, size_t url_len, char *err,
                 size_t errlen)
{
    char urltext[300];
    nng_url *url = NULL;
    nng_http_handler *h = NULL;
    int rv;
    snprintf(urltext, sizeof urltext, "http://%s", addr);
    if ((rv = nng_url_parse(&url, urltext)) != 0) {
        snprintf(err, errlen, "invalid HTTP address '%s' (want ADDR:PORT)", addr);
        return KOLO_EINVAL;
    }
    if ((rv = nng_http_server_hold(srv, url)) != 0 ||
        (rv = nng_http_handler_alloc(&h, "/", http_cb)) != 0)
        goto fail;
    nng_http_handler_set_method(h, NULL);
    nng_http_handler_set_tree(h);
    if ((rv = nng_http_server_add_handler(*srv, h)) != 0) {
        nng_http_handler_free(h);
        goto fail;
    }
    if ((rv = nng_http_server_start(*srv)) != 0)
        goto fail;
    nng_sockaddr sa;
    if (nng_http_server_get_addr(*srv, &sa) == 0 && sa.s_family == NNG_AF_INET)
        dash.port = ((sa.s_in.sa_port & 0xff) << 8) | (sa.s_in.sa_port >> 8);
    snprintf(url_out, url_len, "http://%s:%d", url->u_hostname, dash.port);
    nng_url_free(url);
    return 0;
fail:
    snprintf(err, errlen, "cannot serve HTTP on %s: %s%s", addr, nng_strerror(rv),
             rv == NNG_EADDRINUSE ? " (another kolo dashboard? --http 127.0.0.1:0 picks a port)"
                                  : "");
    if (*srv)
        nng_http_server_release(*srv);
    *srv = NULL;
    nng_url_free(url);
    return KOLO_EIO;
}

int cmd_dashboard(int argc, char **argv)
{
    char *http = NULL, *state_dir = NULL;
    struct knob tab[] = {
        {"http", NULL, "KOLO_DASHBOARD_HTTP", KNOB_STR, "127.0.0.1:7090", 0, -1,
         "HTTP address to serve on (loopback only: the pages show jobs' output to the key's "
         "holder; port 0 picks one)",
         &http},
        {"state-dir", NULL, NULL, KNOB_STR, NULL, 0, -1,
         "kolo run's state directory (default $XDG_STATE_HOME/kolo or ~/.local/state/kolo)",
         &state_dir},
    };
    size_t n = sizeof tab / sizeof tab[0];
    char err[600];
    int rest = 0;
    int rv = knobs_parse(tab, n, argc, argv, &rest, usage, stdout, err, sizeof err);
    if (rv == KNOBS_HELP || rv == KNOBS_DUMPED) {
        knobs_free(tab, n);
        return 0;
    }
    const char *run = rest < argc ? argv[rest] : NULL;
    if (rv != KNOBS_OK || rest + 1 < argc || (run && !run_name_ok(run, strlen(run)))) {
        fprintf(stderr, "kolo dashboard: %s\n%s\n",
                rv != KNOBS_OK ? err
                : run && rest + 1 == argc
                    ? "RUN is a run's name, run-<ms>-<pid>, as kolo run prints it"
                    : "unexpected argument",
                usage);
        knobs_free(tab, n);
        return 2;
    }
    if (!addr_is_loopback(http)) {
        fprintf(stderr, "kolo dashboard: refusing to serve on %s: loopback only (127.0.0.1)\n",
                http);
        knobs_free(tab, n);
        return 2;
    }
    char *dir = state_dir && state_dir[0] ? strdup(state_dir) : cli_state_dir();
    snprintf(dash.runs, sizeof dash.runs, "%s/runs", dir);
    free(dir);
    if (random_hex(dash.key, 16) != 0) {
        fprintf(stderr, "kolo dashboard: no random bytes for the view key\n");
        knobs_free(tab, n);
        return 1;
    }
    sigset_t set;
    stop_signals_block(&set);
    nng_http_server *srv = NULL;
    char url[300];
    if (serve(http, &srv, url, sizeof url, err, sizeof err) != 0) {
        fprintf(stderr, "kolo dashboard: %s\n", err);
        knobs_free(tab, n);
        return 1;
    }
    if (run)
        printf("kolo dashboard: run %s at %s/runs/%s/?key=%s\n", run, url, run, dash.key);
    printf("kolo dashboard: the runs in %s at %s/runs/?key=%s (Ctrl-C stops)\n", dash.runs, url,
           dash.key);
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    /* a second Ctrl-C ends the process, should nng's stop hang
     * (coord_http_stop tells that story): nothing here needs a clean exit */
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    nng_http_server_stop(srv);
    nng_http_server_release(srv);
    for (int i = 0; i < VIEWS_MAX; i++)
        coord_view_close(dash.views[i].c);
    knobs_free(tab, n);
    return 0;
}
