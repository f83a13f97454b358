/*
 * resp_log.h - the response log of one negotiation: the coordinator's decisions
 * (Kolo__Response), each packed once and sent as it is to every rank. Every
 * rank runs the log in order, so all run the same collectives in the same
 * sequence. Entries are numbered from 0 for the generation; those every
 * rank has read are trimmed.
 *
 * The reply a rank gets is NegotiateReply's fields 1 (the entries from its
 * cursor on) and 2 (the next cursor) packed by hand around the stored
 * bytes, so an entry is packed once however many ranks read it; the
 * caller appends its own fields after them.
 */
#ifndef KOLO_NEGOTIATION_RESP_LOG_H
#define KOLO_NEGOTIATION_RESP_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "kolo.pb-c.h"

struct resp_log {
    struct {
        uint8_t *bytes;
        size_t len;
    } *ents;
    size_t len, cap;
    uint64_t base; /* index of ents[0] */
};

/* A zeroed struct resp_log is an empty log starting at index 0. */
void rlog_free(struct resp_log *l);
/* rlog_end: the index the next entry gets. */
static inline uint64_t rlog_end(const struct resp_log *l)
{
    return l->base + l->len;
}
/* rlog_restart empties the log and numbers the next entry `base` (a
 * coordinator rebuilding a log after its restart). */
void rlog_restart(struct resp_log *l, uint64_t base);
/* rlog_append numbers r (r->index) and stores it packed (0; KOLO_ENOMEM). */
int rlog_append(struct resp_log *l, Kolo__Response *r);
/* rlog_trim drops the entries below index `read` (every rank has them). */
void rlog_trim(struct resp_log *l, uint64_t read);

/* rlog_reply packs fields 1 and 2 of a NegotiateReply for a rank whose
 * cursor is `cursor`: the entries from there on (from the first one kept,
 * if the rank is behind the trim) while the reply stays under max_bytes,
 * and the cursor after them. The buffer has room for `spare` more bytes
 * after *len; NULL: out of memory. */
uint8_t *rlog_reply(const struct resp_log *l, uint64_t cursor, size_t max_bytes, size_t spare,
                    size_t *len);

/* pb_put_varint writes v as a protobuf varint at *p and advances it (at
 * most 10 bytes). */
void pb_put_varint(uint8_t **p, uint64_t v);

#endif
