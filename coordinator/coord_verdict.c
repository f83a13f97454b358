/*
 * coord_verdict.c - the line kolo run prints about a stuck or stopped job.
 *
 * A faulthandler dump lists every Python thread, newest first, each frame
 * innermost first:
 *
 *   Thread 0x00007f… (most recent call first):
 *     File "/usr/lib/python3.11/threading.py", line 324 in wait
 *
 *   Current thread 0x00007f… (most recent call first):
 *     File "/home/u/train.py", line 88 in <module>
 *
 * The main thread started first, so it is the last one listed. The line a
 * user wants is their own: the innermost frame outside the interpreter's
 * library, installed packages and kolo itself.
 */
#include "coord_verdict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "util.h"

struct frame {
    char file[256];
    long line;
    char func[96];
};

/* One "  File "...", line N in f" line; false for any other line. */
static bool frame_parse(const char *s, size_t len, struct frame *f)
{
    static const char head[] = "  File \"";
    if (len < sizeof head || strncmp(s, head, sizeof head - 1) != 0)
        return false;
    const char *name = s + sizeof head - 1, *end = s + len;
    const char *q = memchr(name, '"', (size_t)(end - name));
    if (!q)
        return false;
    size_t n = (size_t)(q - name) < sizeof f->file - 1 ? (size_t)(q - name) : sizeof f->file - 1;
    memcpy(f->file, name, n);
    f->file[n] = '\0';
    const char *p = q + 1;
    f->line = 0;
    f->func[0] = '\0';
    if ((size_t)(end - p) > 7 && strncmp(p, ", line ", 7) == 0)
        f->line = strtol(p + 7, (char **)&p, 10);
    if ((size_t)(end - p) > 4 && strncmp(p, " in ", 4) == 0) {
        p += 4;
        n = (size_t)(end - p) < sizeof f->func - 1 ? (size_t)(end - p) : sizeof f->func - 1;
        memcpy(f->func, p, n);
        f->func[n] = '\0';
    }
    return true;
}

/* Whether a frame's file is the user's own. */
static bool frame_is_users(const char *file)
{
    static const char *const lib[] = {"/lib/python", "site-packages/", "dist-packages/",
                                      "/python/kolo/"};
    if (file[0] == '<' || file[0] == '\0')
        return false;
    for (size_t i = 0; i < sizeof lib / sizeof lib[0]; i++)
        if (strstr(file, lib[i]))
            return false;
    return true;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

bool verdict_where(const char *text, char *out, size_t size)
{
    out[0] = '\0';
    if (!text)
        return false;
    /* the last thread's frames: a thread header starts a block anew */
    struct frame inner = {0}, users = {0};
    bool have_inner = false, have_users = false;
    for (const char *s = text; *s;) {
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        struct frame f;
        if (len && s[0] != ' ' && strstr(s, "(most recent call first)") &&
            (size_t)(strstr(s, "(most recent call first)") - s) < len) {
            have_inner = have_users = false;
        } else if (frame_parse(s, len, &f)) {
            if (!have_inner) {
                inner = f;
                have_inner = true;
            }
            if (!have_users && frame_is_users(f.file)) {
                users = f;
                have_users = true;
            }
        }
        s += len + (nl ? 1 : 0);
    }
    if (!have_inner)
        return false;
    const struct frame *at = have_users ? &users : &inner;
    int k = snprintf(out, size, "%s:%ld in %s", base_name(at->file), at->line, at->func);
    if (have_users && k >= 0 && (size_t)k < size &&
        (strcmp(inner.file, users.file) != 0 || inner.line != users.line))
        snprintf(out + k, size - (size_t)k, " (in %s:%ld %s)", base_name(inner.file), inner.line,
                 inner.func);
    return true;
}

#define VERDICT_LIST 4 /* ranks named in one list */

/* "rank 3 (host b)" or "ranks 0, 1, 2 and 5 more" for the ranks in set. */
static void ranks_text(struct buf *b, const bool *set, bool want, const struct verdict_rank *ranks,
                       int nranks)
{
    int n = 0;
    for (int r = 0; r < nranks; r++)
        n += set[r] == want;
    if (n == 1) {
        for (int r = 0; r < nranks; r++)
            if (set[r] == want)
                buf_printf(b, "rank %d (host %s)", r, ranks[r].host ? ranks[r].host : "?");
        return;
    }
    buf_puts(b, "ranks ");
    int listed = 0;
    for (int r = 0; r < nranks && listed < VERDICT_LIST; r++)
        if (set[r] == want)
            buf_printf(b, "%s%d", listed++ ? ", " : "", r);
    if (n > listed)
        buf_printf(b, " and %d more", n - listed);
}

static const char *where_of(const struct verdict_rank *rk)
{
    return rk->where && rk->where[0] ? rk->where : "nothing known";
}

/* The ops rank r submitted (waits in) other than skip: the first one. */
static const struct verdict_op *waits_in_other(const struct verdict_op *ops, size_t nops,
                                               const struct verdict_op *skip, int r)
{
    for (size_t i = 0; i < nops; i++)
        if (&ops[i] != skip && !ops[i].missing[r])
            return &ops[i];
    return NULL;
}

static void verdict_stall(struct buf *b, const struct verdict_op *ops, size_t nops,
                          const struct verdict_rank *ranks, int nranks)
{
    const struct verdict_op *op = &ops[0];
    for (size_t i = 1; i < nops; i++)
        if (ops[i].waiting_ms > op->waiting_ms)
            op = &ops[i];
    int nwait = 0;
    for (int r = 0; r < nranks; r++)
        nwait += !op->missing[r];
    ranks_text(b, op->missing, false, ranks, nranks);
    buf_printf(b, " %s in '%s' for %llu s", nwait == 1 ? "waits" : "wait", op->name,
               (unsigned long long)(op->waiting_ms / 1000));
    int named = 0, more = 0;
    for (int r = 0; r < nranks; r++) {
        if (!op->missing[r])
            continue;
        if (named == VERDICT_LIST - 1) {
            more++;
            continue;
        }
        named++;
        buf_printf(b, "; rank %d (host %s) ", r, ranks[r].host ? ranks[r].host : "?");
        const struct verdict_op *other = waits_in_other(ops, nops, op, r);
        if (other)
            buf_printf(b, "waits in '%s' instead, which the others never submit (the ranks "
                          "run different collectives, which can never match): %s",
                       other->name, where_of(&ranks[r]));
        else
            buf_printf(b, "never submitted it: %s", where_of(&ranks[r]));
    }
    if (more)
        buf_printf(b, "; %d more rank(s) never submitted it", more);
}

/* Without ops: the ranks grouped by where they are, at most 3 places. */
static void verdict_places(struct buf *b, const struct verdict_rank *ranks, int nranks)
{
    bool *done = calloc(nranks > 0 ? (size_t)nranks : 1, sizeof *done);
    bool *same = calloc(nranks > 0 ? (size_t)nranks : 1, sizeof *same);
    int places = 0, rest = 0;
    for (int r = 0; done && same && r < nranks; r++) {
        if (done[r])
            continue;
        const char *w = where_of(&ranks[r]);
        for (int q = 0; q < nranks; q++)
            same[q] = !done[q] && strcmp(where_of(&ranks[q]), w) == 0;
        for (int q = 0; q < nranks; q++)
            done[q] = done[q] || same[q];
        if (places == 3) {
            for (int q = 0; q < nranks; q++)
                rest += same[q];
            continue;
        }
        buf_puts(b, places++ ? "; " : "");
        ranks_text(b, same, true, ranks, nranks);
        buf_printf(b, ": %s", w);
    }
    if (rest)
        buf_printf(b, "; %d more rank(s) elsewhere", rest);
    free(done);
    free(same);
}

void verdict_build(const struct verdict_op *ops, size_t nops, const struct verdict_rank *ranks,
                   int nranks, char *out, size_t size)
{
    struct buf b;
    buf_init(&b);
    if (nranks <= 0)
        buf_puts(&b, "no rank to ask");
    else if (nops)
        verdict_stall(&b, ops, nops, ranks, nranks);
    else
        verdict_places(&b, ranks, nranks);
    str_copy(out, b.oom || !b.data ? "" : b.data, size);
    buf_free(&b);
}
