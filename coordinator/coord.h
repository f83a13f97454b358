/*
 * coord.h - the coordinator: membership, jobs, launch orders, REST.
 *
 * One coordinator per cluster. coord_start opens the SQLite store, reloads
 * hosts and jobs, starts the RPC listener (agents, workers, clients) and
 * the HTTP listener, and runs the coordinator's main thread, which owns
 * all state. It returns once both listeners are bound.
 */
#ifndef KOLO_COORDINATOR_COORD_H
#define KOLO_COORDINATOR_COORD_H

#include <stddef.h>
#include <stdint.h>

struct coord;

struct coord_config {
    const char *listen; /* RPC URL, e.g. tcp://127.0.0.1:7070 (port 0 = any) */
    const char *http;   /* HTTP "ADDR:PORT" (port 0 = any); NULL or "" = no HTTP */
    const char *db_path;
    const char *token;         /* cluster token, NULL = none (loopback only) */
    int64_t lease_ms;          /* host lease; expires without heartbeats */
    int64_t heartbeat_ms;      /* agents' heartbeat period (parked heartbeat wait) */
    int64_t stop_grace_ms;     /* SIGTERM -> SIGKILL grace agents use to stop workers */
    int64_t max_msg;           /* RPC frame cap in bytes */
    int64_t rpc_contexts;      /* concurrent / parked RPC calls */
    const char *dashboard_dir; /* static files served at "/", NULL = none */
    /* elastic-state snapshots (coord_snap.c); 0 = the default */
    int64_t snapshot_keep;      /* newest snapshots kept per job (3) */
    int64_t snapshot_max_bytes; /* largest snapshot, and in-memory upload bytes per job (2 GiB) */
    int64_t snapshot_upload_ms; /* a partial upload idle this long is dropped (60 s) */
    const struct tls_files *tls; /* NULL or off: plain tcp:// and http:// (common/tls.h) */
    int64_t http_idle_ms;        /* an HTTP connection idle this long is closed; 0 = 60 s */
};

struct tls_files;

int coord_start(struct coord **out, const struct coord_config *cfg, char *err, size_t errlen);
/* Bound URLs: "tcp://127.0.0.1:40211" and "http://127.0.0.1:40212". */
const char *coord_rpc_url(const struct coord *c);
const char *coord_http_url(const struct coord *c);
/* The database file the coordinator keeps its state in. */
const char *coord_db_path(const struct coord *c);
/* The key that opens a job's argv, cwd and output to a browser or script
 * (common/creds.h, view key): the dashboard link kolo prints carries it
 * as ?key=, which the dashboard keeps as a cookie. */
const char *coord_dashboard_key(struct coord *c);
/* coord_stop answers every parked call, closes listeners and the store. */
void coord_stop(struct coord *c);

/*
 * coord_view_open loads the state kept in the database at db_path (a kept
 * run's, for `kolo dashboard`) without writing to it: no listener, no
 * thread, every route that changes state refused. view_key opens argv, cwd
 * and output as coord_dashboard_key does, in the cookie of http_port (the
 * port the caller serves on). coord_view_http answers one request of the
 * caller's HTTP server (nng's aio, as nng_http_handler gives it) from the
 * view; any thread may call it. coord_view_close frees the view.
 */
struct nng_aio;
int coord_view_open(struct coord **out, const char *db_path, const char *view_key, int http_port,
                    char *err, size_t errlen);
void coord_view_http(struct coord *c, struct nng_aio *aio);
void coord_view_close(struct coord *c);

/* `kolo coordinator ...` */
int cmd_coordinator(int argc, char **argv);

#endif
