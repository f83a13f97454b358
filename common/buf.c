/*
 * buf.c - a growable byte buffer.
 *
 * The buffer keeps one spare byte past len so it can always be
 * NUL-terminated without another allocation. Once an allocation fails the
 * buffer is "failed": appends become no-ops and the caller checks b->oom
 * once when done, instead of after every append.
 */
#include "buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void buf_init(struct buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->oom = false;
}

void buf_free(struct buf *b)
{
    free(b->data);
    buf_init(b);
}

void buf_reset(struct buf *b)
{
    b->len = 0;
    b->oom = false;
    if (b->data)
        b->data[0] = '\0';
}

/* buf_reserve makes room for extra more bytes plus the terminating NUL;
 * false (and the buffer failed) if that is impossible. */
static bool buf_reserve(struct buf *b, size_t extra)
{
    if (b->oom)
        return false;
    if (extra > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *data = realloc(b->data, cap);
    if (!data) {
        b->oom = true;
        return false;
    }
    b->data = data;
    b->cap = cap;
    return true;
}

void buf_append(struct buf *b, const void *data, size_t len)
{
    if (len == 0 || !buf_reserve(b, len))
        return;
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void buf_puts(struct buf *b, const char *s)
{
    if (s)
        buf_append(b, s, strlen(s));
}

void buf_putc(struct buf *b, char c)
{
    buf_append(b, &c, 1);
}

void buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
    if (b->oom)
        return;
    /* Try to format into the space already there; most calls fit. */
    va_list ap2;
    va_copy(ap2, ap);
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap);
    if (n < 0) {
        /* An encoding error leaves nothing sensible to append. */
        if (b->data)
            b->data[b->len] = '\0';
        va_end(ap2);
        return;
    }
    if ((size_t)n >= room) {
        if (!buf_reserve(b, (size_t)n)) {
            if (b->data)
                b->data[b->len] = '\0';
            va_end(ap2);
            return;
        }
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    }
    va_end(ap2);
    b->len += (size_t)n;
}

const char *buf_cstr(struct buf *b)
{
    if (!b->data)
        return "";
    b->data[b->len] = '\0';
    return b->data;
}

char *buf_steal(struct buf *b, size_t *len)
{
    char *data = NULL;
    if (!b->oom) {
        /* Always hand back a real allocation so the caller can free() it. */
        if (!b->data)
            buf_reserve(b, 0);
        data = b->data;
        if (data) {
            data[b->len] = '\0';
            if (len)
                *len = b->len;
            b->data = NULL;
        }
    }
    if (!data && len)
        *len = 0;
    buf_free(b);
    return data;
}
