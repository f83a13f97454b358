/*
 * run_slurm.c - kolo run inside a Slurm allocation (salloc, sbatch).
 *
 * DESIGN. No host list and no SSH: the allocation says where to run.
 * slurm_detect reads it from the environment Slurm sets (SLURM_JOB_ID,
 * SLURM_JOB_NODELIST expanded by `scontrol show hostnames`,
 * SLURM_TASKS_PER_NODE and SLURM_JOB_CPUS_PER_NODE in their "2(x3),1"
 * form). kolo run then starts its embedded coordinator on an address the
 * nodes reach, and one agent per node, each its own job step:
 *
 *   srun --nodelist=NODE --nodes=1 --ntasks=1 --cpus-per-task=C \
 *        sh -c 'kolo agent --name "$SLURMD_NODENAME" ...'
 *
 * so each agent is named after its node and every worker it starts runs
 * inside its step's CPUs. One step per node, not one for all: Slurm ends
 * a step everywhere when one of its nodes fails, which would take every
 * agent down with one node. The ranks are placed with -H node:tasks,...
 * (the user's -H wins). The agents read the run's token from its file
 * (the state directory: on a cluster, a home directory every node sees).
 * At the end the steps get SIGTERM through scancel (the agents have no
 * workers left and exit) and, if they linger, srun SIGKILL. A node that
 * dies takes its agent with it; an elastic job (--min-np) shrinks to the
 * others (an allocation made with --no-kill survives the node).
 */
#include "run.h"
#include "cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "errors.h"
#include "kolo.pb-c.h"
#include "util.h"

/* Expands Slurm's "2(x3),1" into counts, one per node; the number of
 * nodes, or -1 when the text is not in that form. */
static int expand_counts(const char *text, int *out, int max)
{
    int n = 0;
    const char *p = text;
    while (p && *p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0)
            return -1;
        long times = 1;
        if (*end == '(') {
            if (end[1] != 'x')
                return -1;
            times = strtol(end + 2, &end, 10);
            if (*end != ')' || times < 1)
                return -1;
            end++;
        }
        for (long i = 0; i < times; i++) {
            if (n >= max)
                return -1;
            out[n++] = (int)v;
        }
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return n;
}

/* Slurm's client commands answer in well under a second; a controller
 * that does not answer must not hang kolo run. */
#define SLURM_CMD_TIMEOUT_MS 30000
#define SLURM_CMD_MAX_OUTPUT (4u << 20)

/* Runs one of Slurm's client commands: its stdout (malloc'd), or NULL with
 * the reason in err. */
static char *slurm_cmd(char *const argv[], char *err, size_t errlen)
{
    char what[96], *out = NULL;
    snprintf(what, sizeof what, "`%s %s`", argv[0], argv[1] ? argv[1] : "");
    if (capture_run(argv, what, SLURM_CMD_TIMEOUT_MS, SLURM_CMD_MAX_OUTPUT, &out, err, errlen))
        return NULL;
    return out;
}

void slurm_listen_url(char *out, size_t n)
{
    struct ifaddrs *ifs = NULL;
    char addr[64] = "127.0.0.1";
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
                continue;
            const struct sockaddr_in *sin = (const struct sockaddr_in *)i->ifa_addr;
            if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127)
                continue;
            inet_ntop(AF_INET, &sin->sin_addr, addr, sizeof addr);
            break;
        }
        freeifaddrs(ifs);
    }
    snprintf(out, n, "tcp://%s:0", addr);
}

void slurm_alloc_free(struct slurm_alloc *a)
{
    for (int i = 0; i < a->nnodes; i++)
        free(a->nodes[i]);
    free(a->nodes);
    free(a->tasks);
    free(a->srun);
    memset(a, 0, sizeof *a);
}

int slurm_detect(struct slurm_alloc *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    if (!slurm_in_allocation()) {
        snprintf(err, errlen, "not inside a Slurm allocation (no SLURM_JOB_ID and "
                              "SLURM_JOB_NODELIST: run it under salloc or sbatch)");
        return KOLO_ENOTFOUND;
    }
    snprintf(a->job_id, sizeof a->job_id, "%s", getenv("SLURM_JOB_ID"));
    char *argv[] = {"scontrol", "show", "hostnames", getenv("SLURM_JOB_NODELIST"), NULL};
    char why[256];
    char *names = slurm_cmd(argv, why, sizeof why);
    if (!names) {
        snprintf(err, errlen, "cannot expand SLURM_JOB_NODELIST=%s: %s (is Slurm's client on PATH?)",
                 getenv("SLURM_JOB_NODELIST"), why);
        return KOLO_ESYS;
    }
    for (char *save = NULL, *t = strtok_r(names, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
        char **grown = realloc(a->nodes, (size_t)(a->nnodes + 1) * sizeof *grown);
        if (!grown || !(grown[a->nnodes] = strdup(t))) {
            a->nodes = grown ? grown : a->nodes;
            free(names);
            slurm_alloc_free(a);
            return KOLO_ENOMEM;
        }
        a->nodes = grown;
        a->nnodes++;
    }
    free(names);
    a->tasks = calloc((size_t)a->nnodes + 1, sizeof *a->tasks);
    int *cpus = calloc((size_t)a->nnodes + 1, sizeof *cpus);
    const char *tpn = getenv("SLURM_TASKS_PER_NODE"), *cpn = getenv("SLURM_JOB_CPUS_PER_NODE");
    int nt = tpn ? expand_counts(tpn, a->tasks, a->nnodes) : -1;
    int nc = cpn ? expand_counts(cpn, cpus, a->nnodes) : -1;
    int rc = 0;
    if (!a->tasks || !cpus) {
        rc = KOLO_ENOMEM;
    } else if (a->nnodes == 0 || nt != a->nnodes) {
        snprintf(err, errlen, "cannot read the allocation: %d node(s) but SLURM_TASKS_PER_NODE=%s",
                 a->nnodes, tpn ? tpn : "(unset)");
        rc = KOLO_EINVAL;
    } else {
        a->cpus_min = nc == a->nnodes ? cpus[0] : 1;
        for (int i = 1; i < nc && nc == a->nnodes; i++)
            if (cpus[i] < a->cpus_min)
                a->cpus_min = cpus[i];
        for (int i = 0; i < a->nnodes; i++)
            if (a->tasks[i] > a->tasks_max)
                a->tasks_max = a->tasks[i];
    }
    free(cpus);
    if (rc)
        slurm_alloc_free(a);
    return rc;
}

char *slurm_hosts(const struct slurm_alloc *a)
{
    size_t cap = 1;
    for (int i = 0; i < a->nnodes; i++)
        cap += strlen(a->nodes[i]) + 16;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    size_t len = 0;
    s[0] = '\0';
    for (int i = 0; i < a->nnodes; i++)
        if (a->tasks[i] > 0)
            len += (size_t)snprintf(s + len, cap - len, "%s%s:%d", len ? "," : "", a->nodes[i],
                                    a->tasks[i]);
    return s;
}

int slurm_agents_start(struct slurm_alloc *a, const char *url, const char *token_file,
                       int64_t stop_grace_ms, const char *log_level, char *err, size_t errlen)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(err, errlen, "cannot find the kolo binary: %s", strerror(errno));
        return KOLO_ESYS;
    }
    self[n] = '\0';
    char cpus[32], slots[32], grace[32], jobname[64];
    snprintf(cpus, sizeof cpus, "--cpus-per-task=%d", a->cpus_min > 0 ? a->cpus_min : 1);
    snprintf(slots, sizeof slots, "%d", a->tasks_max);
    snprintf(grace, sizeof grace, "%lldms", (long long)stop_grace_ms);
    snprintf(jobname, sizeof jobname, "--job-name=kolo-agents");
    /* Each task: an agent named after its node, its state on the node,
     * removed when the agent ends (the shell outlives the step's SIGTERM:
     * its trap runs once the agent exited). */
    static const char script[] =
        "d=\"${TMPDIR:-/tmp}/kolo-agent-$SLURM_JOB_ID-$SLURMD_NODENAME\"; trap : TERM INT; "
        "\"$0\" agent --coordinator \"$1\" --token-file \"$2\" --name \"$SLURMD_NODENAME\" "
        "--slots \"$3\" --stop-grace \"$4\" --drain-grace 0 --log-level \"$5\" --state-dir \"$d\"; "
        "rc=$?; rm -rf \"$d\"; exit $rc";
    a->srun = calloc((size_t)a->nnodes, sizeof *a->srun);
    if (!a->srun)
        return KOLO_ENOMEM;
    for (int i = 0; i < a->nnodes; i++) {
        char node[300];
        snprintf(node, sizeof node, "--nodelist=%s", a->nodes[i]);
        char *argv[] = {"srun",          "--quiet",   node,     "--nodes=1", "--ntasks=1",
                        cpus,            jobname,     "sh",     "-c",        (char *)script,
                        self,            (char *)url, (char *)token_file,    slots,
                        grace,           (char *)log_level,     NULL};
        pid_t pid = fork();
        if (pid < 0) {
            snprintf(err, errlen, "cannot start srun: %s", strerror(errno));
            return KOLO_ESYS;
        }
        if (pid == 0) {
            /* its own process group: kolo run's Ctrl-C is handled by kolo run */
            setpgid(0, 0);
            execvp("srun", argv);
            fprintf(stderr, "[kolo] cannot run srun: %s\n", strerror(errno));
            _exit(127);
        }
        a->srun[i] = pid;
    }
    return 0;
}

int slurm_agents_wait(struct rpc_client *cli, struct slurm_alloc *a, int64_t timeout_ms, char *err,
                      size_t errlen)
{
    uint64_t deadline = now_mono_ms() + (uint64_t)timeout_ms;
    for (;;) {
        for (int i = 0; i < a->nnodes; i++) {
            int st;
            if (a->srun[i] > 0 && waitpid(a->srun[i], &st, WNOHANG) == a->srun[i]) {
                a->srun[i] = 0;
                snprintf(err, errlen, "srun on %s ended before its agent registered (%s %d)",
                         a->nodes[i], WIFEXITED(st) ? "exit code" : "signal",
                         WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                return KOLO_EPEER;
            }
        }
        Kolo__ListHostsRequest req = KOLO__LIST_HOSTS_REQUEST__INIT;
        ProtobufCMessage *msg = NULL;
        int alive = 0;
        if (cli_call(cli, "AdminService.ListHosts", &req.base, &kolo__list_hosts_reply__descriptor,
                     &msg, 2000, err, errlen) == 0) {
            const Kolo__ListHostsReply *h = (Kolo__ListHostsReply *)msg;
            for (int i = 0; i < a->nnodes; i++)
                for (size_t k = 0; k < h->n_hosts; k++)
                    if (strcmp(h->hosts[k]->name, a->nodes[i]) == 0 &&
                        strcmp(h->hosts[k]->state, "alive") == 0) {
                        alive++;
                        break;
                    }
            protobuf_c_message_free_unpacked(msg, NULL);
        }
        if (alive == a->nnodes)
            return 0;
        if (now_mono_ms() >= deadline) {
            snprintf(err, errlen, "%d of %d agents registered within %lld ms (the srun step "
                                  "started them on the allocation's nodes)",
                     alive, a->nnodes, (long long)timeout_ms);
            return KOLO_ETIMEDOUT;
        }
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void slurm_agents_stop(struct slurm_alloc *a, int64_t wait_ms)
{
    if (!a->srun)
        return;
    /* SIGTERM to the agents through Slurm (srun itself would kill its
     * step on SIGTERM, leaving the agents' state behind): every step of
     * this job named kolo-agents. Each srun then ends with its task. */
    char job[64];
    snprintf(job, sizeof job, "--jobs=%s", a->job_id);
    char *ls[] = {"squeue", "--steps", job, "--noheader", "--format=%i %j", NULL};
    char why[256];
    char *text = slurm_cmd(ls, why, sizeof why);
    if (!text)
        fprintf(stderr, "[kolo] cannot list the agents' job steps: %s\n", why);
    for (char *save = NULL, *l = text ? strtok_r(text, "\n", &save) : NULL; l;
         l = strtok_r(NULL, "\n", &save)) {
        char id[64], name[64];
        if (sscanf(l, "%63s %63s", id, name) == 2 && strcmp(name, "kolo-agents") == 0) {
            char *argv[] = {"scancel", "--quiet", "--signal=TERM", id, NULL};
            char *said = slurm_cmd(argv, why, sizeof why);
            if (!said)
                fprintf(stderr, "[kolo] %s\n", why);
            free(said);
        }
    }
    free(text);
    uint64_t deadline = now_mono_ms() + (uint64_t)wait_ms;
    for (int i = 0; i < a->nnodes; i++) {
        int st;
        while (a->srun[i] > 0 && waitpid(a->srun[i], &st, WNOHANG) != a->srun[i]) {
            if (now_mono_ms() >= deadline) {
                kill(a->srun[i], SIGKILL);
                waitpid(a->srun[i], &st, 0);
                break;
            }
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        a->srun[i] = 0;
    }
}
