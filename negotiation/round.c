/*
 * round.c - the readiness round's vector and the fusion rule (round.h).
 */
#include "round.h"

#include "abi.h"
#include "kolo/abi.h"

#include <stdio.h>
#include <string.h>

void round_init(uint64_t *v, uint64_t k, uint64_t epoch, uint32_t w, uint64_t cursor,
                uint64_t flags)
{
    v[ROUND_K] = k;
    v[ROUND_NK] = ~k;
    v[ROUND_EPOCH] = epoch;
    v[ROUND_NEPOCH] = ~epoch;
    v[ROUND_W] = w;
    v[ROUND_NW] = ~(uint64_t)w;
    v[ROUND_CURSOR] = cursor;
    v[ROUND_FLAGS] = flags;
    v[ROUND_WAIT] = 0;
    memset(v + ROUND_HDR, 0, 2u * (size_t)w * sizeof(uint64_t));
}

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

void round_reduce(uint64_t *restrict dst, const uint64_t *restrict src, size_t nwords,
                  round_pay_fn pay)
{
    if (nwords < ROUND_HDR)
        return;
    /* the bitmaps' width as this vector has it (round_check compares) */
    size_t w = dst[ROUND_W] < (nwords - ROUND_HDR) / 2u ? (size_t)dst[ROUND_W]
                                                        : (nwords - ROUND_HDR) / 2u;
    for (size_t i = 0; i <= ROUND_CURSOR; i++)
        dst[i] = min_u64(dst[i], src[i]);
    dst[ROUND_FLAGS] |= src[ROUND_FLAGS];
    if (src[ROUND_WAIT] > dst[ROUND_WAIT])
        dst[ROUND_WAIT] = src[ROUND_WAIT];
    uint64_t *ready = dst + ROUND_HDR, *invalid = ready + w;
    const uint64_t *sready = src + ROUND_HDR, *sinvalid = sready + w;
    for (size_t i = 0; i < w; i++) {
        ready[i] &= sready[i];
        invalid[i] |= sinvalid[i];
    }
    for (size_t at = ROUND_HDR + 2u * w; at + 2u <= nwords;) {
        uint64_t hdr = dst[at], shdr = src[at];
        size_t words = round_pay_words(hdr);
        if (at + 2u + words > nwords)
            break; /* malformed: round_pay_agreed says so */
        dst[at] = min_u64(hdr, shdr);
        dst[at + 1] = min_u64(dst[at + 1], src[at + 1]);
        size_t bytes = abi_dtype_size((int)round_pay_dtype(hdr)) * round_pay_count(hdr);
        if (pay && hdr == shdr && bytes && bytes <= words * 8u &&
            round_pay_op(hdr) < KOLO_OP_COUNT)
            pay(round_pay_dtype(hdr), round_pay_op(hdr), dst + at + 2, src + at + 2,
                round_pay_count(hdr));
        at += 2u + words;
    }
}

int round_check(const uint64_t *v, uint64_t k, uint64_t epoch, uint32_t w, char *why, size_t len)
{
    uint64_t kmin = v[ROUND_K], kmax = ~v[ROUND_NK];
    uint64_t emin = v[ROUND_EPOCH], emax = ~v[ROUND_NEPOCH];
    uint64_t wmin = v[ROUND_W], wmax = ~v[ROUND_NW];
    if (kmin == k && kmax == k && emin == epoch && emax == epoch && wmin == w && wmax == w)
        return 0;
    snprintf(why, len,
             "readiness round out of step: rounds %llu..%llu (this rank %llu), cache epochs "
             "%llu..%llu (%llu), bitmap words %llu..%llu (%u)",
             (unsigned long long)kmin, (unsigned long long)kmax, (unsigned long long)k,
             (unsigned long long)emin, (unsigned long long)emax, (unsigned long long)epoch,
             (unsigned long long)wmin, (unsigned long long)wmax, w);
    return -1;
}

bool round_pay_agreed(const uint64_t *v, size_t nwords, size_t at, uint64_t hdr)
{
    return at + 2u + round_pay_words(hdr) <= nwords && v[at] == hdr && ~v[at + 1] == hdr;
}

bool fusion_compatible(const struct fusion_item *a, const struct fusion_item *b)
{
    return a->dtype == b->dtype && a->op == b->op && a->prescale == b->prescale &&
           a->postscale == b->postscale && a->gpu == b->gpu;
}

static bool runs_alone(const struct fusion_item *f)
{
    return f->alone || (!f->gpu && f->bytes >= FUSION_ALONE_BYTES);
}

bool fusion_fits(const struct fusion_item *first, int64_t bytes, const struct fusion_item *next,
                 int64_t threshold)
{
    return threshold >= 0 && fusion_compatible(first, next) && !runs_alone(first) &&
           !runs_alone(next) && bytes + next->bytes <= threshold;
}

size_t fusion_run(const struct fusion_item *items, size_t n, int64_t threshold)
{
    if (n == 0)
        return 0;
    int64_t bytes = items[0].bytes;
    size_t j = 1;
    while (j < n && fusion_fits(&items[0], bytes, &items[j], threshold)) {
        bytes += items[j].bytes;
        j++;
    }
    return j;
}
