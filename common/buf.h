/*
 * buf.h - a growable byte buffer, used to build JSON, frames and text.
 * On allocation failure the buffer turns "failed" (oom set) and further
 * appends are ignored, so builders check once at the end.
 */
#ifndef KOLO_COMMON_BUF_H
#define KOLO_COMMON_BUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

struct buf {
    char *data; /* always NUL-terminated when len > 0 or after buf_cstr */
    size_t len;
    size_t cap;
    bool oom;
};

void buf_init(struct buf *b);
void buf_free(struct buf *b);
void buf_reset(struct buf *b);
void buf_append(struct buf *b, const void *data, size_t len);
void buf_puts(struct buf *b, const char *s);
void buf_putc(struct buf *b, char c);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vprintf(struct buf *b, const char *fmt, va_list ap);
/* buf_cstr returns a NUL-terminated view ("" when empty). */
const char *buf_cstr(struct buf *b);
/* buf_steal hands the storage to the caller (free with free()). */
char *buf_steal(struct buf *b, size_t *len);

#endif
