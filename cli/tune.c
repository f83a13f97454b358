/*
 * tune.c - `kolo tune`: hyperparameter search, each trial a kolo job.
 *
 * The search itself is Python (python/kolo/tune.py: Optuna samples and
 * prunes), so this command only starts `python3 -m kolo.tune` with the
 * same arguments: the package next to this binary's build tree when there
 * is one (a checkout), else the installed one, and KOLO_BIN set to this
 * binary so that trials run on the same kolo.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cmd_tune(int argc, char **argv)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        setenv("KOLO_BIN", exe, 0);
    }
    cli_use_checkout_python(false);
    const char *python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    char **args = calloc((size_t)argc + 3, sizeof(char *));
    if (!args) {
        fprintf(stderr, "kolo tune: out of memory\n");
        return 1;
    }
    args[0] = (char *)python;
    args[1] = "-m";
    args[2] = "kolo.tune";
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];
    execvp(python, args);
    fprintf(stderr,
            "kolo tune: cannot start %s: %s (kolo tune needs Python 3 with the kolo "
            "package and Optuna)\n",
            python, strerror(errno));
    free(args);
    return 127;
}
