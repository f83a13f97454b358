/*
 * ops.c - the operator's commands against a running coordinator:
 *
 *   kolo status              hosts and jobs, for a person
 *   kolo jobs  [-o json]     the jobs
 *   kolo hosts [-o json]     the hosts
 *   kolo logs [-f] [--rank N] JOB
 *                            a job's output so far (-f: and what follows,
 *                            until the job ends, across coordinator
 *                            restarts, then how it ended)
 *   kolo stop [--reason TEXT] JOB
 *   kolo stacks [--rank N] [-o json] JOB
 *                            what every rank is doing now: its Python
 *                            stacks, its process's state, its ops in a
 *                            stall (coordinator/coord_stacks.c)
 *   kolo attach JOB          follow a job (one submitted with kolo run
 *                            --detach) as kolo run would, exit with its code;
 *                            Ctrl-C ends the following, not the job
 *   kolo drain HOST / kolo undrain HOST
 *                            no new work on the host, elastic jobs leave it
 *                            (by id or name) / usable again
 *
 * DESIGN. Every command takes the same connection flags (--coordinator,
 * --token-file, --timeout and the TLS ones: struct conn, CONN_KNOBS) and
 * speaks AdminService over RPC, so the token rules are the coordinator's
 * (an admin call needs the cluster token beyond loopback, as REST
 * writes do). -o json prints what a script wants: one JSON document, the
 * same field names as the REST API (docs/api.md). Exit codes a script can
 * rely on: 0 done, 1 the coordinator refused or could not be reached (the
 * reason on stderr), 2 a usage error, 3 no such job or host.
 *
 * A job's output reaches a terminal with its control bytes made visible
 * (job_lines.c); --raw, or a pipe or file, gets the bytes as they are.
 * `kolo logs -f` outlives a coordinator restart: a call that fails as a
 * restart would (cli_transient) is retried on the same client, which
 * redials by itself, from the last sequence number printed, so no line
 * is printed twice or lost; it gives up once no answer came for
 * --retry-for (60 s), saying so on stderr. A coordinator killed under a
 * parked call is noticed when that call times out (--timeout + 5 s), so
 * giving up can take that much longer.
 */
#include "cli.h"
#include "coord_stacks.h"
#include "run.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "errors.h"
#include "json.h"
#include "knobs.h"
#include "kolo.pb-c.h"
#include "tls.h"
#include "util.h"

#define EXIT_REFUSED  1
#define EXIT_USAGE    2
#define EXIT_NOTFOUND 3

/* ---------------------------------------------------------------- connection */

struct conn {
    char *url, *token_file, *output;
    char *tls_cert, *tls_key, *tls_ca, *tls_dir;
    int64_t timeout;
    char *token;
    struct rpc_client *cli;
};

#define CONN_KNOBS(c)                                                                              \
    {"coordinator", NULL, "KOLO_RUN_COORDINATOR", KNOB_STR, "tcp://127.0.0.1:7070", 0, -1,        \
     "coordinator RPC address", &(c)->url},                                                       \
        {"token-file", NULL, NULL, KNOB_STR, NULL, 0, -1, "file holding the cluster token",       \
         &(c)->token_file},                                                                        \
        {"timeout", NULL, "", KNOB_DURATION, "5s", 100, 600000, "how long to wait for answers",    \
         &(c)->timeout},                                                                           \
        TLS_KNOBS((c)->tls_cert, (c)->tls_key, (c)->tls_ca, (c)->tls_dir)
#define OUTPUT_KNOB(c)                                                                             \
    {"output", "-o", "", KNOB_STR, "table", 0, -1, "table or json", &(c)->output}

/* Parses argv with tab; *rest is the first operand. 0 to go on, else the
 * exit code (help printed: -1; a bad flag: 2). --help prints the usage
 * line, then about: what the command does, in a sentence or two. */
static int parse(const char *cmd, const char *usage, const char *about, struct knob *tab, size_t n,
                 int argc, char **argv, int *rest, int min_operands, int max_operands)
{
    char err[1024], head[1024];
    snprintf(head, sizeof head, "%s\n\n%s", usage, about);
    int rv = knobs_parse(tab, n, argc, argv, rest, head, stdout, err, sizeof err);
    if (rv == KNOBS_HELP || rv == KNOBS_DUMPED)
        return -1;
    int operands = argc - *rest;
    if (rv != KNOBS_OK || operands < min_operands || operands > max_operands) {
        fprintf(stderr, "kolo %s: %s\n%s\n", cmd,
                rv != KNOBS_OK        ? err
                : operands < min_operands ? "missing argument"
                                          : "unexpected argument",
                usage);
        return EXIT_USAGE;
    }
    return 0;
}

static int conn_open(struct conn *c, const char *cmd)
{
    char err[1024], who[32];
    struct tls_files tls;
    snprintf(who, sizeof who, "kolo-%s", cmd);
    if (c->output && strcmp(c->output, "table") && strcmp(c->output, "json")) {
        fprintf(stderr, "kolo %s: -o takes table or json, not '%s'\n", cmd, c->output);
        return EXIT_USAGE;
    }
    if (cli_token(c->token_file, &c->token, err, sizeof err) != 0 ||
        tls_files_init(&tls, c->tls_cert, c->tls_key, c->tls_ca, c->tls_dir, err, sizeof err) !=
            0 ||
        cli_connect(&c->cli, c->url, c->token, &tls, who, err, sizeof err) != 0) {
        fprintf(stderr, "kolo %s: %s\n", cmd, err);
        return EXIT_REFUSED;
    }
    return 0;
}

static void conn_close(struct conn *c, struct knob *tab, size_t n)
{
    rpc_client_close(c->cli);
    free(c->token);
    knobs_free(tab, n);
}

static bool as_json(const struct conn *c)
{
    return c->output && strcmp(c->output, "json") == 0;
}

/* Calls method about job (0: none); on failure prints why and returns
 * the exit code. */
static int call(struct conn *c, const char *cmd, uint64_t job, const char *method,
                const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rep_desc,
                ProtobufCMessage **rep, int timeout_ms)
{
    char err[1024];
    int rv = cli_call(c->cli, method, req, rep_desc, rep, timeout_ms ? timeout_ms : (int)c->timeout,
                      err, sizeof err);
    if (rv == 0)
        return 0;
    if (job)
        fprintf(stderr, "kolo %s: job %llu: %s\n", cmd, (unsigned long long)job, err);
    else
        fprintf(stderr, "kolo %s: %s\n", cmd, err);
    return rv == KOLO_ENOTFOUND ? EXIT_NOTFOUND : EXIT_REFUSED;
}

/* A job id operand: a positive integer, or a usage error. */
static int job_operand(const char *cmd, const char *text, uint64_t *id)
{
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (!*text || *end || v == 0) {
        fprintf(stderr, "kolo %s: '%s' is not a job id\n", cmd, text);
        return EXIT_USAGE;
    }
    *id = v;
    return 0;
}

static void print_json(struct buf *b)
{
    fwrite(b->data, 1, b->len, stdout);
    fputc('\n', stdout);
    buf_free(b);
}

/* ---------------------------------------------------------------- rendering */

static void hosts_table(const Kolo__ListHostsReply *h)
{
    printf("HOSTS (%zu)\n", h->n_hosts);
    printf("  %-32s %-16s %-15s %-7s %-11s %s\n", "ID", "NAME", "ADDR", "STATE", "SLOTS",
           "LEASE AGE");
    for (size_t i = 0; i < h->n_hosts; i++) {
        const Kolo__HostInfo *x = h->hosts[i];
        char slots[32];
        snprintf(slots, sizeof slots, "%d/%d", x->slots_used, x->slots);
        printf("  %-32s %-16s %-15s %-7s %-11s %.1fs\n", x->id, x->name, x->addr, x->state, slots,
               (double)x->lease_age_ms / 1000.0);
    }
}

/* The hosts as a JSON array, into w. */
static void hosts_json(struct jw *w, const Kolo__ListHostsReply *h)
{
    jw_arr_begin(w);
    for (size_t i = 0; i < h->n_hosts; i++) {
        const Kolo__HostInfo *x = h->hosts[i];
        jw_obj_begin(w);
        jw_kstr(w, "id", x->id);
        jw_kstr(w, "name", x->name);
        jw_kstr(w, "hostname", x->hostname);
        jw_kstr(w, "addr", x->addr);
        jw_kstr(w, "state", x->state);
        jw_kint(w, "slots", x->slots);
        jw_kint(w, "slots_used", x->slots_used);
        jw_kuint(w, "lease_age_ms", x->lease_age_ms);
        jw_kuint(w, "registered_ms", x->registered_ms);
        jw_obj_end(w);
    }
    jw_arr_end(w);
}

static bool job_ended(const char *state)
{
    return strcmp(state, "pending") != 0 && strcmp(state, "running") != 0;
}

/* The RANKS column: live ranks of np while the job can have any, np
 * alone once it ended (no rank is alive then, and "0/4" would read as a
 * job that lost its workers); "+N": hot spares waiting (--spares). */
static void ranks_cell(char *out, size_t size, const Kolo__JobInfo *x)
{
    if (job_ended(x->state))
        snprintf(out, size, "-/%d", x->np);
    else if (x->spares_wanted > 0)
        snprintf(out, size, "%d/%d+%d", x->ranks_alive, x->np, x->spares_waiting);
    else
        snprintf(out, size, "%d/%d", x->ranks_alive, x->np);
}

static void jobs_table(const Kolo__ListJobsReply *j)
{
    printf("JOBS (%zu)\n", j->n_jobs);
    printf("  %-6s %-16s %-10s %-7s %-5s %-20s %s\n", "ID", "NAME", "STATE", "RANKS", "EXIT",
           "SUBMITTED", "COMMAND");
    for (size_t i = 0; i < j->n_jobs; i++) {
        const Kolo__JobInfo *x = j->jobs[i];
        char when[32] = "-", exitc[16] = "-", ranks[32];
        ranks_cell(ranks, sizeof ranks, x);
        time_t t = (time_t)(x->submitted_ms / 1000);
        struct tm tm;
        if (x->submitted_ms && localtime_r(&t, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        if (job_ended(x->state))
            snprintf(exitc, sizeof exitc, "%d", x->exit_code);
        /* a long name keeps its start and its end: runs of one script
         * differ at the end (train.py, train-lr3.py) */
        char name[17];
        size_t nl = strlen(x->name);
        if (nl <= 16)
            snprintf(name, sizeof name, "%s", x->name[0] ? x->name : "-");
        else
            snprintf(name, sizeof name, "%.7s..%s", x->name, x->name + nl - 7);
        printf("  %-6llu %-16s %-10s %-7s %-5s %-20s", (unsigned long long)x->id, name, x->state,
               ranks, exitc, when);
        for (size_t a = 0; a < x->n_argv && a < 8; a++)
            printf(" %s", x->argv[a]);
        if (x->n_argv > 8)
            printf(" ...");
        printf("\n");
        if (x->reason && x->reason[0])
            printf("         %s\n", x->reason);
    }
}

/* The jobs as a JSON array, into w. */
static void jobs_json(struct jw *w, const Kolo__ListJobsReply *j)
{
    jw_arr_begin(w);
    for (size_t i = 0; i < j->n_jobs; i++) {
        const Kolo__JobInfo *x = j->jobs[i];
        jw_obj_begin(w);
        jw_kuint(w, "id", x->id);
        jw_kstr(w, "name", x->name);
        jw_kstr(w, "state", x->state);
        jw_kint(w, "np", x->np);
        jw_key(w, "exit_code");
        if (job_ended(x->state))
            jw_int(w, x->exit_code);
        else
            jw_null(w);
        jw_kstr(w, "reason", x->reason);
        jw_key(w, "argv");
        jw_arr_begin(w);
        for (size_t a = 0; a < x->n_argv; a++)
            jw_str(w, x->argv[a]);
        jw_arr_end(w);
        jw_kstr(w, "cwd", x->cwd);
        jw_kstr(w, "hosts", x->hosts);
        jw_kuint(w, "generation", x->generation);
        jw_kint(w, "ranks_alive", x->ranks_alive);
        jw_kbool(w, "elastic", x->elastic);
        jw_kint(w, "resets", x->resets);
        jw_kint(w, "spares_wanted", x->spares_wanted);
        jw_kint(w, "spares_waiting", x->spares_waiting);
        jw_kuint(w, "submitted_ms", x->submitted_ms);
        jw_kuint(w, "started_ms", x->started_ms);
        jw_kuint(w, "ended_ms", x->ended_ms);
        jw_obj_end(w);
    }
    jw_arr_end(w);
}

/* ---------------------------------------------------------------- commands */

/* status, jobs, hosts: which lists to print. */
static int list_cmd(const char *cmd, const char *about, bool hosts, bool jobs, int argc,
                    char **argv)
{
    bool both = hosts && jobs;
    char usage[160];
    snprintf(usage, sizeof usage,
             "usage: kolo %s [--coordinator URL] [--token-file PATH] [-o table|json]", cmd);
    struct conn c = {0};
    struct knob tab[] = {CONN_KNOBS(&c), OUTPUT_KNOB(&c)};
    size_t n = sizeof tab / sizeof tab[0];
    int rest = 0;
    int code = parse(cmd, usage, about, tab, n, argc, argv, &rest, 0, 0);
    if (code || (code = conn_open(&c, cmd)) != 0) {
        conn_close(&c, tab, n);
        return code < 0 ? 0 : code;
    }
    ProtobufCMessage *h = NULL, *j = NULL;
    Kolo__ListHostsRequest hreq = KOLO__LIST_HOSTS_REQUEST__INIT;
    Kolo__ListJobsRequest jreq = KOLO__LIST_JOBS_REQUEST__INIT;
    if (hosts)
        code = call(&c, cmd, 0, "AdminService.ListHosts", &hreq.base,
                    &kolo__list_hosts_reply__descriptor, &h, 0);
    if (!code && jobs)
        code = call(&c, cmd, 0, "AdminService.ListJobs", &jreq.base,
                    &kolo__list_jobs_reply__descriptor, &j, 0);
    if (!code && as_json(&c)) {
        /* jobs, hosts: the array; status: {"coordinator", "hosts", "jobs"} */
        struct buf b = {0};
        struct jw w;
        jw_init(&w, &b);
        if (both) {
            jw_obj_begin(&w);
            jw_kstr(&w, "coordinator", c.url);
            jw_key(&w, "hosts");
        }
        if (h)
            hosts_json(&w, (Kolo__ListHostsReply *)h);
        if (both)
            jw_key(&w, "jobs");
        if (j)
            jobs_json(&w, (Kolo__ListJobsReply *)j);
        if (both)
            jw_obj_end(&w);
        print_json(&b);
    } else if (!code) {
        if (both)
            printf("coordinator %s\n", c.url);
        if (h)
            hosts_table((Kolo__ListHostsReply *)h);
        if (j)
            jobs_table((Kolo__ListJobsReply *)j);
    }
    if (h)
        protobuf_c_message_free_unpacked(h, NULL);
    if (j)
        protobuf_c_message_free_unpacked(j, NULL);
    conn_close(&c, tab, n);
    return code;
}

int cmd_status(int argc, char **argv)
{
    return list_cmd("status",
                    "Shows the coordinator's hosts (state, slots, lease) and its jobs, for a "
                    "person;\n-o json gives both to a script.",
                    true, true, argc, argv);
}

int cmd_jobs(int argc, char **argv)
{
    return list_cmd("jobs",
                    "Lists the coordinator's jobs: id, name, state, live ranks of np, exit code,\n"
                    "submission time and command (-o json: every field of the REST API).",
                    false, true, argc, argv);
}

int cmd_hosts(int argc, char **argv)
{
    return list_cmd("hosts",
                    "Lists the hosts whose agents registered: id, name, address, state (alive,\n"
                    "drained, lost), slots used of slots and the age of their lease.",
                    true, false, argc, argv);
}

/* print_outcome says on stderr how a job ended, as kolo run's last line
 * does: "[kolo] job 7 succeeded (exit code 0)", or with the reason. */
static void print_outcome(uint64_t job, const char *state, int exit_code, const char *reason)
{
    fprintf(stderr, "[kolo] job %llu %s%s%s (exit code %d)\n", (unsigned long long)job, state,
            reason && reason[0] ? ": " : "", reason ? reason : "", exit_code);
}

#define LOGS_WAIT_MS  5000
#define LOGS_RETRY_MS 200 /* between tries while the coordinator is away */

int cmd_logs(int argc, char **argv)
{
    static const char usage[] =
        "usage: kolo logs [-f] [--rank N] [--raw] [--retry-for DURATION] [-o table|json] "
        "[--coordinator URL] [--token-file PATH] JOB";
    struct conn c = {0};
    bool follow = false, raw = false;
    int64_t rank = -1, retry_for = 0;
    struct knob tab[] = {
        CONN_KNOBS(&c),
        OUTPUT_KNOB(&c),
        {"follow", "-f", "", KNOB_BOOL, "false", 0, -1,
         "keep printing new lines until the job ends", &follow},
        {"rank", NULL, "", KNOB_INT, "-1", -1, 1 << 20,
         "only this rank's lines, without the [rank]<stream>: prefix", &rank},
        {"raw", NULL, "", KNOB_BOOL, "false", 0, -1,
         "print the output bytes as they are even on a terminal (by default a terminal gets "
         "control bytes, escape sequences included, as \\xNN)",
         &raw},
        {"retry-for", NULL, "", KNOB_DURATION, "60s", 0, 86400000,
         "with -f, how long to keep reconnecting to a coordinator that went away (a restart) "
         "before giving up",
         &retry_for},
    };
    size_t n = sizeof tab / sizeof tab[0];
    int rest = 0;
    uint64_t job = 0;
    int code = parse("logs", usage,
                     "Prints a job's output so far as kolo run printed it ([rank]<stream>:line);\n"
                     "-f keeps printing until the job ends, then its outcome, across coordinator\n"
                     "restarts.",
                     tab, n, argc, argv, &rest, 1, 1);
    if (code || (code = job_operand("logs", argv[rest], &job)) != 0 ||
        (code = conn_open(&c, "logs")) != 0) {
        conn_close(&c, tab, n);
        return code < 0 ? 0 : code;
    }
    bool esc_out = cli_escape_wanted(stdout, raw), esc_err = cli_escape_wanted(stderr, raw);
    uint64_t after = 0, last_ok = now_mono_ms();
    bool away = false;
    for (;;) {
        Kolo__StreamOutputRequest req = KOLO__STREAM_OUTPUT_REQUEST__INIT;
        req.job_id = job;
        req.after_seq = after;
        req.wait_ms = follow && !away ? LOGS_WAIT_MS : 0;
        req.max_lines = 2000;
        int timeout = (int)c.timeout + (int)req.wait_ms;
        if (away) { /* probe within what is left of --retry-for */
            uint64_t spent = now_mono_ms() - last_ok;
            int64_t left = retry_for - (int64_t)spent;
            timeout = left < LOGS_RETRY_MS ? LOGS_RETRY_MS : left < timeout ? (int)left : timeout;
        }
        ProtobufCMessage *msg = NULL;
        char err[1024];
        int rv = cli_call(c.cli, "AdminService.StreamOutput", &req.base,
                          &kolo__stream_output_reply__descriptor, &msg, timeout, err, sizeof err);
        if (rv && follow && cli_transient(rv)) {
            if (!away) {
                away = true;
                fprintf(stderr,
                        "[kolo] coordinator unreachable (%s); reconnecting for up to %lld s\n", err,
                        (long long)(retry_for / 1000));
            }
            if (now_mono_ms() - last_ok >= (uint64_t)retry_for) {
                fprintf(stderr,
                        "kolo logs: job %llu: giving up: no answer from the coordinator "
                        "for %lld s: %s\n",
                        (unsigned long long)job, (long long)(retry_for / 1000), err);
                code = EXIT_REFUSED;
                break;
            }
            usleep(LOGS_RETRY_MS * 1000);
            continue;
        }
        if (rv) {
            fprintf(stderr, "kolo logs: job %llu: %s\n", (unsigned long long)job, err);
            code = rv == KOLO_ENOTFOUND ? EXIT_NOTFOUND : EXIT_REFUSED;
            break;
        }
        last_ok = now_mono_ms();
        if (away) {
            fprintf(stderr, "[kolo] coordinator reachable again; going on where it left off\n");
            away = false;
        }
        const Kolo__StreamOutputReply *rep = (Kolo__StreamOutputReply *)msg;
        for (size_t i = 0; i < rep->n_lines; i++) {
            const Kolo__OutputLine *l = rep->lines[i];
            bool err_stream = l->stream == KOLO__OUTPUT_STREAM__OUTPUT_STDERR;
            if (rank >= 0 && l->rank != rank)
                continue;
            if (as_json(&c)) { /* JSON Lines, every stream on stdout */
                struct buf b = {0};
                struct jw w;
                jw_init(&w, &b);
                jw_obj_begin(&w);
                jw_kint(&w, "rank", l->rank);
                jw_kstr(&w, "stream", err_stream ? "stderr" : "stdout");
                jw_key(&w, "text");
                jw_strn(&w, (const char *)l->text.data, l->text.len);
                jw_obj_end(&w);
                print_json(&b);
                continue;
            }
            cli_print_job_line(err_stream ? stderr : stdout, l->rank, err_stream, rank < 0,
                               l->text.data, l->text.len, err_stream ? esc_err : esc_out);
        }
        fflush(stdout);
        bool more = rep->next_seq > after && rep->n_lines > 0;
        after = rep->next_seq;
        bool done = rep->done;
        /* -f ends with how the job ended, after its last line */
        if (follow && done && !more)
            print_outcome(job, rep->state, rep->exit_code, rep->reason);
        protobuf_c_message_free_unpacked(msg, NULL);
        /* without -f: until what is stored now is printed; with it: until
         * the job ended and nothing is left */
        if (!more && (!follow || done))
            break;
    }
    conn_close(&c, tab, n);
    return code;
}

/* ---------------------------------------------------------------- stacks */

/* For a person: a header line a rank, then its stacks, indented. */
static void stack_text(const Kolo__WorkerStack *x, bool escape)
{
    printf("rank %d  host %s  pid %d  %s%s%s\n", x->rank, x->host, x->pid, x->proc_state,
           x->wchan[0] ? ", waiting in " : "", x->wchan);
    if (x->pending[0])
        printf("  ops: %s\n", x->pending);
    if (!x->answered) {
        printf("  (no Python stacks: the process did not answer - stopped, in the kernel, or "
               "kolo not imported)\n\n");
        return;
    }
    const char *t = x->text;
    while (*t) {
        size_t len = strcspn(t, "\n");
        fputs("  ", stdout);
        cli_write_text(stdout, t, len, escape);
        fputc('\n', stdout);
        t += len + (t[len] == '\n');
    }
    fputc('\n', stdout);
}

int cmd_stacks(int argc, char **argv)
{
    static const char usage[] = "usage: kolo stacks [--rank N] [-o table|json] [--coordinator URL] "
                                "[--token-file PATH] JOB";
    struct conn c = {0};
    int64_t rank = -1;
    struct knob tab[] = {
        CONN_KNOBS(&c),
        OUTPUT_KNOB(&c),
        {"rank", NULL, "", KNOB_INT, "-1", -1, INT32_MAX, "that rank only (-1: every rank)",
         &rank},
    };
    size_t n = sizeof tab / sizeof tab[0];
    int rest = 0;
    uint64_t job = 0;
    int code = parse("stacks", usage,
                     "Shows what every rank of a running job is doing now: its Python stacks,\n"
                     "its process's state and wait channel, its part in a stall.",
                     tab, n, argc, argv, &rest, 1, 1);
    if (code || (code = job_operand("stacks", argv[rest], &job)) != 0 ||
        (code = conn_open(&c, "stacks")) != 0) {
        conn_close(&c, tab, n);
        return code < 0 ? 0 : code;
    }
    Kolo__StacksRequest req = KOLO__STACKS_REQUEST__INIT;
    req.job_id = job;
    req.wait_ms = 3000;
    ProtobufCMessage *msg = NULL;
    code = call(&c, "stacks", job, "AdminService.Stacks", &req.base,
                &kolo__stacks_reply__descriptor, &msg, 3000 + (int)c.timeout);
    if (!code) {
        const Kolo__StacksReply *rep = (const Kolo__StacksReply *)msg;
        bool escape = cli_escape_wanted(stdout, false);
        struct buf b = {0};
        struct jw w;
        if (as_json(&c)) {
            jw_init(&w, &b);
            coord_stacks_json(&w, job, rep, (int)rank);
            print_json(&b);
        } else {
            if (rep->reason[0]) {
                time_t t = (time_t)(rep->taken_ms / 1000);
                struct tm tm;
                char when[32] = "";
                if (localtime_r(&t, &tm))
                    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
                printf("%s by kolo %s, %s\n", rep->kept ? "the job's last stacks, taken" : "taken",
                       rep->reason, when);
                if (rep->verdict[0])
                    printf("verdict: %s\n", rep->verdict);
                fputc('\n', stdout);
            }
            for (size_t i = 0; i < rep->n_workers; i++)
                if (rank < 0 || rep->workers[i]->rank == rank)
                    stack_text(rep->workers[i], escape);
        }
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    conn_close(&c, tab, n);
    return code;
}

int cmd_stop(int argc, char **argv)
{
    static const char usage[] =
        "usage: kolo stop [--reason TEXT] [--coordinator URL] [--token-file PATH] JOB";
    struct conn c = {0};
    char *reason = NULL;
    struct knob tab[] = {
        CONN_KNOBS(&c),
        {"reason", NULL, "", KNOB_STR, "stopped with kolo stop", 0, -1,
         "why, for the job's record and the dashboard", &reason},
    };
    size_t n = sizeof tab / sizeof tab[0];
    int rest = 0;
    uint64_t job = 0;
    int code = parse("stop", usage,
                     "Stops a job on every host (SIGTERM, then SIGKILL after the agents' grace)\n"
                     "and records why; prints the job's state.",
                     tab, n, argc, argv, &rest, 1, 1);
    if (code || (code = job_operand("stop", argv[rest], &job)) != 0 ||
        (code = conn_open(&c, "stop")) != 0) {
        conn_close(&c, tab, n);
        return code < 0 ? 0 : code;
    }
    Kolo__StopJobRequest req = KOLO__STOP_JOB_REQUEST__INIT;
    req.job_id = job;
    req.reason = reason;
    ProtobufCMessage *msg = NULL;
    code = call(&c, "stop", job, "AdminService.StopJob", &req.base, &kolo__stop_job_reply__descriptor,
                &msg, 0);
    if (!code) {
        printf("job %llu: %s\n", (unsigned long long)job, ((Kolo__StopJobReply *)msg)->state);
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    conn_close(&c, tab, n);
    return code;
}

static int drain_cmd(const char *cmd, const char *about, bool undrain, int argc, char **argv)
{
    char usage[160];
    snprintf(usage, sizeof usage,
             "usage: kolo %s [--coordinator URL] [--token-file PATH] [-o table|json] HOST", cmd);
    struct conn c = {0};
    struct knob tab[] = {CONN_KNOBS(&c), OUTPUT_KNOB(&c)};
    size_t n = sizeof tab / sizeof tab[0];
    int rest = 0;
    int code = parse(cmd, usage, about, tab, n, argc, argv, &rest, 1, 1);
    if (code || (code = conn_open(&c, cmd)) != 0) {
        conn_close(&c, tab, n);
        return code < 0 ? 0 : code;
    }
    Kolo__DrainHostRequest req = KOLO__DRAIN_HOST_REQUEST__INIT;
    req.host = argv[rest];
    req.undrain = undrain;
    ProtobufCMessage *msg = NULL;
    code = call(&c, cmd, 0, "AdminService.DrainHost", &req.base, &kolo__host_info__descriptor,
                &msg, 0);
    if (!code) {
        /* the host, as kolo hosts shows it */
        Kolo__HostInfo *h = (Kolo__HostInfo *)msg;
        Kolo__ListHostsReply one = KOLO__LIST_HOSTS_REPLY__INIT;
        one.n_hosts = 1;
        one.hosts = &h;
        if (as_json(&c)) {
            struct buf b = {0};
            struct jw w;
            jw_init(&w, &b);
            hosts_json(&w, &one);
            print_json(&b);
        } else {
            hosts_table(&one);
        }
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    conn_close(&c, tab, n);
    return code;
}

int cmd_drain(int argc, char **argv)
{
    return drain_cmd("drain",
                     "Drains a host (by id or name): no new job or rank is placed there and\n"
                     "elastic jobs leave it at their next commit; kolo undrain HOST undoes it.",
                     false, argc, argv);
}

int cmd_undrain(int argc, char **argv)
{
    return drain_cmd("undrain",
                     "Makes a drained host (by id or name) usable again and places the jobs that\n"
                     "wait for its slots.",
                     true, argc, argv);
}

/* What kolo attach prints when Ctrl-C (or SIGTERM) ends it, made before
 * the handler is set: the handler may only write and exit. */
static char attach_note[192];
static size_t attach_note_len;

static void attach_interrupted(int sig)
{
    ssize_t w = write(STDERR_FILENO, attach_note, attach_note_len);
    (void)w;
    _exit(128 + sig);
}

int cmd_attach(int argc, char **argv)
{
    static const char usage[] =
        "usage: kolo attach [--raw] [--coordinator URL] [--token-file PATH] JOB";
    struct conn c = {0};
    bool raw = false;
    struct knob tab[] = {
        CONN_KNOBS(&c),
        {"raw", NULL, "", KNOB_BOOL, "false", 0, -1,
         "print the output bytes as they are even on a terminal", &raw},
    };
    size_t n = sizeof tab / sizeof tab[0];
    int rest = 0;
    uint64_t job = 0;
    int code = parse("attach", usage,
                     "Follows a job (one submitted with kolo run --detach) as kolo run would:\n"
                     "its output and what the coordinator tells, then exits with its exit code.\n"
                     "Ctrl-C stops following; the job goes on.",
                     tab, n, argc, argv, &rest, 1, 1);
    if (code || (code = job_operand("attach", argv[rest], &job)) != 0 ||
        (code = conn_open(&c, "attach")) != 0) {
        conn_close(&c, tab, n);
        return code < 0 ? 0 : code;
    }
    Kolo__GetJobRequest req = KOLO__GET_JOB_REQUEST__INIT;
    req.job_id = job;
    ProtobufCMessage *msg = NULL;
    code = call(&c, "attach", job, "AdminService.GetJob", &req.base, &kolo__job_info__descriptor,
                &msg, 0);
    if (!code) {
        protobuf_c_message_free_unpacked(msg, NULL);
        /* Ctrl-C leaves the job running: only kolo run stops what it
         * started. Say so, and how to find the job again. */
        int len =
            snprintf(attach_note, sizeof attach_note,
                     "\n[kolo] stopped following job %llu; it goes on (kolo attach %llu "
                     "follows it again, kolo stop %llu stops it)\n",
                     (unsigned long long)job, (unsigned long long)job, (unsigned long long)job);
        attach_note_len = len > 0 && (size_t)len < sizeof attach_note ? (size_t)len : 0;
        struct sigaction sa = {.sa_handler = attach_interrupted};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        code = run_follow(c.cli, job, 0, NULL, raw, false);
    }
    conn_close(&c, tab, n);
    return code;
}

/* ---------------------------------------------------------------- top */

static int by_cost(const void *a, const void *b)
{
    const Kolo__RankView *x = *(Kolo__RankView *const *)a, *y = *(Kolo__RankView *const *)b;
    if (x->cost != y->cost)
        return x->cost < y->cost ? 1 : -1; /* costliest first; unknown (-1) last */
    return x->rank - y->rank;
}

static void fmt_secs(char *out, size_t size, double s)
{
    if (s < 0)
        snprintf(out, size, "-");
    else if (s < 1)
        snprintf(out, size, "%.1f ms", s * 1e3);
    else
        snprintf(out, size, "%.2f s", s);
}

/* One screen of kolo top: the ranks, costliest first. */
static void top_table(const Kolo__GetRanksReply *rep)
{
    char med[32];
    fmt_secs(med, sizeof med, rep->step_s);
    printf("job %llu  %s  generation %llu  %zu rank(s)  median step %s\n\n",
           (unsigned long long)rep->job_id, rep->state, (unsigned long long)rep->generation,
           rep->n_ranks, med);
    printf("%5s  %-16s %-9s %8s %10s %10s %7s %8s %5s %5s  %s\n", "RANK", "HOST", "STATE", "PID",
           "STEP", "LAG", "COST", "COMPUTE", "WAIT", "DATA", "EPOCH");
    Kolo__RankView **v = malloc((rep->n_ranks ? rep->n_ranks : 1) * sizeof *v);
    if (!v)
        return;
    memcpy(v, rep->ranks, rep->n_ranks * sizeof *v);
    qsort(v, rep->n_ranks, sizeof *v, by_cost);
    for (size_t i = 0; i < rep->n_ranks; i++) {
        char step[32], lag[32], cost[16], epoch[24], share[3][16];
        const double parts[3] = {v[i]->compute, v[i]->wait, v[i]->data};
        for (int k = 0; k < 3; k++) {
            if (parts[k] < 0)
                snprintf(share[k], sizeof share[k], "-");
            else
                snprintf(share[k], sizeof share[k], "%.0f %%", parts[k] * 100);
        }
        fmt_secs(step, sizeof step, v[i]->step_s);
        fmt_secs(lag, sizeof lag, v[i]->lag_s);
        if (v[i]->cost < 0)
            snprintf(cost, sizeof cost, "-");
        else
            snprintf(cost, sizeof cost, "%.0f %%", v[i]->cost * 100);
        if (v[i]->epoch < 0)
            snprintf(epoch, sizeof epoch, "-");
        else
            snprintf(epoch, sizeof epoch, "%lld", (long long)v[i]->epoch);
        printf("%5d  %-16.16s %-9s %8d %10s %10s %7s %8s %5s %5s  %s%s\n", v[i]->rank,
               v[i]->host, v[i]->state, v[i]->pid, step, lag, cost, share[0], share[1], share[2],
               epoch, v[i]->straggler ? "  straggler" : "");
    }
    free(v);
}

static void top_json(const Kolo__GetRanksReply *rep)
{
    struct buf b = {0};
    struct jw w;
    jw_init(&w, &b);
    jw_obj_begin(&w);
    jw_kuint(&w, "job", rep->job_id);
    jw_kuint(&w, "generation", rep->generation);
    jw_kstr(&w, "state", rep->state);
    jw_kdouble(&w, "step_s", rep->step_s >= 0 ? rep->step_s : NAN);
    jw_key(&w, "ranks");
    jw_arr_begin(&w);
    for (size_t i = 0; i < rep->n_ranks; i++) {
        const Kolo__RankView *v = rep->ranks[i];
        jw_obj_begin(&w);
        jw_kint(&w, "rank", v->rank);
        jw_kstr(&w, "host", v->host);
        jw_kstr(&w, "state", v->state);
        jw_kint(&w, "pid", v->pid);
        jw_kdouble(&w, "step_s", v->step_s >= 0 ? v->step_s : NAN);
        jw_kdouble(&w, "lag_s", v->lag_s >= 0 ? v->lag_s : NAN);
        jw_kdouble(&w, "cost", v->cost >= 0 ? v->cost : NAN);
        jw_kbool(&w, "straggler", v->straggler);
        jw_kdouble(&w, "compute", v->compute >= 0 ? v->compute : NAN);
        jw_kdouble(&w, "wait", v->wait >= 0 ? v->wait : NAN);
        jw_kdouble(&w, "data", v->data >= 0 ? v->data : NAN);
        jw_kdouble(&w, "overlap", v->overlap >= 0 ? v->overlap : NAN);
        jw_kint(&w, "epoch", v->epoch);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    print_json(&b);
}

static volatile sig_atomic_t top_stop;

static void top_interrupted(int sig)
{
    (void)sig;
    top_stop = 1;
}

int cmd_top(int argc, char **argv)
{
    static const char usage[] = "usage: kolo top [--interval D] [--once] [-o table|json] "
                                "[--coordinator URL] [--token-file PATH] JOB";
    struct conn c = {0};
    int64_t interval = 0;
    bool once = false;
    struct knob tab[] = {
        CONN_KNOBS(&c),
        OUTPUT_KNOB(&c),
        {"interval", NULL, "", KNOB_DURATION, "1s", 100, 3600000, "time between refreshes",
         &interval},
        {"once", NULL, "", KNOB_BOOL, "false", 0, -1, "print one screen and exit (-o json: always)",
         &once},
    };
    size_t n = sizeof tab / sizeof tab[0];
    int rest = 0;
    uint64_t job = 0;
    int code = parse("top", usage,
                     "Shows a job's ranks, refreshed, costliest first: each one's latest step\n"
                     "time, how long the others wait for it (lag) and what that costs the job's\n"
                     "steps (cost: the share of a step spent waiting for it beyond the median\n"
                     "rank), stragglers marked. Ctrl-C ends it; the job goes on.",
                     tab, n, argc, argv, &rest, 1, 1);
    if (code || (code = job_operand("top", argv[rest], &job)) != 0 ||
        (code = conn_open(&c, "top")) != 0) {
        conn_close(&c, tab, n);
        return code < 0 ? 0 : code;
    }
    bool tty = isatty(STDOUT_FILENO) && !as_json(&c);
    once = once || as_json(&c);
    struct sigaction sa = {.sa_handler = top_interrupted};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    while (!top_stop) {
        Kolo__GetRanksRequest req = KOLO__GET_RANKS_REQUEST__INIT;
        req.job_id = job;
        ProtobufCMessage *msg = NULL;
        code = call(&c, "top", job, "AdminService.GetRanks", &req.base,
                    &kolo__get_ranks_reply__descriptor, &msg, 0);
        if (code)
            break;
        const Kolo__GetRanksReply *rep = (const Kolo__GetRanksReply *)msg;
        bool ended = strcmp(rep->state, "running") != 0 && strcmp(rep->state, "pending") != 0;
        if (tty)
            fputs("\033[H\033[2J", stdout); /* home, clear */
        if (as_json(&c))
            top_json(rep);
        else
            top_table(rep);
        fflush(stdout);
        protobuf_c_message_free_unpacked(msg, NULL);
        if (once || ended)
            break;
        if (!tty)
            fputc('\n', stdout);
        for (int64_t slept = 0; slept < interval && !top_stop; slept += 100)
            usleep(100 * 1000);
    }
    conn_close(&c, tab, n);
    return code;
}
