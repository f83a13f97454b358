/*
 * status.c - `kolo status`: hosts and jobs of a running coordinator.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "knobs.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "tls.h"

static const char usage[] =
    "usage: kolo status [--coordinator tcp://HOST:PORT] [--token-file PATH]";

static void print_hosts(Kolo__ListHostsReply *h)
{
    printf("HOSTS (%zu)\n", h->n_hosts);
    printf("  %-32s %-16s %-15s %-6s %-11s %s\n", "ID", "NAME", "ADDR", "STATE", "SLOTS",
           "LEASE AGE");
    for (size_t i = 0; i < h->n_hosts; i++) {
        Kolo__HostInfo *x = h->hosts[i];
        char slots[32];
        snprintf(slots, sizeof(slots), "%d/%d", x->slots_used, x->slots);
        printf("  %-32s %-16s %-15s %-6s %-11s %.1fs\n", x->id, x->name, x->addr, x->state, slots,
               (double)x->lease_age_ms / 1000.0);
    }
}

static void print_jobs(Kolo__ListJobsReply *j)
{
    printf("JOBS (%zu)\n", j->n_jobs);
    printf("  %-6s %-10s %-4s %-5s %-20s %s\n", "ID", "STATE", "NP", "EXIT", "SUBMITTED",
           "COMMAND");
    for (size_t i = 0; i < j->n_jobs; i++) {
        Kolo__JobInfo *x = j->jobs[i];
        char when[32] = "-", exitc[16] = "-";
        time_t t = (time_t)(x->submitted_ms / 1000);
        struct tm tm;
        if (x->submitted_ms && localtime_r(&t, &tm))
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
        if (strcmp(x->state, "pending") && strcmp(x->state, "running"))
            snprintf(exitc, sizeof(exitc), "%d", x->exit_code);
        printf("  %-6llu %-10s %-4d %-5s %-20s", (unsigned long long)x->id, x->state, x->np, exitc,
               when);
        for (size_t a = 0; a < x->n_argv && a < 8; a++)
            printf(" %s", x->argv[a]);
        if (x->n_argv > 8)
            printf(" ...");
        printf("\n");
        if (x->reason && x->reason[0])
            printf("         %s\n", x->reason);
    }
}

int cmd_status(int argc, char **argv)
{
    char *url = NULL, *token_file = NULL;
    char *tls_cert = NULL, *tls_key = NULL, *tls_ca = NULL, *tls_dir = NULL;
    int64_t timeout = 0;
    struct knob tab[] = {
        {"coordinator", NULL, "KOLO_RUN_COORDINATOR", KNOB_STR, "tcp://127.0.0.1:7070", 0, -1,
         "coordinator RPC address", &url},
        {"token-file", NULL, NULL, KNOB_STR, NULL, 0, -1, "file holding the cluster token",
         &token_file},
        {"timeout", NULL, "", KNOB_DURATION, "5s", 100, 600000, "how long to wait for answers",
         &timeout},
        TLS_KNOBS(tls_cert, tls_key, tls_ca, tls_dir),
    };
    size_t n = sizeof(tab) / sizeof(tab[0]);
    char err[1024];
    int rest = 0, code = 1;
    int rv = knobs_parse(tab, n, argc, argv, &rest, usage, stdout, err, sizeof(err));
    if (rv == KNOBS_HELP || rv == KNOBS_DUMPED) {
        knobs_free(tab, n);
        return 0;
    }
    if (rv != KNOBS_OK || rest < argc) {
        fprintf(stderr, "kolo status: %s\n%s\n", rv != KNOBS_OK ? err : "unexpected argument",
                usage);
        knobs_free(tab, n);
        return 2;
    }
    char *token = NULL;
    struct rpc_client *cli = NULL;
    ProtobufCMessage *hosts = NULL, *jobs = NULL;
    if (cli_token(token_file, &token, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo status: %s\n", err);
        goto out;
    }
    struct tls_files tls;
    if (tls_files_init(&tls, tls_cert, tls_key, tls_ca, tls_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo status: %s\n", err);
        goto out;
    }
    if (cli_connect(&cli, url, token, &tls, "kolo-status", err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo status: %s\n", err);
        goto out;
    }
    Kolo__ListHostsRequest hreq = KOLO__LIST_HOSTS_REQUEST__INIT;
    Kolo__ListJobsRequest jreq = KOLO__LIST_JOBS_REQUEST__INIT;
    if (cli_call(cli, "AdminService.ListHosts", &hreq.base, &kolo__list_hosts_reply__descriptor,
                 &hosts, (int)timeout, err, sizeof(err)) != 0 ||
        cli_call(cli, "AdminService.ListJobs", &jreq.base, &kolo__list_jobs_reply__descriptor,
                 &jobs, (int)timeout, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo status: %s\n", err);
        goto out;
    }
    printf("coordinator %s\n", url);
    print_hosts((Kolo__ListHostsReply *)hosts);
    print_jobs((Kolo__ListJobsReply *)jobs);
    code = 0;
out:
    if (hosts)
        protobuf_c_message_free_unpacked(hosts, NULL);
    if (jobs)
        protobuf_c_message_free_unpacked(jobs, NULL);
    rpc_client_close(cli);
    free(token);
    knobs_free(tab, n);
    return code;
}
