/*
 * outbox.c - the agent's outbound queue of worker events and output lines.
 *
 * DESIGN. One FIFO holds both kinds, so the order in which things happened
 * on this host is the order in which they leave it. A Report message has
 * two separate lists (events, lines) and loses the interleaving, so
 * outbox_take cuts batches such that every line in a batch happened
 * before every event in it: the coordinator applies a Report's lines
 * first, then its events, and sees the true order — a worker's last line
 * before its EXITED, and its STARTED (a batch of its own, or at the end of
 * one) before its first line.
 *
 * Every batch gets the next batch_seq when it is taken and keeps it when
 * resent, so the coordinator can skip a batch it accepted already whose
 * reply was lost.
 *
 * The reporter takes a batch off the queue and keeps it until the
 * coordinator accepted it, so a batch is never lost to a failed call and
 * the cap below never drops what is in flight.
 *
 * Output is bounded: when the queued lines exceed the cap (the coordinator
 * is slow or away and a worker prints without end), the oldest lines are
 * dropped and counted. Events are never dropped: they are few, and losing
 * an EXITED would leave a job waiting for a rank that is gone.
 */
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "errors.h"
#include "log.h"

/* Rough per-message framing overhead on the wire, so that a batch of many
 * short lines is bounded too. */
#define ITEM_OVERHEAD 24

void outbox_init(struct outbox *o, size_t cap)
{
    memset(o, 0, sizeof(*o));
    o->cap = cap;
}

static void items_free(struct outbox_item *it)
{
    while (it) {
        struct outbox_item *next = it->next;
        free(it);
        it = next;
    }
}

void outbox_free(struct outbox *o)
{
    items_free(o->head);
    o->head = o->tail = NULL;
    o->n_lines = 0;
    o->line_bytes = 0;
}

bool outbox_empty(const struct outbox *o)
{
    return o->head == NULL;
}

bool outbox_full_batch(const struct outbox *o)
{
    return o->n_lines >= AGENT_BATCH_LINES || o->line_bytes >= AGENT_BATCH_BYTES;
}

static void append(struct outbox *o, struct outbox_item *it)
{
    it->next = NULL;
    if (o->tail)
        o->tail->next = it;
    else
        o->head = it;
    o->tail = it;
}

bool outbox_push_event(struct outbox *o, const Kolo__WorkerEvent *ev)
{
    const char *msg = ev->message ? ev->message : "";
    size_t mlen = strlen(msg);
    struct outbox_item *it = malloc(sizeof(*it) + mlen + 1);
    if (!it) {
        LOGE("agent", "out of memory queueing a worker event");
        return false;
    }
    bool was_empty = o->head == NULL;
    it->is_event = true;
    it->cost = sizeof(Kolo__WorkerEvent) + mlen + ITEM_OVERHEAD;
    it->u.ev = *ev;
    memcpy(it->data, msg, mlen + 1);
    it->u.ev.message = it->data;
    append(o, it);
    return was_empty;
}

/* drop_oldest_line removes the oldest queued line; false if there is none. */
static bool drop_oldest_line(struct outbox *o)
{
    struct outbox_item *prev = NULL, *it = o->head;
    while (it && it->is_event) {
        prev = it;
        it = it->next;
    }
    if (!it)
        return false;
    if (prev)
        prev->next = it->next;
    else
        o->head = it->next;
    if (o->tail == it)
        o->tail = prev;
    o->n_lines--;
    o->line_bytes -= it->cost;
    o->dropped++;
    free(it);
    return true;
}

bool outbox_push_line(struct outbox *o, uint64_t job_id, int32_t rank, uint64_t worker_id, int stream, const char *text,
                      size_t len, uint64_t ts_ms)
{
    size_t cost = len + ITEM_OVERHEAD;
    while (o->line_bytes + cost > o->cap && drop_oldest_line(o)) {
        if (!o->dropping) {
            o->dropping = true;
            LOGW("agent",
                 "output queue over %zu MiB (coordinator slow or unreachable): "
                 "dropping the oldest output lines",
                 o->cap >> 20);
        }
    }
    struct outbox_item *it = malloc(sizeof(*it) + len);
    if (!it) {
        o->dropped++;
        return false;
    }
    bool was_empty = o->head == NULL;
    bool was_full = outbox_full_batch(o);
    Kolo__OutputLine init = KOLO__OUTPUT_LINE__INIT;
    it->is_event = false;
    it->cost = cost;
    it->u.line = init;
    it->u.line.job_id = job_id;
    it->u.line.rank = rank;
    it->u.line.worker_id = worker_id;
    it->u.line.stream = (Kolo__OutputStream)stream;
    it->u.line.ts_ms = ts_ms;
    if (len)
        memcpy(it->data, text, len);
    it->u.line.text.data = (uint8_t *)it->data;
    it->u.line.text.len = len;
    append(o, it);
    o->n_lines++;
    o->line_bytes += cost;
    return was_empty || (!was_full && outbox_full_batch(o));
}

void outbox_take(struct outbox *o, struct outbox_batch *b)
{
    size_t bytes = 0;
    memset(b, 0, sizeof(*b));
    b->seq = ++o->batch_seq;
    while (o->head) {
        struct outbox_item *it = o->head;
        if (it->is_event) {
            if (b->n_events >= AGENT_BATCH_LINES)
                break;
        } else if (b->n_events > 0 || b->n_lines >= AGENT_BATCH_LINES ||
                   (b->head && bytes + it->cost > AGENT_BATCH_BYTES)) {
            /* A line after an event starts the next batch (see DESIGN). */
            break;
        }
        o->head = it->next;
        if (!o->head)
            o->tail = NULL;
        it->next = NULL;
        if (b->tail)
            b->tail->next = it;
        else
            b->head = it;
        b->tail = it;
        bytes += it->cost;
        if (it->is_event) {
            b->n_events++;
        } else {
            b->n_lines++;
            o->n_lines--;
            o->line_bytes -= it->cost;
        }
    }
    if (o->dropping && o->line_bytes < o->cap / 2) {
        o->dropping = false;
        LOGI("agent", "output queue drained; %llu output lines dropped so far",
             (unsigned long long)o->dropped);
    }
}

void outbox_batch_free(struct outbox_batch *b)
{
    items_free(b->head);
    memset(b, 0, sizeof(*b));
}

int outbox_batch_pack(const struct outbox_batch *b, const char *session, uint8_t **data,
                      size_t *len)
{
    Kolo__ReportRequest req = KOLO__REPORT_REQUEST__INIT;
    Kolo__WorkerEvent **evs = NULL;
    Kolo__OutputLine **lines = NULL;
    size_t ne = 0, nl = 0;
    int rc = 0;

    *data = NULL;
    *len = 0;
    if (b->n_events && !(evs = malloc(b->n_events * sizeof(*evs))))
        return KOLO_ENOMEM;
    if (b->n_lines && !(lines = malloc(b->n_lines * sizeof(*lines)))) {
        free(evs);
        return KOLO_ENOMEM;
    }
    for (struct outbox_item *it = b->head; it; it = it->next) {
        if (it->is_event)
            evs[ne++] = &it->u.ev;
        else
            lines[nl++] = &it->u.line;
    }
    req.session = (char *)session;
    req.batch_seq = b->seq;
    req.n_events = ne;
    req.events = evs;
    req.n_lines = nl;
    req.lines = lines;
    size_t n = kolo__report_request__get_packed_size(&req);
    /* malloc(0) may return NULL; an empty message is still a valid one. */
    *data = malloc(n ? n : 1);
    if (!*data) {
        rc = KOLO_ENOMEM;
    } else {
        *len = kolo__report_request__pack(&req, *data);
    }
    free(evs);
    free(lines);
    return rc;
}
