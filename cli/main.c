/*
 * main.c - the kolo binary: one executable, one subcommand per role.
 */
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "cli.h"
#include "coord.h"

static const char usage[] =
    "usage: kolo <command> [options]\n"
    "\n"
    "commands:\n"
    "  run          launch a training job (horovodrun-compatible): kolo run -np 4 -- python "
    "train.py\n"
    "  tune         hyperparameter search, each trial a kolo job (Optuna): kolo tune --trials 20 "
    "--space space.yaml -- python train.py --lr {lr}\n"
    "  status       show hosts and jobs of a running coordinator\n"
    "  jobs, hosts  list them (-o json for scripts)\n"
    "  logs         a job's output: kolo logs [-f] [--rank N] JOB\n"
    "  stop         stop a job: kolo stop JOB\n"
    "  stacks       what every rank of a job is doing: its Python stacks, its state: kolo "
    "stacks JOB\n"
    "  top          a job's ranks, costliest first: step time, lag, cost: kolo top JOB\n"
    "  attach       follow a job (kolo run --detach) and exit with its code\n"
    "  dashboard    the dashboard of past and current local runs (kolo run's kept "
    "databases), read-only\n"
    "  drain, undrain\n"
    "               no new work on a host, elastic jobs leave it / usable again\n"
    "  coordinator  run the cluster coordinator (RPC, REST, dashboard, SQLite state)\n"
    "  agent        run the host agent that starts and watches workers\n"
    "  version      print the version\n"
    "\n"
    "`kolo <command> --help` lists the command's options.\n";

/* Every subcommand: its name and its entry point, given argv from the
 * subcommand's name on. */
static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
} commands[] = {
    {"run", cmd_run},
    {"tune", cmd_tune},
    {"status", cmd_status},
    {"jobs", cmd_jobs},
    {"hosts", cmd_hosts},
    {"logs", cmd_logs},
    {"stop", cmd_stop},
    {"stacks", cmd_stacks},
    {"top", cmd_top},
    {"attach", cmd_attach},
    {"dashboard", cmd_dashboard},
    {"drain", cmd_drain},
    {"undrain", cmd_undrain},
    {"coordinator", cmd_coordinator},
    {"agent", cmd_agent},
    {"__exec", cmd_exec_shim},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kolo %s\n", KOLO_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    fprintf(stderr, "kolo: unknown command '%s'\n\n%s", cmd, usage);
    return 2;
}
