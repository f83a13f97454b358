/*
 * resp_log.c - the response log (resp_log.h).
 */
#include "resp_log.h"

#include <stdlib.h>
#include <string.h>

#include "errors.h"

void pb_put_varint(uint8_t **p, uint64_t v)
{
    while (v >= 0x80) {
        *(*p)++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *(*p)++ = (uint8_t)v;
}

void rlog_restart(struct resp_log *l, uint64_t base)
{
    for (size_t i = 0; i < l->len; i++)
        free(l->ents[i].bytes);
    l->len = 0;
    l->base = base;
}

void rlog_free(struct resp_log *l)
{
    rlog_restart(l, 0);
    free(l->ents);
    l->ents = NULL;
    l->cap = 0;
}

int rlog_append(struct resp_log *l, Kolo__Response *r)
{
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        void *grown = realloc(l->ents, cap * sizeof(*l->ents));
        if (!grown)
            return KOLO_ENOMEM;
        l->ents = grown;
        l->cap = cap;
    }
    r->index = rlog_end(l);
    size_t len = kolo__response__get_packed_size(r);
    uint8_t *b = malloc(len ? len : 1);
    if (!b)
        return KOLO_ENOMEM;
    kolo__response__pack(r, b);
    l->ents[l->len].bytes = b;
    l->ents[l->len].len = len;
    l->len++;
    return 0;
}

void rlog_trim(struct resp_log *l, uint64_t read)
{
    if (read <= l->base)
        return;
    size_t drop = (size_t)(read - l->base);
    if (drop > l->len)
        drop = l->len;
    for (size_t i = 0; i < drop; i++)
        free(l->ents[i].bytes);
    memmove(l->ents, l->ents + drop, (l->len - drop) * sizeof(*l->ents));
    l->len -= drop;
    l->base += drop;
}

/* a field's tag and length prefix take at most this many bytes */
#define FIELD_OVERHEAD 12

uint8_t *rlog_reply(const struct resp_log *l, uint64_t cursor, size_t max_bytes, size_t spare,
                    size_t *len)
{
    if (cursor < l->base)
        cursor = l->base; /* already trimmed: the rank read them */
    size_t first = cursor - l->base < l->len ? (size_t)(cursor - l->base) : l->len;
    size_t last = first, total = FIELD_OVERHEAD; /* field 2 */
    while (last < l->len && total + l->ents[last].len + FIELD_OVERHEAD < max_bytes) {
        total += l->ents[last].len + FIELD_OVERHEAD;
        last++;
    }
    uint8_t *buf = malloc(total + spare), *p = buf;
    if (!buf)
        return NULL;
    for (size_t i = first; i < last; i++) {
        *p++ = (1 << 3) | 2;
        pb_put_varint(&p, l->ents[i].len);
        memcpy(p, l->ents[i].bytes, l->ents[i].len);
        p += l->ents[i].len;
    }
    *p++ = (2 << 3) | 0;
    pb_put_varint(&p, l->base + last);
    *len = (size_t)(p - buf);
    return buf;
}
