/*
 * fuzz_run_flags.c - libFuzzer harness for kolo run's settings: the knob
 * parser (common/knobs.c: flags, `name = value` config files, durations
 * and sizes) and the horovodrun YAML subset (cli/run_flags.c). The input
 * is split at its first NUL: the part before is a YAML file given with
 * --config-file, the rest command-line arguments, one per line.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "knobs.h"
#include "run.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    size_t ylen = strlen(text);
    char path[] = "/tmp/kolo-fuzz-yaml-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        free(text);
        return 0;
    }
    if (write(fd, text, ylen) != (ssize_t)ylen) {
        close(fd);
        unlink(path);
        free(text);
        return 0;
    }
    close(fd);
    char *argv[MAX_ARGS + 4];
    int argc = 0;
    argv[argc++] = "kolo-run";
    argv[argc++] = "--config-file";
    argv[argc++] = path;
    char *rest = ylen < size ? text + ylen + 1 : text + size;
    for (char *line = strtok(rest, "\n"); line && argc < MAX_ARGS; line = strtok(NULL, "\n"))
        argv[argc++] = line;
    argv[argc] = NULL;

    struct knob tab[RUN_MAX_KNOBS];
    struct run_opts o;
    memset(&o, 0, sizeof o);
    size_t n = run_flags_table(tab, &o);
    char err[512];
    int first = 0;
    FILE *devnull = fopen("/dev/null", "w");
    if (!devnull) {
        knobs_free(tab, n);
        unlink(path);
        free(text);
        return 0;
    }
    if (knobs_parse(tab, n, argc, argv, &first, "kolo run", devnull, err, sizeof err) == 0 &&
        run_flags_finish(tab, n, &o, err, sizeof err) == 0) {
        char **env = run_job_env(tab, n, &o);
        run_job_env_free(env);
        knobs_dump(devnull, tab, n);
    }
    fclose(devnull);
    knobs_free(tab, n);
    unlink(path);
    int64_t v;
    (void)knobs_parse_duration(text, &v);
    (void)knobs_parse_size(text, &v);
    free(text);
    return 0;
}
