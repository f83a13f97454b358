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
 *   9+2W.. payload    by item    tiny tensors riding in the round (below)
 *
 * Bit 0 of ready is the barrier bit (cache ids start at 1). W, the number
 * of bitmap words, follows from the largest cache id, which is the same on
 * every rank because caches change only at the same point of the same
 * round everywhere.
 *
 * THE PAYLOAD. A cached allreduce of a few bytes rides inside the round
 * that agrees it: every rank puts its (prescaled) data for every tiny
 * cached id in a slot of its own, zeros when it has none pending, and the
 * reduction sums (or MINs, ...) the slots with the round. When the round
 * agrees the id, every rank contributed, and the slot holds the result:
 * one exchange instead of a round and then an allreduce. The slots follow
 * from the cache (the same on every rank, like W), each item
 *
 *   hdr, ~hdr, data[words]   hdr = round_pay_hdr(id, dtype, op, count, words)
 *
 * its header reduced by MIN (round_pay_agreed finds a disagreement) and its
 * data by the item's element type and reduction, through the worker's
 * kernels (round_pay_fn: this module does no arithmetic on tensors). The
 * backends reduce the slots of the ranks in one order everywhere
 * (recursive doubling: lower OP higher; shared memory: rank order), so
 * every rank gets the same bits of a floating-point sum.
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

/* The payload's bounds: an item holds at most ROUND_PAY_ITEM_BYTES of
 * data, the payload at most ROUND_PAY_MAX_WORDS words (headers included):
 * past them a tensor runs as an allreduce after its round, as before. */
#define ROUND_PAY_ITEM_BYTES 64u
#define ROUND_PAY_MAX_WORDS 96u

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

/* A payload item's header: cache id, element type, reduction, elements
 * and data words. */
static inline uint64_t round_pay_hdr(uint32_t id, uint32_t dtype, uint32_t op, uint32_t count,
                                     uint32_t words)
{
    return (uint64_t)(id & 0xffffu) | (uint64_t)(dtype & 0xffu) << 16 |
           (uint64_t)(op & 0xffu) << 24 | (uint64_t)(count & 0xffffu) << 32 |
           (uint64_t)(words & 0xffffu) << 48;
}
static inline uint32_t round_pay_id(uint64_t hdr) { return (uint32_t)(hdr & 0xffffu); }
static inline uint32_t round_pay_dtype(uint64_t hdr) { return (uint32_t)(hdr >> 16) & 0xffu; }
static inline uint32_t round_pay_op(uint64_t hdr) { return (uint32_t)(hdr >> 24) & 0xffu; }
static inline uint32_t round_pay_count(uint64_t hdr) { return (uint32_t)(hdr >> 32) & 0xffffu; }
static inline uint32_t round_pay_words(uint64_t hdr) { return (uint32_t)(hdr >> 48); }

/* dst[i] = dst[i] OP src[i] for count elements of dtype (the worker's
 * reduce_into); AVERAGE sums. */
typedef void (*round_pay_fn)(uint32_t dtype, uint32_t op, void *dst, const void *src,
                             size_t count);

/* round_reduce: dst = dst (+) src, field by field (table above), over
 * nwords words. The header and bitmaps are exact, commutative and
 * associative: any reduction order gives every rank the same bits. The
 * payload's data goes through pay (NULL: left as dst has it), and only
 * where src's item header equals dst's. */
void round_reduce(uint64_t *dst, const uint64_t *src, size_t nwords, round_pay_fn pay);

/* round_check: 0 when the reduced vector v says every rank contributed
 * round k of cache epoch epoch with w bitmap words; otherwise writes why
 * (the ranks are out of step: a bug or a stale peer) and returns -1. */
int round_check(const uint64_t *v, uint64_t k, uint64_t epoch, uint32_t w, char *why,
                size_t len);

/* round_pay_agreed: the reduced vector v of nwords words holds, at word
 * `at` of v, the item hdr as every rank put it there, so its data is the
 * reduction of all the ranks' (the ranks laid out the same slots; where
 * they did not, the tensor runs as an allreduce after its round). */
bool round_pay_agreed(const uint64_t *v, size_t nwords, size_t at, uint64_t hdr);

/* ---------------------------------------------------------------- fusion */

/* What the fusion rule needs to know of one ready op. */
struct fusion_item {
    uint32_t dtype, op;
    double prescale, postscale;
    bool gpu;       /* on a device: never fused with host tensors */
    bool alone;     /* not an allreduce (a cached broadcast): never fused */
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
