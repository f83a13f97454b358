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
    "  status       show hosts and jobs of a running coordinator\n"
    "  coordinator  run the cluster coordinator (RPC, REST, dashboard, SQLite state)\n"
    "  agent        run the host agent that starts and watches workers\n"
    "  version      print the version\n"
    "\n"
    "`kolo <command> --help` lists the command's options.\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0)
        return cmd_status(argc - 1, argv + 1);
    if (strcmp(cmd, "coordinator") == 0)
        return cmd_coordinator(argc - 1, argv + 1);
    if (strcmp(cmd, "agent") == 0)
        return cmd_agent(argc - 1, argv + 1);
    if (strcmp(cmd, "__exec") == 0)
        return cmd_exec_shim(argc - 1, argv + 1);
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
