/*
 * round.h - the pure rules of negotiation, shared by libkolo and the
 * coordinator: the readiness round's vector and its reduction, and the
 * fusion rule. Nothing here does I/O, takes a lock or knows a struct of
 * the worker or of the coordinator, so every rule is tested as a table of
 * cases (tests/negotiation).
 *
 * THE ROUND (docs/design.md, "Negotiation")
 *
 * Once the coordinator gave a tensor a cache id, its readiness is agreed
 * by the ranks themselves: every rank contributes one vector of 64-bit
 * words and one reduction, with a different operation per field, gives
 * every rank the same result:
 *
 *   word   field      reduction  meaning
 *   0, 1   k, ~k      MIN, MIN   round number: MIN(~k) = ~MAX(k), so one
 *   2, 3   epoch, ~e  MIN, MIN   MIN over both words checks that every
 *   4, 5   W, ~W      MIN, MIN   rank sent the same k, cache epoch and W
 *   6      cursor     MIN        how far each rank has received the log
 *   7      flags      OR         ROUND_F_*
 *   8      wait       MAX        microseconds this rank's oldest pending op
 *                                had waited when the round began: reduced,
 *                                the longest any rank waited (telemetry;
 *                                a duration, so no clock needs to agree)
 *   9..    ready[W]   AND        bit id: this rank has cache id `id` pending
 *   9+W..  invalid[W] OR         bit id: drop id from every cache
 *
 * Bit 0 of ready is the barrier bit (cache ids start at 1). W, the number
 * of bitmap words, follows from the largest cache id, which is the same on
 * every rank because caches change only at the same point of the same
 * round everywhere.
 */
#ifndef KOLO_NEGOTIATION_ROUND_H
#define KOLO_NEGOTIATION_ROUND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Cache ids go from 1 to ROUND_MAX_ID; the bitmaps then take at most
 * 2 x 64 words (1 KiB per rank per round). */
#define ROUND_MAX_ID 4095u
#define ROUND_HDR 9u

/* flags */
#define ROUND_F_JOIN  1u /* a rank joined: everything goes through the coordinator */
#define ROUND_F_SLOW  2u /* while any rank sets it (ops a join sent there), too */
#define ROUND_F_SHUTDOWN 4u /* a rank is leaving (kolo_fini): the others' ops fail */
#define ROUND_F_TRACE 8u /* the job's timeline is on: every rank reports this round's ops */

enum { ROUND_K = 0, ROUND_NK, ROUND_EPOCH, ROUND_NEPOCH, ROUND_W, ROUND_NW, ROUND_CURSOR,
       ROUND_FLAGS, ROUND_WAIT };

/* round_words: the vector's length for bitmaps of w words. */
static inline size_t round_words(uint32_t w)
{
    return ROUND_HDR + 2u * (size_t)w;
}

/* round_bitmap_words: w for cache ids up to max_id (the barrier bit
 * included). */
static inline uint32_t round_bitmap_words(uint32_t max_id)
{
    return max_id / 64u + 1u;
}

/* round_init writes the header of this rank's vector (wait 0) and clears
 * both bitmaps; v has round_words(w) words. */
void round_init(uint64_t *v, uint64_t k, uint64_t epoch, uint32_t w, uint64_t cursor,
                uint64_t flags);

static inline void round_set(uint64_t *bitmap, uint32_t bit)
{
    bitmap[bit / 64u] |= 1ull << (bit % 64u);
}

static inline bool round_test(const uint64_t *bitmap, uint32_t bit)
{
    return (bitmap[bit / 64u] >> (bit % 64u)) & 1u;
}

static inline uint64_t *round_ready(uint64_t *v)
{
    return v + ROUND_HDR;
}

static inline uint64_t *round_invalid(uint64_t *v)
{
    return v + ROUND_HDR + v[ROUND_W];
}

/* round_reduce: dst = dst (+) src, field by field (table above), over
 * nwords words. Commutative and associative, and exact: any reduction
 * order gives every rank the same bits. */
void round_reduce(uint64_t *dst, const uint64_t *src, size_t nwords);

/* round_check: 0 when the reduced vector v says every rank contributed
 * round k of cache epoch epoch with w bitmap words; otherwise writes why
 * (the ranks are out of step: a bug or a stale peer) and returns -1. */
int round_check(const uint64_t *v, uint64_t k, uint64_t epoch, uint32_t w, char *why,
                size_t len);

/* ---------------------------------------------------------------- fusion */

/* What the fusion rule needs to know of one ready allreduce. */
struct fusion_item {
    uint32_t dtype, op;
    double prescale, postscale;
    bool gpu;       /* on a device: never fused with host tensors */
    int64_t bytes;
};

/* fusion_compatible: b may join a fused response that starts with a
 * (Horovod: same dtype, reduction and scaling, same kind of device). */
bool fusion_compatible(const struct fusion_item *a, const struct fusion_item *b);
/* A host tensor this large always runs alone, in place: fusing it would
 * copy it into the fusion buffer and back, which costs more than the
 * per-op overhead it saves (ResNet-50's 161 tensors at np 2 on 2 CPUs:
 * 77 ms a step fused at 64 MiB, 40 ms unfused). Device tensors keep
 * Horovod's rule (device copies are cheap next to a kernel launch). */
#define FUSION_ALONE_BYTES ((int64_t)1 << 20)
/* fusion_fits: next may join a fused response that starts with first and
 * holds bytes so far, under threshold (the rule fusion_run applies; the
 * coordinator's log applies the same one). */
bool fusion_fits(const struct fusion_item *first, int64_t bytes, const struct fusion_item *next,
                 int64_t threshold);

/* fusion_run: how many of items[0..n) form the response that starts at
 * items[0]: the longest run of compatible tensors whose bytes add up to
 * at most threshold (a single tensor always forms one). threshold < 0:
 * fusion is off (Horovod's HOROVOD_FUSION_THRESHOLD=0), every tensor on
 * its own. */
size_t fusion_run(const struct fusion_item *items, size_t n, int64_t threshold);

#endif
