/*
 * lines.c - split a worker's output stream into lines.
 *
 * The reader (a uv_pipe_t read callback) writes straight into the
 * splitter's buffer, so a byte is copied once, into the outbound queue.
 * A line ends at "\n"; a "\r" right before it belongs to the terminator
 * (programs written for Windows, or ptys). A line that fills the whole
 * buffer without a newline is emitted as a piece of max_line bytes, so a
 * runaway writer (a progress bar redrawn with bare "\r") cannot grow the
 * agent's memory; when the newline then follows at once it only ends the
 * piece already sent and does not produce an empty line.
 */
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "errors.h"

int line_splitter_init(struct line_splitter *ls, size_t max_line, line_emit_fn emit, void *arg)
{
    memset(ls, 0, sizeof(*ls));
    ls->buf = malloc(max_line);
    if (!ls->buf)
        return KOLO_ENOMEM;
    ls->cap = max_line;
    ls->emit = emit;
    ls->arg = arg;
    return 0;
}

void line_splitter_free(struct line_splitter *ls)
{
    free(ls->buf);
    ls->buf = NULL;
    ls->used = ls->cap = 0;
}

void line_splitter_space(struct line_splitter *ls, char **p, size_t *n)
{
    /* commit never leaves the buffer full, so there is always room. */
    *p = ls->buf + ls->used;
    *n = ls->cap - ls->used;
}

static void emit_line(struct line_splitter *ls, const char *p, size_t len)
{
    if (len > 0 && p[len - 1] == '\r')
        len--;
    ls->emit(ls->arg, p, len);
}

void line_splitter_commit(struct line_splitter *ls, size_t n)
{
    size_t start = 0, i = ls->used;

    if (n == 0)
        return;
    ls->used += n;
    if (ls->skip_lf) {
        /* Only set after a cut, which empties the buffer: the new bytes
         * start at 0. */
        if (ls->buf[0] == '\n')
            start = 1;
        else if (ls->buf[0] == '\r' && ls->used > 1 && ls->buf[1] == '\n')
            start = 2;
        ls->skip_lf = ls->buf[0] == '\r' && ls->used == 1;
        if (ls->skip_lf) {
            /* A lone "\r" so far: wait for the next byte to decide. */
            return;
        }
        i = start;
    }
    for (; i < ls->used; i++) {
        if (ls->buf[i] != '\n')
            continue;
        emit_line(ls, ls->buf + start, i - start);
        start = i + 1;
    }
    if (start > 0) {
        memmove(ls->buf, ls->buf + start, ls->used - start);
        ls->used -= start;
    }
    if (ls->used == ls->cap) {
        ls->emit(ls->arg, ls->buf, ls->used);
        ls->used = 0;
        ls->skip_lf = true;
    }
}

void line_splitter_feed(struct line_splitter *ls, const char *data, size_t len)
{
    while (len > 0) {
        char *p;
        size_t room;
        line_splitter_space(ls, &p, &room);
        size_t n = len < room ? len : room;
        memcpy(p, data, n);
        line_splitter_commit(ls, n);
        data += n;
        len -= n;
    }
}

void line_splitter_finish(struct line_splitter *ls)
{
    if (ls->skip_lf && ls->used == 1 && ls->buf[0] == '\r') {
        /* The "\r" that followed a cut piece: nothing of its own. */
        ls->used = 0;
    }
    if (ls->used > 0)
        emit_line(ls, ls->buf, ls->used);
    ls->used = 0;
    ls->skip_lf = false;
}
