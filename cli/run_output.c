/*
 * run_output.c - --output-filename: every rank's output in its own files,
 * DIR/rank.<N>/stdout and DIR/rank.<N>/stderr, as horovodrun writes them
 * with Gloo, while kolo run goes on printing it as well.
 *
 * All the files are created (empty) before the job is submitted, so a
 * directory that cannot be written fails the run before any worker
 * starts, and a rank that prints nothing still has its two files. Files
 * are opened on a rank's first line and stay open, line-buffered, so that
 * `tail -f` follows them; np can be larger than the descriptors a process
 * may hold, so running out of descriptors closes the open files and
 * carries on (they are reopened for appending on their next line).
 */
#include "run.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util.h"

struct run_output {
    char *dir;
    int np, width;
    FILE **files; /* [2 * np]: stdout, stderr of rank 0, then of rank 1, ... */
    bool failed;  /* a write failed and was reported */
};

static void rank_path(const struct run_output *o, int rank, const char *leaf, char *out,
                      size_t size)
{
    snprintf(out, size, "%s/rank.%0*d%s%s", o->dir, o->width, rank, leaf ? "/" : "",
             leaf ? leaf : "");
}

int run_output_open(struct run_output **out, const char *dir, int np, char *err, size_t errlen)
{
    *out = NULL;
    struct run_output *o = calloc(1, sizeof(*o));
    if (!o || !(o->dir = strdup(dir)) || !(o->files = calloc(2 * (size_t)np, sizeof(FILE *)))) {
        snprintf(err, errlen, "out of memory");
        run_output_close(o);
        return -1;
    }
    o->np = np;
    o->width = 1;
    for (int v = np - 1; v >= 10; v /= 10)
        o->width++;
    char path[4200];
    for (int r = 0; r < np; r++) {
        rank_path(o, r, NULL, path, sizeof path);
        if (mkdir_p(path) != 0) {
            snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
            run_output_close(o);
            return -1;
        }
        for (int s = 0; s < 2; s++) {
            rank_path(o, r, s ? "stderr" : "stdout", path, sizeof path);
            FILE *f = fopen_private(path, false);
            if (!f) {
                snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
                run_output_close(o);
                return -1;
            }
            fclose(f);
        }
    }
    *out = o;
    return 0;
}

/* close_all gives back every descriptor this holds. */
static void close_all(struct run_output *o)
{
    for (size_t i = 0; i < 2 * (size_t)o->np; i++)
        if (o->files[i]) {
            fclose(o->files[i]);
            o->files[i] = NULL;
        }
}

void run_output_write(struct run_output *o, int rank, bool err_stream, const void *data, size_t len)
{
    if (!o || rank < 0 || rank >= o->np)
        return;
    FILE **slot = &o->files[2 * (size_t)rank + (err_stream ? 1 : 0)];
    if (!*slot) {
        char path[4200];
        rank_path(o, rank, err_stream ? "stderr" : "stdout", path, sizeof path);
        *slot = fopen_private(path, true);
        if (!*slot && (errno == EMFILE || errno == ENFILE)) {
            close_all(o);
            *slot = fopen_private(path, true);
        }
        if (!*slot) {
            if (!o->failed)
                fprintf(stderr, "[kolo] cannot write %s: %s\n", path, strerror(errno));
            o->failed = true;
            return;
        }
        setvbuf(*slot, NULL, _IOLBF, 0);
    }
    if ((fwrite(data, 1, len, *slot) != len || fputc('\n', *slot) == EOF) && !o->failed) {
        fprintf(stderr, "[kolo] cannot write the output of rank %d: %s\n", rank, strerror(errno));
        o->failed = true;
    }
}

void run_output_close(struct run_output *o)
{
    if (!o)
        return;
    if (o->files) {
        for (size_t i = 0; i < 2 * (size_t)o->np; i++)
            if (o->files[i] && fclose(o->files[i]) != 0 && !o->failed) {
                fprintf(stderr, "[kolo] cannot write the output of rank %zu: %s\n", i / 2,
                        strerror(errno));
                o->failed = true;
            }
    }
    free(o->files);
    free(o->dir);
    free(o);
}
