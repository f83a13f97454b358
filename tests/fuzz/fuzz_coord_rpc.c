/*
 * fuzz_coord_rpc.c - libFuzzer harness for every RPC handler of a real
 * coordinator (SQLite file, its threads, the cron): the first byte picks
 * the method (every method of COORD_METHODS, and one that does not exist),
 * the rest is the protobuf body, sent in a frame MAC'd with the cluster
 * token, as an agent, a worker or an operator holding it would send it.
 * Whatever the body, the coordinator answers or parks the call, and never
 * crashes or corrupts its state; every 256 inputs it must still list its
 * jobs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_model.h"
#include "fuzz_coord.h"
#include "rpc.h"

static const char *methods[] = {
#define FUZZ_METHOD_NAME(id, name, who, handler) name,
    COORD_METHODS(FUZZ_METHOD_NAME)
#undef FUZZ_METHOD_NAME
};
#define NMETHODS (sizeof methods / sizeof methods[0])

static struct coord *coord;
static struct rpc_client *cli;
static unsigned inputs;

static void close_client(void)
{
    rpc_client_close(cli);
}

static void start(void)
{
    coord = fuzz_coord_start("inproc://kolo-fuzz-coord", NULL);
    struct rpc_client_config cc = {.url = coord_rpc_url(coord), .token = FUZZ_TOKEN,
                                   .identity = "fuzz-host"};
    if (rpc_client_open(&cli, &cc) != 0)
        abort();
    fuzz_coord_before_stop = close_client;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!coord)
        start();
    if (size < 1)
        return 0;
    const char *method = data[0] % (NMETHODS + 1) == NMETHODS ? "Fuzz.NoSuchMethod"
                                                               : methods[data[0] % (NMETHODS + 1)];
    void *rep = NULL;
    size_t len = 0;
    char err[512];
    /* long polls (heartbeats, output streams) park: a short deadline */
    rpc_client_call(cli, method, data + 1, size - 1, &rep, &len, 50, err, sizeof err);
    free(rep);
    if (++inputs % 256 == 0) {
        /* still serving: an empty ListJobs request must be answered */
        int rv = rpc_client_call(cli, "AdminService.ListJobs", NULL, 0, &rep, &len, 10000, err,
                                 sizeof err);
        if (rv != 0) {
            fprintf(stderr, "fuzz_coord_rpc: the coordinator stopped answering: %s\n", err);
            abort();
        }
        free(rep);
    }
    return 0;
}
