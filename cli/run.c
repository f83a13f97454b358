/*
 * run.c - `kolo run`, the user's entry point, shaped like horovodrun.
 *
 *   kolo run -np 4 [-H host1:2,host2:2] [--coordinator tcp://HOST:PORT] -- python train.py
 *
 * Without --coordinator it starts an embedded coordinator and agent on
 * loopback (database under the state directory, one file per run so
 * concurrent runs never share state), submits the job, streams every
 * worker's output as "[rank]<stdout>:line", and exits with the job's exit
 * code. SIGINT or SIGTERM stops the job on every host and waits (bounded)
 * until the workers are gone; a second one stops waiting.
 *
 * horovodrun's flags are accepted as well (run_flags.c); the variables they
 * set reach the workers through the job's environment, which is the
 * submitter's (less what env_passes drops) with those variables on top.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "coord.h"
#include "errors.h"
#include "json.h"
#include "knobs.h"
#include "kolo.pb-c.h"
#include "log.h"
#include "run.h"
#include "tls.h"
#include "util.h"

#define RUNS_KEPT      20
#define STREAM_WAIT_MS 500
#define COORD_RETRY_MS 60000

#define RUN_USAGE                                                                                  \
    "usage: kolo run -np N [-H host1:slots,host2:slots | --hostfile FILE]\n"                       \
    "                [--coordinator tcp://HOST:PORT] [options] [--] command [args...]\n"           \
    "       kolo run --version | --check-build"

static const char usage[] = RUN_USAGE;

/* --help adds to the usage that horovodrun's flags work too. */
static const char help_head[] =
    RUN_USAGE "\n\n"
              "horovodrun's flags work too: `horovodrun -np 4 -H a:2,b:2 python train.py` runs as\n"
              "`kolo run -np 4 -H a:2,b:2 python train.py`. Flags that set Horovod variables put\n"
              "them in the job's environment, over the inherited ones (docs/cli.md).";

extern char **environ;

/* metadata_parse turns --metadata's JSON object of strings into "key=value"
 * entries (the coordinator checks keys and sizes). */
static int metadata_parse(const char *text, char ***out, int *n, char *err, size_t errlen)
{
    struct json *root = NULL;
    char why[128] = "";
    const char *bad = NULL;
    int rc = json_parse(text, strlen(text), &root, why, sizeof why) != 0
                 ? KOLO_EINVAL
                 : json_strings_kv(root, out, n, &bad);
    if (rc == KOLO_ENOMEM)
        snprintf(err, errlen, "out of memory");
    else if (rc && bad)
        snprintf(err, errlen, "the value of \"%.64s\" is not a string", bad);
    else if (rc)
        snprintf(err, errlen, "want a JSON object of strings such as '{\"team\": \"vision\"}'%s%s",
                 why[0] ? ": " : "", why);
    json_free(root);
    return rc;
}

static atomic_int stop_signal;
static atomic_int stop_count;

/* The embedded coordinator's secret when the user gave no token: 32
 * random bytes, also written to DB.token (0600, removed at exit) so the
 * user can reach the coordinator with --token-file while the run lasts. */
static int run_secret(const char *db, char **token, char *path, size_t pathlen, char *err,
                      size_t errlen)
{
    char hex[65];
    if (random_hex(hex, 32) != 0) {
        snprintf(err, errlen, "cannot draw a random token for the embedded coordinator");
        return KOLO_ESYS;
    }
    snprintf(path, pathlen, "%s.token", db);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, hex, 64) != 64 || write(fd, "\n", 1) != 1) {
        snprintf(err, errlen, "cannot write the run's token file %s: %s", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        path[0] = '\0';
        return KOLO_EIO;
    }
    close(fd);
    if ((*token = strdup(hex)) == NULL) {
        unlink(path);
        path[0] = '\0';
        return KOLO_ENOMEM;
    }
    memset(hex, 0, sizeof(hex));
    return 0;
}

static void on_stop_signal(int sig)
{
    atomic_store(&stop_signal, sig);
    atomic_fetch_add(&stop_count, 1);
}

/* Variables a worker must not inherit from the submitter (horovodrun
 * drops the same kind): secrets, shell leftovers, per-process identity. */
static bool env_passes(const char *entry)
{
    static const char *drop_prefix[] = {"KOLO_TOKEN=",
                                        "HOROVOD_SECRET_KEY=",
                                        "OLDPWD=",
                                        "BASH_FUNC_",
                                        "_=",
                                        "KOLO_RANK=",
                                        "KOLO_SIZE=",
                                        "KOLO_LOCAL_",
                                        "KOLO_CROSS_",
                                        "KOLO_JOB=",
                                        "KOLO_GENERATION=",
                                        "KOLO_AGENT_PID=",
                                        "HOROVOD_RANK=",
                                        "HOROVOD_SIZE=",
                                        "HOROVOD_LOCAL_",
                                        "HOROVOD_CROSS_",
                                        "HOROVOD_HOSTNAME="};
    for (size_t i = 0; i < sizeof(drop_prefix) / sizeof(drop_prefix[0]); i++)
        if (strncmp(entry, drop_prefix[i], strlen(drop_prefix[i])) == 0)
            return false;
    const char *eq = strchr(entry, '=');
    if (!eq)
        return false;
    size_t nlen = (size_t)(eq - entry), suf = strlen("CUDA_VISIBLE_DEVICES");
    if (nlen >= suf && strncmp(eq - suf, "CUDA_VISIBLE_DEVICES", suf) == 0)
        return false;
    return true;
}

/* Keeps the newest RUNS_KEPT run databases. Names sort by start time. */
static void prune_runs(const char *dir)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort);
    int dbs = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(names[i]->d_name);
        if (strncmp(names[i]->d_name, "run-", 4) == 0 && len > 3 &&
            strcmp(names[i]->d_name + len - 3, ".db") == 0)
            dbs++;
    }
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        size_t len = strlen(nm);
        if (dbs > RUNS_KEPT && strncmp(nm, "run-", 4) == 0 && len > 3 &&
            strcmp(nm + len - 3, ".db") == 0) {
            static const char *sfx[] = {"", "-wal", "-shm", ".token"};
            for (int k = 0; k < 4; k++) {
                char *path = NULL;
                if (asprintf(&path, "%s/%s%s", dir, nm, sfx[k]) > 0)
                    unlink(path);
                free(path);
            }
            dbs--;
        }
        free(names[i]);
    }
    free(names);
}

/* env_overridden says whether entry (NAME=value) sets a variable that one
 * of set (NAME=value strings, NULL-terminated) sets too. */
static bool env_overridden(const char *entry, char *const *set)
{
    size_t len = strcspn(entry, "=");
    for (size_t i = 0; set && set[i]; i++)
        if (strncmp(entry, set[i], len) == 0 && set[i][len] == '=')
            return true;
    return false;
}

/* ---- issue 6: per-epoch lines (begin) ----
 *
 * Every EPOCH_POLL_MS while it streams output, and once more when the job
 * is done, kolo run asks the coordinator (AdminService.GetEpochs) for the
 * epochs after the last one it printed, and prints each one that every
 * rank has reported the end of (or, once the job is done, that any rank
 * has), in order:
 *   [kolo] epoch 3: 4.21 s, 1520 samples/s, loss 0.2310
 * A coordinator that does not know GetEpochs (an older one) or fails to
 * answer costs nothing but the lines. */
#define EPOCH_POLL_MS 1000

/* Appends to line (of size size, holding *n bytes), never past its end. */
static void line_add(char *line, size_t size, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void line_add(char *line, size_t size, size_t *n, const char *fmt, ...)
{
    if (*n >= size - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line + *n, size - *n, fmt, ap);
    va_end(ap);
    if (k > 0)
        *n = *n + (size_t)k < size ? *n + (size_t)k : size - 1;
}

static void print_epoch(const Kolo__EpochSummary *e)
{
    char line[256];
    size_t n = 0;
    line_add(line, sizeof line, &n, "[kolo] epoch %lld:", (long long)e->epoch);
    if (e->wall_s >= 0)
        line_add(line, sizeof line, &n, " %.2f s", e->wall_s);
    else
        line_add(line, sizeof line, &n, " ? s");
    if (e->samples_per_s >= 0 && e->samples > 0)
        line_add(line, sizeof line, &n, ", %.0f samples/s", e->samples_per_s);
    struct json *m = NULL;
    char err[64];
    if (e->metrics_json[0] &&
        json_parse(e->metrics_json, strlen(e->metrics_json), &m, err, sizeof err) == 0) {
        const struct json *loss = json_get(m, "loss");
        if (loss && loss->type == JSON_NUMBER)
            line_add(line, sizeof line, &n,
                     loss->num > -1e9 && loss->num < 1e9 ? ", loss %.4f" : ", loss %.4g",
                     loss->num);
        json_free(m);
    }
    if (!e->complete)
        line_add(line, sizeof line, &n, " (%d of %d ranks reported)", e->ranks_reported,
                 e->ranks_expected);
    if (e->resets > 0)
        line_add(line, sizeof line, &n, " (cut by %d elastic reset%s: the time since the last, "
                 "generation %llu)", e->resets, e->resets == 1 ? "" : "s",
                 (unsigned long long)e->generation);
    fprintf(stderr, "%s\n", line);
}

static void print_epochs(struct rpc_client *cli, uint64_t job_id, int64_t *printed, bool done)
{
    Kolo__GetEpochsRequest req = KOLO__GET_EPOCHS_REQUEST__INIT;
    req.job_id = job_id;
    req.after_epoch = *printed;
    ProtobufCMessage *msg = NULL;
    char err[512];
    if (cli_call(cli, "AdminService.GetEpochs", &req.base, &kolo__get_epochs_reply__descriptor,
                 &msg, 2000, err, sizeof err) != 0)
        return;
    Kolo__GetEpochsReply *rep = (Kolo__GetEpochsReply *)msg;
    for (size_t i = 0; i < rep->n_epochs; i++) {
        const Kolo__EpochSummary *e = rep->epochs[i];
        /* an epoch of a generation that is gone gets no more reports */
        bool later_gen = i + 1 < rep->n_epochs && rep->epochs[i + 1]->generation > e->generation;
        bool ended = e->ranks_reported > 0, over = done || rep->job_done || later_gen;
        if (!e->complete && !over)
            break; /* in order: wait for this one */
        if (ended)
            print_epoch(e); /* a job that ended may leave epochs only started */
        *printed = e->epoch;
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}
/* ---- issue 6: per-epoch lines (end) ---- */

/* The notices --quiet leaves out: elastic events the job recovers from
 * by itself. Stalls, verdicts and what stops a job still print. */
static bool quiet_kind(const char *kind)
{
    static const char *const elastic[] = {
        "worker.failed",    "worker.frozen",   "job.generation", "job.waiting", "job.hosts_updated",
        "host.excluded",    "host.readmitted", "job.resumed",    "job.cache_reset",
        "job.recovered",    "job.spares",      "worker.spare_lost",
    };
    for (size_t i = 0; i < sizeof elastic / sizeof elastic[0]; i++)
        if (strcmp(kind, elastic[i]) == 0)
            return true;
    return false;
}

int run_follow(struct rpc_client *cli, uint64_t job_id, int64_t grace, struct run_output *files,
               bool raw, bool quiet)
{
    bool esc_out = cli_escape_wanted(stdout, raw), esc_err = cli_escape_wanted(stderr, raw);
    uint64_t after = 0;
    char last_reason[512] = "";
    char err[1024];
    uint64_t unreachable_since = 0, stop_sent_at = 0;
    int handled_stops = 0;
    int64_t epochs_printed = -1; /* issue 6 */
    uint64_t after_notice = 0;
    uint64_t epochs_polled = 0;
    for (;;) {
        int stops = atomic_load(&stop_count);
        if (stops > handled_stops) {
            if (stops >= 2) {
                fprintf(stderr, "[kolo] interrupted again: not waiting for job %llu to stop\n",
                        (unsigned long long)job_id);
                return 128 + atomic_load(&stop_signal);
            }
            handled_stops = stops;
            Kolo__StopJobRequest sreq = KOLO__STOP_JOB_REQUEST__INIT;
            char reason[64];
            snprintf(reason, sizeof(reason), "interrupted by signal %d in kolo run",
                     atomic_load(&stop_signal));
            sreq.job_id = job_id;
            sreq.reason = reason;
            ProtobufCMessage *srep = NULL;
            fprintf(stderr, "[kolo] stopping job %llu\n", (unsigned long long)job_id);
            if (cli_call(cli, "AdminService.StopJob", &sreq.base, &kolo__stop_job_reply__descriptor,
                         &srep, 5000, err, sizeof(err)) == 0)
                protobuf_c_message_free_unpacked(srep, NULL);
            else if (!strstr(err, "ended"))
                fprintf(stderr, "[kolo] cannot stop job %llu: %s\n", (unsigned long long)job_id,
                        err);
            stop_sent_at = now_mono_ms();
        }
        if (stop_sent_at && now_mono_ms() - stop_sent_at > (uint64_t)grace + 10000) {
            fprintf(stderr, "[kolo] job %llu did not stop in time\n", (unsigned long long)job_id);
            return 128 + atomic_load(&stop_signal);
        }

        Kolo__StreamOutputRequest req = KOLO__STREAM_OUTPUT_REQUEST__INIT;
        req.job_id = job_id;
        req.after_seq = after;
        req.wait_ms = STREAM_WAIT_MS;
        req.max_lines = 2000;
        req.notices = true;
        req.after_notice = after_notice;
        ProtobufCMessage *msg = NULL;
        int rv = cli_call(cli, "AdminService.StreamOutput", &req.base,
                          &kolo__stream_output_reply__descriptor, &msg, STREAM_WAIT_MS + 5000, err,
                          sizeof(err));
        if (cli_transient(rv)) {
            /* The coordinator may be restarting: the job lives on in its
             * database. Keep asking for a while. */
            if (!unreachable_since) {
                unreachable_since = now_mono_ms();
                fprintf(stderr, "[kolo] coordinator unreachable (%s); retrying\n", err);
            } else if (now_mono_ms() - unreachable_since > COORD_RETRY_MS) {
                fprintf(stderr, "[kolo] giving up on the coordinator: %s\n", err);
                return 1;
            }
            usleep(200000);
            continue;
        }
        if (rv != 0) {
            fprintf(stderr, "[kolo] cannot follow job %llu: %s\n", (unsigned long long)job_id, err);
            return 1;
        }
        if (unreachable_since) {
            fprintf(stderr, "[kolo] coordinator reachable again\n");
            unreachable_since = 0;
        }
        Kolo__StreamOutputReply *rep = (Kolo__StreamOutputReply *)msg;
        for (size_t i = 0; i < rep->n_lines; i++) {
            Kolo__OutputLine *l = rep->lines[i];
            bool err_stream = l->stream == KOLO__OUTPUT_STREAM__OUTPUT_STDERR;
            cli_print_job_line(err_stream ? stderr : stdout, l->rank, err_stream, true,
                               l->text.data, l->text.len, err_stream ? esc_err : esc_out);
            run_output_write(files, l->rank, err_stream, l->text.data, l->text.len);
        }
        fflush(stdout);
        /* what the coordinator tells: a stall naming its ranks and
         * tensors, a worker lost, an elastic reset (coord_event_notice) */
        for (size_t i = 0; i < rep->n_notices; i++) {
            const char *text = rep->notices[i]->message; /* may quote a tensor's name */
            if (quiet && quiet_kind(rep->notices[i]->kind))
                continue;
            fputs("[kolo] ", stderr);
            cli_write_text(stderr, text, strlen(text), esc_err);
            fputc('\n', stderr);
        }
        if (rep->next_notice > after_notice)
            after_notice = rep->next_notice;
        if (rep->next_seq > after)
            after = rep->next_seq;
        if (rep->done || now_mono_ms() - epochs_polled >= EPOCH_POLL_MS) { /* issue 6 */
            print_epochs(cli, job_id, &epochs_printed, rep->done);
            epochs_polled = now_mono_ms();
        }
        if (strcmp(rep->state, "pending") == 0 && strcmp(rep->reason, last_reason) != 0) {
            fprintf(stderr, "[kolo] job %llu pending: %s\n", (unsigned long long)job_id,
                    rep->reason);
            str_copy(last_reason, rep->reason, sizeof(last_reason));
        }
        if (rep->done) {
            int code = rep->exit_code;
            if (strcmp(rep->state, "succeeded") != 0)
                fprintf(stderr, "[kolo] job %llu %s: %s (exit code %d)\n",
                        (unsigned long long)job_id, rep->state, rep->reason, rep->exit_code);
            if (strcmp(rep->state, "failed") == 0 && code == 0)
                code = 1;
            protobuf_c_message_free_unpacked(msg, NULL);
            if (handled_stops)
                return 128 + atomic_load(&stop_signal);
            return code;
        }
        protobuf_c_message_free_unpacked(msg, NULL);
    }
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o = {0};
    struct knob tab[RUN_MAX_KNOBS];
    size_t n = run_flags_table(tab, &o);
    char err[1024];
    int rest = 0;
    /* horovodrun takes --blacklist-cooldown-range as two words: join them. */
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    char joined[64] = "";
    int nargs = 0;
    for (int i = 0; args && i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            while (i < argc)
                args[nargs++] = argv[i++];
            break;
        }
        args[nargs++] = argv[i];
        if (strcmp(argv[i], "--blacklist-cooldown-range") == 0 && i + 2 < argc &&
            strchr("0123456789", argv[i + 2][0]) && argv[i + 2][0]) {
            snprintf(joined, sizeof(joined), "%s %s", argv[i + 1], argv[i + 2]);
            args[nargs++] = joined;
            i += 2;
        }
    }
    if (!args) {
        fprintf(stderr, "kolo run: out of memory\n");
        return 1;
    }
    argc = nargs;
    argv = args;
    int rv = knobs_parse(tab, n, argc, argv, &rest, help_head, stdout, err, sizeof(err));
    if (rv == KNOBS_HELP || rv == KNOBS_DUMPED) {
        knobs_free(tab, n);
        return 0;
    }
    if (rv == KNOBS_OK && (o.version || o.check_build)) {
        if (o.version)
            printf("kolo %s\n", KOLO_VERSION);
        else
            run_print_check_build(stdout);
        knobs_free(tab, n);
        return 0;
    }
    if (rv == KNOBS_OK && run_flags_finish(tab, n, &o, err, sizeof(err)) != 0)
        rv = KNOBS_ERROR;
    if (rv != KNOBS_OK) {
        fprintf(stderr, "kolo run: %s%s\n%s\n", err,
                strncmp(err, "np: ", 4) == 0 ? "; a job needs at least one worker process" : "",
                usage);
        knobs_free(tab, n);
        return 2;
    }
    if (o.np < 1 || rest >= argc) {
        fprintf(stderr, "kolo run: %s\n%s\n", o.np < 1 ? "-np is required" : "no command given",
                usage);
        knobs_free(tab, n);
        return 2;
    }
    log_set_level(run_flags_log_level(&o));

    char *token = NULL;
    char run_token_path[4300] = "";
    if (cli_token(o.token_file, &token, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo run: %s\n", err);
        knobs_free(tab, n);
        return 1;
    }
    struct tls_files tls;
    if (tls_files_init(&tls, o.tls_cert, o.tls_key, o.tls_ca, o.tls_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo run: %s\n", err);
        free(token);
        knobs_free(tab, n);
        return 2;
    }

    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct coord *coord = NULL;
    struct agent *agent = NULL;
    struct rpc_client *cli = NULL;
    struct run_output *files = NULL;
    char **flag_env = NULL;
    char *state_dir = NULL;
    const char *url = o.coordinator;
    int code = 1;
    struct slurm_alloc alloc = {0};

    if (o.output_filename &&
        run_output_open(&files, o.output_filename, (int)o.np, err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo run: --output-filename: %s\n", err);
        goto out;
    }
    flag_env = run_job_env(tab, n, &o);
    if (!flag_env) {
        fprintf(stderr, "kolo run: out of memory\n");
        goto out;
    }

    if (o.slurm && slurm_detect(&alloc, err, sizeof err) != 0) {
        fprintf(stderr, "kolo run: --slurm: %s\n", err);
        code = 2;
        goto out;
    }
    if (!url || !url[0]) {
        state_dir = o.state_dir ? strdup(o.state_dir) : cli_state_dir();
        char runs[4096], db[4200], agent_dir[4200];
        snprintf(runs, sizeof(runs), "%s/runs", state_dir);
        if (mkdir_p(runs) != 0) {
            fprintf(stderr, "kolo run: cannot create %s: %s\n", runs, strerror(errno));
            goto out;
        }
        prune_runs(runs);
        snprintf(db, sizeof(db), "%s/run-%013llu-%d.db", runs, (unsigned long long)now_wall_ms(),
                 (int)getpid());
        /* Loopback is not a trust boundary on a shared host: without a
         * token of the user's, the embedded coordinator gets a secret of
         * this run, so that only this user's processes (the agent, the
         * workers, whoever can read the 0600 file) can submit or act. */
        if (!token && run_secret(db, &token, run_token_path, sizeof(run_token_path), err,
                                 sizeof(err)) != 0) {
            fprintf(stderr, "kolo run: %s\n", err);
            goto out;
        }
        snprintf(agent_dir, sizeof(agent_dir), "%s/agent-localhost", state_dir);
        /* on Slurm the nodes' agents must reach it: not loopback */
        char listen[96] = "tcp://127.0.0.1:0";
        if (o.slurm)
            slurm_listen_url(listen, sizeof listen);
        struct coord_config cc = {
            .listen = listen,
            .http = o.http,
            .db_path = db,
            .token = token,
            .lease_ms = 5000,
            .heartbeat_ms = 1000,
            .stop_grace_ms = o.grace,
            .tls = &tls,
        };
        if (coord_start(&coord, &cc, err, sizeof(err)) != 0) {
            fprintf(stderr, "kolo run: cannot start the embedded coordinator: %s\n", err);
            goto out;
        }
        if (o.slurm) {
            /* one agent per node of the allocation, each its own srun step */
            const char *tf = o.token_file ? o.token_file : run_token_path;
            if (slurm_agents_start(&alloc, coord_rpc_url(coord), tf, o.grace,
                                   o.verbose ? "info" : "warn", err, sizeof err) != 0) {
                fprintf(stderr, "kolo run: %s\n", err);
                goto out;
            }
            fprintf(stderr, "[kolo] Slurm job %s: one agent per node on %d node(s) (srun), "
                    "coordinator %s\n", alloc.job_id, alloc.nnodes, coord_rpc_url(coord));
        } else {
            /* one agent here, with a slot per CPU (or per rank) */
            long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
            int slots = (int)o.slots;
            if (slots <= 0)
                slots = (int)(o.np > ncpu ? o.np : ncpu);
            if (o.slots == 0 && o.max_np > slots)
                slots = (int)o.max_np;
            if (o.slots == 0 && (o.max_np > o.np ? o.max_np : o.np) + o.spares > slots)
                slots = (int)((o.max_np > o.np ? o.max_np : o.np) + o.spares); /* and the spares */
            struct agent_config ac = {
                .coordinator_url = coord_rpc_url(coord),
                .token = token,
                .name = "localhost",
                .addr = "127.0.0.1",
                .state_dir = agent_dir,
                .slots = slots,
                .stop_grace_ms = o.grace,
                .exec_path = "/proc/self/exe",
                .tls = &tls,
            };
            if (agent_start(&agent, &ac, err, sizeof(err)) != 0) {
                fprintf(stderr, "kolo run: cannot start the embedded agent: %s\n", err);
                goto out;
            }
        }
        url = coord_rpc_url(coord);
        if (coord_http_url(coord)[0])
            fprintf(stderr, "[kolo] embedded coordinator %s, dashboard %s/?key=%s (state %s%s%s)\n",
                    url, coord_http_url(coord), coord_dashboard_key(coord), db,
                    run_token_path[0] ? ", token " : "", run_token_path);
    }

    if (cli_connect(&cli, url, token, &tls, "kolo-run", err, sizeof(err)) != 0) {
        fprintf(stderr, "kolo run: %s\n", err);
        goto out;
    }
    if (alloc.srun) {
        if (slurm_agents_wait(cli, &alloc, 60000, err, sizeof err) != 0) {
            fprintf(stderr, "kolo run: %s\n", err);
            goto out;
        }
        if (!o.hosts && !(o.hosts = slurm_hosts(&alloc))) {
            fprintf(stderr, "kolo run: out of memory\n");
            goto out;
        }
    }
    /* the workers import the package of this build (a checkout's
     * python/), unless the user's PYTHONPATH names one */
    cli_use_checkout_python(true);
    Kolo__SubmitJobRequest req = KOLO__SUBMIT_JOB_REQUEST__INIT;
    req.argv = argv + rest;
    req.n_argv = (size_t)(argc - rest);
    size_t nenv = 0, nflag = 0;
    while (environ[nenv])
        nenv++;
    while (flag_env[nflag])
        nflag++;
    char **env = calloc(nenv + nflag + 1, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; env && i < nenv; i++)
        if (env_passes(environ[i]) && !env_overridden(environ[i], flag_env))
            env[k++] = environ[i];
    for (size_t i = 0; env && i < nflag; i++)
        env[k++] = flag_env[i];
    req.env = env;
    req.n_env = k;
    char cwd[4096];
    req.cwd = getcwd(cwd, sizeof(cwd)) ? cwd : "";
    req.np = (int32_t)o.np;
    req.hosts = o.hosts ? o.hosts : "";
    req.name = o.name ? o.name : "";
    req.start_timeout_ms = (uint32_t)o.start_timeout;
    req.elastic = o.elastic;
    req.min_np = (int32_t)o.min_np;
    req.max_np = (int32_t)o.max_np;
    req.reset_limit = (int32_t)o.reset_limit;
    req.cooldown_lo_s = o.cooldown_lo_s;
    req.cooldown_hi_s = o.cooldown_hi_s;
    req.elastic_timeout_ms = (uint32_t)o.elastic_timeout;
    req.discovery_script = o.discovery ? o.discovery : "";
    req.slots_per_host = (int32_t)o.slots;
    char **meta = NULL;
    int nmeta = 0;
    if (o.metadata && metadata_parse(o.metadata, &meta, &nmeta, err, sizeof err) != 0) {
        fprintf(stderr, "kolo run: --metadata: %s\n", err);
        free(env);
        code = 2;
        goto out;
    }
    req.metadata = meta;
    req.n_metadata = (size_t)nmeta;
    req.straggler_policy = o.straggler_policy ? o.straggler_policy : "";
    req.spares = (int32_t)o.spares;
    req.straggler_window_ms = (uint32_t)o.straggler_window;
    ProtobufCMessage *msg = NULL;
    rv = cli_call(cli, "AdminService.SubmitJob", &req.base, &kolo__submit_job_reply__descriptor,
                  &msg, 10000, err, sizeof(err));
    free(env);
    json_kv_free(meta, nmeta);
    if (rv != 0) {
        fprintf(stderr, "kolo run: %s\n", err);
        code = rv == KOLO_EINVAL ? 2 : 1;
        goto out;
    }
    uint64_t job_id = ((Kolo__SubmitJobReply *)msg)->job_id;
    protobuf_c_message_free_unpacked(msg, NULL);
    if (o.verbose)
        fprintf(stderr, "[kolo] job %llu submitted (np %lld)\n", (unsigned long long)job_id,
                (long long)o.np);
    if (coord && coord_http_url(coord)[0])
        fprintf(stderr, "[kolo] job %llu on the dashboard: %s/?key=%s#/jobs/%llu\n",
                (unsigned long long)job_id, coord_http_url(coord), coord_dashboard_key(coord),
                (unsigned long long)job_id);
    if (o.detach) { /* kolo attach JOB follows it later */
        printf("%llu\n", (unsigned long long)job_id);
        code = 0;
        goto out;
    }
    code = run_follow(cli, job_id, o.grace, files, o.raw, o.quiet);
    if (coord && coord_http_url(coord)[0]) {
        /* the link above dies with this process; the database stays */
        const char *db = strrchr(coord_db_path(coord), '/');
        fprintf(stderr, "[kolo] this run's dashboard after it ends: kolo dashboard%s%s %.*s\n",
                o.state_dir ? " --state-dir " : "", o.state_dir ? o.state_dir : "",
                (int)strlen(db + 1) - 3, db + 1);
    }
    if (coord) {
        const char *tl = o.timeline_filename && o.timeline_filename[0]
                             ? o.timeline_filename
                             : timeline_env_path(getenv("HOROVOD_TIMELINE"));
        run_timeline_final(cli, job_id, tl);
    }

out:
    free(args);
    rpc_client_close(cli);
    run_output_close(files);
    run_job_env_free(flag_env);
    if (agent)
        agent_stop(agent);
    slurm_agents_stop(&alloc, o.grace + 10000);
    slurm_alloc_free(&alloc);
    if (coord)
        coord_stop(coord);
    if (run_token_path[0])
        unlink(run_token_path);
    if (token) {
        memset(token, 0, strlen(token));
        free(token);
    }
    free(state_dir);
    knobs_free(tab, n);
    return code;
}
