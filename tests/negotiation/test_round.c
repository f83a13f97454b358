/*
 * test_round.c - the readiness round's reduction and the fusion rule
 * (negotiation/round.h), as tables of cases.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kolo/abi.h"
#include "round.h"
#include "test.h"

/* another flag bit than JOIN, to see the OR keep both */
#define FLAG_OTHER 2u

/* Ranks' contributions reduced in every order of a few permutations give
 * the same bits, and each field is reduced by its own rule. */
static void test_reduce_fields(void)
{
    enum { N = 4, W = 3 };
    uint64_t v[N][ROUND_HDR + 2 * W];
    uint64_t cursors[N] = {17, 9, 12, 9};
    uint64_t flags[N] = {0, ROUND_F_JOIN, 0, FLAG_OTHER};
    uint64_t waits[N] = {40, 0, 900, 7};
    for (int r = 0; r < N; r++) {
        round_init(v[r], 5, 2, W, cursors[r], flags[r]);
        CHECK_EQ_INT(v[r][ROUND_WAIT], 0);
        v[r][ROUND_WAIT] = waits[r];
        /* id 3 and id 70 ready everywhere; id 130 everywhere but rank 2;
         * the barrier bit on all; rank 1 invalidates id 64. */
        round_set(round_ready(v[r]), 0);
        round_set(round_ready(v[r]), 3);
        round_set(round_ready(v[r]), 70);
        if (r != 2)
            round_set(round_ready(v[r]), 130);
        if (r == 1)
            round_set(round_invalid(v[r]), 64);
    }
    int orders[3][N] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}};
    uint64_t first[ROUND_HDR + 2 * W];
    for (int o = 0; o < 3; o++) {
        uint64_t acc[ROUND_HDR + 2 * W];
        memcpy(acc, v[orders[o][0]], sizeof acc);
        for (int i = 1; i < N; i++)
            round_reduce(acc, v[orders[o][i]], ROUND_HDR + 2 * W, NULL);
        char why[256];
        CHECK_EQ_INT(round_check(acc, 5, 2, W, why, sizeof why), 0);
        CHECK_EQ_INT(acc[ROUND_CURSOR], 9);
        CHECK_EQ_INT(acc[ROUND_FLAGS], ROUND_F_JOIN | FLAG_OTHER);
        CHECK_EQ_INT(acc[ROUND_WAIT], 900);
        uint64_t *ready = round_ready(acc), *invalid = round_invalid(acc);
        CHECK(round_test(ready, 0));
        CHECK(round_test(ready, 3));
        CHECK(round_test(ready, 70));
        CHECK(!round_test(ready, 130));
        CHECK(round_test(invalid, 64));
        CHECK(!round_test(invalid, 3));
        if (o == 0)
            memcpy(first, acc, sizeof acc);
        else
            CHECK(memcmp(first, acc, sizeof acc) == 0);
    }
}

/* Ranks out of step: a different round, cache epoch or bitmap size is
 * caught by the MIN/MAX pairs, whichever rank is the odd one. */
static void test_check_out_of_step(void)
{
    struct {
        uint64_t k, epoch;
        uint32_t w;
        int ok;
    } odd[] = {
        {7, 1, 2, 1}, /* the same as the others */
        {8, 1, 2, 0}, /* one round ahead */
        {6, 1, 2, 0}, /* one behind */
        {7, 2, 2, 0}, /* another cache epoch */
    };
    for (size_t c = 0; c < sizeof odd / sizeof odd[0]; c++) {
        uint64_t a[ROUND_HDR + 4], b[ROUND_HDR + 4];
        round_init(a, 7, 1, 2, 0, 0);
        round_init(b, odd[c].k, odd[c].epoch, odd[c].w, 0, 0);
        round_reduce(a, b, ROUND_HDR + 4, NULL);
        char why[256] = "";
        int rc = round_check(a, 7, 1, 2, why, sizeof why);
        CHECK_EQ_INT(rc == 0, odd[c].ok);
        if (!odd[c].ok)
            CHECK(strstr(why, "out of step") != NULL);
    }
    /* Another bitmap size: the header says so even when the words differ. */
    uint64_t a[ROUND_HDR + 4], b[ROUND_HDR + 4];
    round_init(a, 7, 1, 2, 0, 0);
    round_init(b, 7, 1, 1, 0, 0);
    round_reduce(a, b, ROUND_HDR + 4, NULL);
    char why[256];
    CHECK(round_check(a, 7, 1, 2, why, sizeof why) != 0);
}

/* The payload's reduction, as the worker's kernels would do it for the
 * two types this table uses (float32 SUM, int64 MAX); counts calls. */
static int pay_calls;
static void test_pay(uint32_t dtype, uint32_t op, void *dst, const void *src, size_t count)
{
    pay_calls++;
    for (size_t i = 0; i < count; i++) {
        if (dtype == KOLO_FLOAT32 && op == KOLO_SUM)
            ((float *)dst)[i] += ((const float *)src)[i];
        else if (dtype == KOLO_INT64 && op == KOLO_MAX)
            ((int64_t *)dst)[i] = ((int64_t *)dst)[i] > ((const int64_t *)src)[i]
                                      ? ((int64_t *)dst)[i]
                                      : ((const int64_t *)src)[i];
    }
}

/* Tiny tensors in the round: a float32[3] SUM (2 data words) and an
 * int64 MAX (1 word) after bitmaps of W words. Every rank's slots reduce
 * with the round; a slot whose header a rank laid out differently is not
 * agreed (round_pay_agreed), and its data is not reduced with that
 * rank's; an item that claims more words than the vector has stops the
 * walk without reading past it; an unknown element type is never handed
 * to the kernel. */
static void test_payload(void)
{
    enum { N = 3, W = 1, P = (2 + 2) + (2 + 1), NW = ROUND_HDR + 2 * W + P };
    uint64_t h1 = round_pay_hdr(5, KOLO_FLOAT32, KOLO_SUM, 3, 2);
    uint64_t h2 = round_pay_hdr(9, KOLO_INT64, KOLO_MAX, 1, 1);
    CHECK_EQ_INT(round_pay_id(h1), 5);
    CHECK_EQ_INT(round_pay_dtype(h1), KOLO_FLOAT32);
    CHECK_EQ_INT(round_pay_op(h2), KOLO_MAX);
    CHECK_EQ_INT(round_pay_count(h1), 3);
    CHECK_EQ_INT(round_pay_words(h1), 2);
    uint64_t v[N][NW];
    for (int r = 0; r < N; r++) {
        round_init(v[r], 4, 0, W, 0, 0);
        uint64_t *pay = v[r] + round_words(W);
        memset(pay, 0, P * sizeof(uint64_t));
        pay[0] = h1;
        pay[1] = ~h1;
        float f[3] = {1.5f * (float)(r + 1), -2.0f, 0.25f};
        memcpy(pay + 2, f, sizeof f);
        pay[4] = h2;
        pay[5] = ~h2;
        int64_t m = r == 1 ? 70 : -3;
        memcpy(pay + 6, &m, sizeof m);
    }
    uint64_t acc[NW];
    memcpy(acc, v[0], sizeof acc);
    pay_calls = 0;
    for (int r = 1; r < N; r++)
        round_reduce(acc, v[r], NW, test_pay);
    CHECK_EQ_INT(pay_calls, 2 * (N - 1));
    char why[200];
    CHECK_EQ_INT(round_check(acc, 4, 0, W, why, sizeof why), 0);
    size_t at = round_words(W);
    CHECK(round_pay_agreed(acc, NW, at, h1));
    CHECK(round_pay_agreed(acc, NW, at + 4, h2));
    CHECK(!round_pay_agreed(acc, NW, at + 4, h1)); /* another item's header */
    CHECK(!round_pay_agreed(acc, at + 6, at + 4, h2)); /* its data past the end */
    float f[3];
    memcpy(f, acc + at + 2, sizeof f);
    CHECK(f[0] == 9.0f && f[1] == -6.0f && f[2] == 0.75f);
    int64_t m;
    memcpy(&m, acc + at + 6, sizeof m);
    CHECK_EQ_INT(m, 70);

    /* rank 2 laid out another id at the first slot: not agreed there, and
     * its float data stays out of the sum; the second slot still is */
    uint64_t odd = round_pay_hdr(6, KOLO_FLOAT32, KOLO_SUM, 3, 2);
    v[2][at] = odd;
    v[2][at + 1] = ~odd;
    memcpy(acc, v[0], sizeof acc);
    pay_calls = 0;
    for (int r = 1; r < N; r++)
        round_reduce(acc, v[r], NW, test_pay);
    CHECK_EQ_INT(pay_calls, 3);
    CHECK(!round_pay_agreed(acc, NW, at, h1));
    CHECK(!round_pay_agreed(acc, NW, at, odd));
    CHECK(round_pay_agreed(acc, NW, at + 4, h2));

    /* a header claiming 40 words in a 7-word payload, and an unknown
     * element type: the walk stops, the kernel never sees either */
    uint64_t a[NW], b[NW];
    round_init(a, 4, 0, W, 0, 0);
    memset(a + at, 0, P * sizeof(uint64_t));
    a[at] = round_pay_hdr(5, KOLO_FLOAT32, KOLO_SUM, 3, 40);
    memcpy(b, a, sizeof a);
    pay_calls = 0;
    round_reduce(a, b, NW, test_pay);
    a[at] = round_pay_hdr(5, 200, KOLO_SUM, 3, 2);
    memcpy(b, a, sizeof a);
    round_reduce(a, b, NW, test_pay);
    a[at] = round_pay_hdr(5, KOLO_FLOAT32, KOLO_SUM, 9, 2); /* 36 bytes in 16 */
    memcpy(b, a, sizeof a);
    round_reduce(a, b, NW, test_pay);
    CHECK_EQ_INT(pay_calls, 0);
}

static void test_sizes(void)
{
    CHECK_EQ_INT(round_bitmap_words(0), 1);
    CHECK_EQ_INT(round_bitmap_words(63), 1);
    CHECK_EQ_INT(round_bitmap_words(64), 2);
    CHECK_EQ_INT(round_bitmap_words(ROUND_MAX_ID), 64);
    CHECK_EQ_INT(round_words(3), ROUND_HDR + 6);
}

/* The fusion rule: the table of cases Horovod's fusion follows. */
static void test_fusion(void)
{
    struct fusion_item f32 = {.dtype = 7, .op = 0, .prescale = 1, .postscale = 1, .bytes = 400};
    struct fusion_item f64 = f32, avg = f32, pre = f32, gpu = f32, big = f32, huge = f32,
                       huge_gpu = f32, gpu_small = f32, bcast = f32;
    bcast.alone = true;
    huge.bytes = FUSION_ALONE_BYTES;
    huge_gpu.bytes = FUSION_ALONE_BYTES;
    huge_gpu.gpu = true;
    gpu_small.gpu = true;
    f64.dtype = 8;
    avg.op = 1;
    pre.prescale = 0.5;
    gpu.gpu = true;
    big.bytes = 1000;
    struct {
        const char *what;
        struct fusion_item items[4];
        size_t n;
        int64_t threshold;
        size_t want;
    } cases[] = {
        {"all alike", {f32, f32, f32, f32}, 4, 1 << 20, 4},
        {"threshold stops", {f32, f32, f32, f32}, 4, 1000, 2},
        {"exactly the threshold", {f32, f32, f32}, 3, 1200, 3},
        {"other dtype stops", {f32, f32, f64, f32}, 4, 1 << 20, 2},
        {"other op stops", {f32, avg}, 2, 1 << 20, 1},
        {"other prescale stops", {f32, pre}, 2, 1 << 20, 1},
        {"device stops", {f32, gpu}, 2, 1 << 20, 1},
        {"one bigger than the threshold", {big, f32}, 2, 500, 1},
        {"fusion off", {f32, f32}, 2, -1, 1},
        {"threshold 0 still runs one", {f32, f32}, 2, 0, 1},
        {"nothing", {f32}, 0, 100, 0},
        {"a large host tensor runs alone", {huge, f32, f32}, 3, 64 << 20, 1},
        {"a large host tensor ends a run", {f32, f32, huge, f32}, 4, 64 << 20, 2},
        {"just below the size still fuses", {f32, f32}, 2, 64 << 20, 2},
        {"large device tensors keep Horovod's rule", {huge_gpu, gpu_small}, 2, 64 << 20, 2},
        {"a broadcast runs alone", {bcast, f32, f32}, 3, 64 << 20, 1},
        {"a broadcast ends a run", {f32, f32, bcast}, 3, 64 << 20, 2},
        {"two broadcasts are two runs", {bcast, bcast}, 2, 64 << 20, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t got = fusion_run(cases[c].items, cases[c].n, cases[c].threshold);
        if (got != cases[c].want)
            fprintf(stderr, "fusion case '%s': %zu, want %zu\n", cases[c].what, got,
                    cases[c].want);
        CHECK_EQ_INT(got, cases[c].want);
    }
}

int main(void)
{
    test_reduce_fields();
    test_check_out_of_step();
    test_payload();
    test_sizes();
    test_fusion();
    TEST_DONE();
}
