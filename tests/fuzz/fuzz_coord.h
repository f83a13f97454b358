/*
 * fuzz_coord.h - the real coordinator the coordinator fuzzers run against:
 * its SQLite file in a fresh /tmp directory, the cluster token set, RPC on
 * an inproc address, HTTP where asked; stopped and removed at exit.
 */
#ifndef KOLO_TESTS_FUZZ_COORD_H
#define KOLO_TESTS_FUZZ_COORD_H

#include <stdio.h>
#include <stdlib.h>

#include "coord.h"

#define FUZZ_TOKEN "fuzz-token-0123456789abcdef"

static struct coord *fuzz_coord;
static char fuzz_coord_dir[64];
static void (*fuzz_coord_before_stop)(void);

static void fuzz_coord_stop(void)
{
    if (fuzz_coord_before_stop)
        fuzz_coord_before_stop();
    coord_stop(fuzz_coord);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fuzz_coord_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "fuzz: could not remove %s\n", fuzz_coord_dir);
}

/* Starts the coordinator (http: "127.0.0.1:0" or NULL), or aborts. */
static struct coord *fuzz_coord_start(const char *listen, const char *http)
{
    char db[128], err[512];
    snprintf(fuzz_coord_dir, sizeof fuzz_coord_dir, "/tmp/kolo-fuzz-coord.XXXXXX");
    if (!mkdtemp(fuzz_coord_dir))
        abort();
    snprintf(db, sizeof db, "%s/kolo.db", fuzz_coord_dir);
    struct coord_config cfg = {.listen = listen,
                               .http = http,
                               .db_path = db,
                               .token = FUZZ_TOKEN,
                               .lease_ms = 5000,
                               .heartbeat_ms = 1000,
                               .stop_grace_ms = 100};
    if (coord_start(&fuzz_coord, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz: cannot start the coordinator: %s\n", err);
        abort();
    }
    atexit(fuzz_coord_stop);
    return fuzz_coord;
}

#endif
