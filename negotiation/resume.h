/*
 * resume.h - taking a generation's negotiation back after a coordinator
 * restart, from what the ranks hold.
 *
 * A restarted coordinator has the job and its generation (SQLite) but not
 * the negotiation: the log, the cursors, the response cache. Each rank
 * sends what it holds (coordinator/coord_negot.c, "resuming"):
 *   - its cursor (the first log index it has not received) and the packed
 *     entries it received lately: the log between the slowest cursor and
 *     the fastest is rebuilt from these copies (an entry is identical on
 *     every rank that has it);
 *   - with readiness rounds, its response cache, the cache's hash and the
 *     first index it has not run: the coordinator's id map is rebuilt from
 *     these tables.
 *
 * The tables can differ only while some rank has not yet run a log entry
 * that gives an id, or a round that drops one (rounds go on while the
 * coordinator is away): a rank holding an id another lacks is such a lag
 * and fine; two ranks naming one id differently are fine only if an entry
 * some rank has not run gives that id. Anything else (a table that does
 * not hash to its hash, an id named twice with nothing to explain it, a
 * signature that differs) means the caches can no longer be trusted: the
 * coordinator then appends a cache_reset entry and every rank clears its
 * cache when it runs it, at the same point of the log.
 */
#ifndef KOLO_NEGOTIATION_RESUME_H
#define KOLO_NEGOTIATION_RESUME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "kolo.pb-c.h"

/* What one rank sent (borrowed from its NegotiateRequest). */
struct resume_rank {
    uint64_t cursor;   /* the first log index it has not received */
    uint64_t executed; /* the first log index it has not run */
    const ProtobufCBinaryData *held; /* packed Responses it received lately */
    size_t nheld;
    Kolo__CacheEntry *const *cache; /* its response cache */
    size_t ncache;
    uint64_t cache_hash;
    bool rounds; /* it runs readiness rounds (it sent its table) */
};

/* The rebuilt part of the log: entries base..top-1, unpacked. */
struct resume_log {
    uint64_t base, top;
    Kolo__Response **ents; /* [top - base] */
};

/* resume_log_rebuild: the entries between the slowest and the fastest
 * cursor, out of the copies the ranks hold (0). keep_cache_ids false
 * zeroes the entries' cache ids (ranks without rounds drop their caches).
 * KOLO_EPEER with why: the cursors are more than max_gap apart, or an
 * entry is nowhere; KOLO_ENOMEM. */
int resume_log_rebuild(const struct resume_rank *ranks, int size, uint64_t max_gap,
                       bool keep_cache_ids, struct resume_log *out, char *why, size_t whylen);
void resume_log_free(struct resume_log *l);
/* resume_log_answers: an entry at or after cursor names `name` (the rank's
 * request for it is answered already). */
bool resume_log_answers(const struct resume_log *l, uint64_t cursor, const char *name);

/* resume_cache rebuilds the coordinator's id map `into` (empty) from the
 * ranks' tables. 0: restored (ids some rank has not settled yet are left
 * out: a full request for such a name gets a fresh id through the log, so
 * none is ever given twice); 1: the tables cannot be trusted, why says
 * which ranks and id, and every cache must be cleared; KOLO_ENOMEM.
 * *next_id: above every id a table or a held entry mentions. */
int resume_cache(struct tensor_cache *into, const struct resume_rank *ranks, int size,
                 uint32_t *next_id, char *why, size_t whylen);

/* resume_table_load binds the entries of a rank's table (its message)
 * into tc, empty (0; 1 with *bad the first entry that is malformed: an id
 * out of range, no name, an id or a name twice; KOLO_ENOMEM). */
int resume_table_load(struct tensor_cache *tc, Kolo__CacheEntry *const *cache, size_t n,
                      size_t *bad);

/* resume_table_of: tc's entries as messages, in id order: *out points
 * into the returned block (one free()), which borrows tc's names and
 * shapes, so tc must outlive its use. NULL with *n 0: tc is empty, or no
 * memory. A rank's resume sends its table so (worker/runtime/ctx.c), and
 * a new elastic generation hands the ranks the coordinator's so
 * (coordinator/coord_negot.c). */
void *resume_table_of(const struct tensor_cache *tc, Kolo__CacheEntry ***out, size_t *n);

/* tensor_req_from_msg: a request's signature out of its message (NULL:
 * out of memory); tensor_req_to_msg fills m (initialised by the caller)
 * from t, borrowing t's arrays and name. */
struct tensor_req *tensor_req_from_msg(const Kolo__TensorRequest *m);
void tensor_req_to_msg(const struct tensor_req *t, const char *name, Kolo__TensorRequest *m);

#endif
