/*
 * test_reduce.c - the element-wise reductions against a scalar reference.
 *
 * The reference here is written independently of worker/coll/reduce.c: half
 * precision conversions go through frexp/ldexp/nearbyint in double for
 * any (exponent, mantissa) format, integer arithmetic through 64-bit
 * unsigned values cut to width, and MIN/MAX through isnan/signbit. Every
 * dtype x op is checked for the counts the vector loops find awkward
 * (empty, shorter than a vector, one off a vector, a remainder, large:
 * 1<<20, 1<<16 under the sanitizers), at an aligned and a one-element-off
 * address, and with the output aliased to either input. The same file also runs against the portable
 * build of reduce.c (no F16C), see reduce.cmake.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "reduce.h"
#include "test.h"

/* ---------------------------------------------------------------- random */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* xorshift64*: deterministic, so a failure reproduces. */
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* ---------------------------------------------------------------- bits */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t f64_bits(double f)
{
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---------------------------------------------------------------- reference
 * conversions for a binary format with ebits exponent bits and mant
 * stored mantissa bits: float16 is (5, 10), bfloat16 (8, 7). */

struct half_format {
    int ebits, mant;
};

static const struct half_format FMT_F16 = {5, 10};
static const struct half_format FMT_BF16 = {8, 7};

static int fmt_bias(struct half_format f)
{
    return (1 << (f.ebits - 1)) - 1;
}

static unsigned fmt_exp_mask(struct half_format f)
{
    return (1u << f.ebits) - 1;
}

static bool half_is_nan(struct half_format f, uint16_t h)
{
    unsigned e = (h >> f.mant) & fmt_exp_mask(f);
    return e == fmt_exp_mask(f) && (h & ((1u << f.mant) - 1)) != 0;
}

/* The value of h, exactly, as a double (NaN for any NaN). */
static double ref_widen(struct half_format f, uint16_t h)
{
    int sign = (h >> (f.ebits + f.mant)) & 1;
    unsigned e = (h >> f.mant) & fmt_exp_mask(f);
    unsigned m = h & ((1u << f.mant) - 1);
    double v;
    if (e == fmt_exp_mask(f))
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - fmt_bias(f) - f.mant);
    else
        v = ldexp((double)(m + (1u << f.mant)), (int)e - fmt_bias(f) - f.mant);
    return sign ? -v : v;
}

/* The bits of v >= 0 (finite) rounded to nearest-even in the format. */
static uint16_t ref_round_magnitude(struct half_format f, double v)
{
    int emin = 1 - fmt_bias(f), emax = fmt_bias(f);
    if (v == 0)
        return 0;
    int ex;
    frexp(v, &ex);
    int e = ex - 1; /* v = 1.xxx * 2^e */
    if (e < emin)
        e = emin; /* subnormal: the quantum stops shrinking */
    double quantum = ldexp(1.0, e - f.mant);
    double k = nearbyint(v / quantum); /* the division is exact */
    if (k >= ldexp(1.0, f.mant + 1)) { /* rounded up into the next binade */
        k /= 2;
        e++;
    }
    if (e > emax)
        return (uint16_t)(fmt_exp_mask(f) << f.mant);
    if (k < ldexp(1.0, f.mant))
        return (uint16_t)k; /* subnormal */
    return (uint16_t)(((unsigned)(e + fmt_bias(f)) << f.mant) | ((unsigned)k - (1u << f.mant)));
}

/* A float rounded into the format. NaNs keep their sign and top payload
 * bits and become quiet. */
static uint16_t ref_narrow(struct half_format f, float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 31) << (f.ebits + f.mant));
    if (isnan(x)) {
        unsigned payload = (u & 0x7fffffu) >> (23 - f.mant);
        return (uint16_t)(sign | (fmt_exp_mask(f) << f.mant) | (1u << (f.mant - 1)) | payload);
    }
    if (isinf(x))
        return (uint16_t)(sign | (fmt_exp_mask(f) << f.mant));
    return (uint16_t)(sign | ref_round_magnitude(f, fabs((double)x)));
}

/* ---------------------------------------------------------------- elements */

static size_t dsize(kolo_dtype t)
{
    static const size_t sizes[KOLO_DTYPE_COUNT] = {1, 1, 2, 4, 8, 2, 2, 4, 8};
    return sizes[t];
}

static const char *dname(kolo_dtype t)
{
    static const char *names[KOLO_DTYPE_COUNT] = {
        "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
    return names[t];
}

static bool is_float(kolo_dtype t)
{
    return t >= KOLO_FLOAT16;
}

static int64_t get_int(kolo_dtype t, const void *p, size_t i)
{
    switch (t) {
    case KOLO_UINT8:
        return ((const uint8_t *)p)[i];
    case KOLO_INT8:
        return ((const int8_t *)p)[i];
    case KOLO_INT16:
        return ((const int16_t *)p)[i];
    case KOLO_INT32:
        return ((const int32_t *)p)[i];
    default:
        return ((const int64_t *)p)[i];
    }
}

/* Stores the low bits of v, two's complement, without relying on the
 * implementation-defined conversion of out-of-range values to signed. */
static void put_wrapped(kolo_dtype t, void *p, size_t i, uint64_t v)
{
    switch (t) {
    case KOLO_UINT8:
    case KOLO_INT8: {
        uint8_t b = (uint8_t)v;
        memcpy((char *)p + i, &b, 1);
        break;
    }
    case KOLO_INT16: {
        uint16_t b = (uint16_t)v;
        memcpy((char *)p + 2 * i, &b, 2);
        break;
    }
    case KOLO_INT32: {
        uint32_t b = (uint32_t)v;
        memcpy((char *)p + 4 * i, &b, 4);
        break;
    }
    default:
        memcpy((char *)p + 8 * i, &v, 8);
        break;
    }
}

static double get_float(kolo_dtype t, const void *p, size_t i)
{
    switch (t) {
    case KOLO_FLOAT16:
        return ref_widen(FMT_F16, ((const uint16_t *)p)[i]);
    case KOLO_BFLOAT16:
        return ref_widen(FMT_BF16, ((const uint16_t *)p)[i]);
    case KOLO_FLOAT32:
        return ((const float *)p)[i];
    default:
        return ((const double *)p)[i];
    }
}

/* Float32 results are computed in double and rounded once: for +, * of
 * two floats that equals the float operation, since double has more
 * than twice float's precision. The 16-bit types round through float32
 * like the implementation. */
static void put_float(kolo_dtype t, void *p, size_t i, double v)
{
    switch (t) {
    case KOLO_FLOAT16:
        ((uint16_t *)p)[i] = ref_narrow(FMT_F16, (float)v);
        break;
    case KOLO_BFLOAT16:
        ((uint16_t *)p)[i] = ref_narrow(FMT_BF16, (float)v);
        break;
    case KOLO_FLOAT32:
        ((float *)p)[i] = (float)v;
        break;
    default:
        ((double *)p)[i] = v;
        break;
    }
}

static bool elem_is_nan(kolo_dtype t, const void *p, size_t i)
{
    switch (t) {
    case KOLO_FLOAT16:
        return half_is_nan(FMT_F16, ((const uint16_t *)p)[i]);
    case KOLO_BFLOAT16:
        return half_is_nan(FMT_BF16, ((const uint16_t *)p)[i]);
    case KOLO_FLOAT32:
        return isnan(((const float *)p)[i]);
    case KOLO_FLOAT64:
        return isnan(((const double *)p)[i]);
    default:
        return false;
    }
}

/* Equal bits, or both NaN (which NaN comes out is not specified). */
static bool elem_same(kolo_dtype t, const void *x, const void *y, size_t i)
{
    if (elem_is_nan(t, x, i) && elem_is_nan(t, y, i))
        return true;
    return memcmp((const char *)x + i * dsize(t), (const char *)y + i * dsize(t), dsize(t)) == 0;
}

/* IEEE 754-2019 minimum/maximum: NaN wins, -0 < +0. */
static double ref_min(double x, double y)
{
    if (isnan(x) || isnan(y))
        return NAN;
    if (x == y)
        return signbit(x) ? x : y;
    return x < y ? x : y;
}

static double ref_max(double x, double y)
{
    if (isnan(x) || isnan(y))
        return NAN;
    if (x == y)
        return signbit(x) ? y : x;
    return x > y ? x : y;
}

static void ref_one(kolo_dtype t, kolo_op op, void *out, const void *a, const void *b, size_t i)
{
    if (is_float(t)) {
        double x = get_float(t, a, i), y = get_float(t, b, i), r;
        switch (op) {
        case KOLO_MIN:
            r = ref_min(x, y);
            break;
        case KOLO_MAX:
            r = ref_max(x, y);
            break;
        case KOLO_PRODUCT:
            r = x * y;
            break;
        default:
            r = x + y;
            break;
        }
        put_float(t, out, i, r);
        return;
    }
    int64_t x = get_int(t, a, i), y = get_int(t, b, i);
    uint64_t r;
    switch (op) {
    case KOLO_MIN:
        r = (uint64_t)(x < y ? x : y);
        break;
    case KOLO_MAX:
        r = (uint64_t)(x > y ? x : y);
        break;
    case KOLO_PRODUCT:
        r = (uint64_t)x * (uint64_t)y;
        break;
    default:
        r = (uint64_t)x + (uint64_t)y;
        break;
    }
    put_wrapped(t, out, i, r);
}

/* ---------------------------------------------------------------- data */

static void fill_random(kolo_dtype t, void *p, size_t n)
{
    static const double specials[] = {NAN,     -NAN, INFINITY, -INFINITY, 0.0,     -0.0,   1.0,
                                      -1.0,    0.5,  1e-40,    -1e-45,    6.1e-5,  6e-8,   65504.0,
                                      65520.0, 3e38, -3.4e38,  1e300,     -1e-310, 2048.0, 1.5};
    const size_t nspecials = sizeof specials / sizeof specials[0];
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next();
        if (!is_float(t)) {
            put_wrapped(t, p, i, r);
            continue;
        }
        unsigned kind = (unsigned)(r % 16);
        uint64_t bits = rng_next();
        if (kind == 0) { /* any bit pattern: every class, every exponent */
            switch (t) {
            case KOLO_FLOAT16:
            case KOLO_BFLOAT16:
                ((uint16_t *)p)[i] = (uint16_t)bits;
                break;
            case KOLO_FLOAT32:
                ((float *)p)[i] = f32_from((uint32_t)bits);
                break;
            default:
                memcpy((double *)p + i, &bits, 8);
                break;
            }
        } else if (kind == 1) {
            put_float(t, p, i, specials[bits % nspecials]);
        } else {
            /* Small values: sums round, products stay finite, and equal
             * operands (MIN/MAX ties, signed zeros) are common. */
            put_float(t, p, i, (double)((int64_t)(bits % 2001) - 1000) / 8.0);
        }
    }
}

/* ---------------------------------------------------------------- checks */

static bool same_buffers(kolo_dtype t, const void *got, const void *want, size_t n,
                         const char *what, kolo_op op)
{
    for (size_t i = 0; i < n; i++) {
        if (!elem_same(t, got, want, i)) {
            uint64_t g = 0, w = 0;
            memcpy(&g, (const char *)got + i * dsize(t), dsize(t));
            memcpy(&w, (const char *)want + i * dsize(t), dsize(t));
            fprintf(stderr, "%s %s op %d: element %zu of %zu is 0x%llx, want 0x%llx\n", what,
                    dname(t), (int)op, i, n, (unsigned long long)g, (unsigned long long)w);
            return false;
        }
    }
    return true;
}

/* The large count: a long run of the vector loops. The sanitizer builds
 * (AddressSanitizer runs this test, unoptimised) check the loops' edges
 * and accesses, not their arithmetic again at length: 64 Ki elements,
 * still 1,024 float16 blocks, keep the test to seconds instead of
 * minutes there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LARGE_COUNT (1u << 16)
#else
#define LARGE_COUNT (1u << 20)
#endif
static const size_t COUNTS[] = {0, 1, 7, 15, 16, 17, 4099, LARGE_COUNT};

/*
 * One (dtype, op, count): every entry point and aliasing, at element 0 of
 * a 64-byte aligned buffer and one element further. The element after
 * the last is a canary that must survive.
 */
static void check_op(kolo_dtype t, kolo_op op, size_t n)
{
    size_t sz = dsize(t), bytes = (n + 2) * sz;
    size_t alloc = (bytes + 63) / 64 * 64;
    unsigned char *a = aligned_alloc(64, alloc), *b = aligned_alloc(64, alloc);
    unsigned char *want = aligned_alloc(64, alloc), *dst = aligned_alloc(64, alloc);
    unsigned char *self_want = aligned_alloc(64, alloc);
    REQUIRE(a && b && want && dst && self_want);
    fill_random(t, a, n + 2);
    fill_random(t, b, n + 2);

    for (size_t off = 0; off <= 1; off++) {
        unsigned char *pa = a + off * sz, *pb = b + off * sz, *pd = dst + off * sz;
        unsigned char *pw = want + off * sz, *ps = self_want + off * sz;
        memcpy(want, a, bytes); /* canaries around: the input's own bytes */
        memcpy(self_want, a, bytes);
        for (size_t i = 0; i < n; i++) {
            ref_one(t, op, pw, pa, pb, i);
            ref_one(t, op, ps, pa, pa, i);
        }

        memcpy(dst, a, bytes);
        reduce_into(t, op, pd, pb, n);
        CHECK(same_buffers(t, dst, want, n + 2, "reduce_into", op));

        memcpy(dst, a, bytes);
        reduce_into(t, op, pd, pd, n);
        CHECK(same_buffers(t, dst, self_want, n + 2, "reduce_into dst==src", op));

        memcpy(dst, a, bytes);
        reduce_two(t, op, pd, pa, pb, n);
        CHECK(same_buffers(t, dst, want, n + 2, "reduce_two", op));

        memcpy(dst, a, bytes);
        reduce_two(t, op, pd, pd, pb, n);
        CHECK(same_buffers(t, dst, want, n + 2, "reduce_two dst==a", op));

        /* dst == b: dst starts as b, with a's canaries to compare. */
        memcpy(dst, a, bytes);
        memcpy(pd, pb, n * sz);
        reduce_two(t, op, pd, pa, pd, n);
        CHECK(same_buffers(t, dst, want, n + 2, "reduce_two dst==b", op));

        memcpy(dst, a, bytes);
        reduce_two(t, op, pd, pa, pa, n);
        CHECK(same_buffers(t, dst, self_want, n + 2, "reduce_two a==b", op));
    }
    free(a);
    free(b);
    free(want);
    free(dst);
    free(self_want);
}

static void test_all_ops(void)
{
    for (int t = 0; t < KOLO_DTYPE_COUNT; t++)
        for (int op = 0; op < KOLO_OP_COUNT; op++)
            for (size_t c = 0; c < sizeof COUNTS / sizeof COUNTS[0]; c++)
                check_op((kolo_dtype)t, (kolo_op)op, COUNTS[c]);
}

/* ---------------------------------------------------------------- conversions */

/* All 65536 patterns of each 16-bit format, through the scalar functions
 * and through the vector loops (MAX with -inf is the identity, apart
 * from NaNs, which it keeps NaN). */
static void test_conversions_exhaustive(void)
{
    static uint16_t all[65536], out[65536], neg_inf16[65536], neg_infbf[65536];
    for (unsigned h = 0; h < 65536; h++) {
        all[h] = (uint16_t)h;
        neg_inf16[h] = 0xfc00;
        neg_infbf[h] = 0xff80;
    }
    int bad16 = 0, badbf = 0;
    for (unsigned h = 0; h < 65536; h++) {
        uint16_t hh = (uint16_t)h;
        /* float16 -> float32: exact; a NaN comes out quiet with its payload */
        float got = f16_to_f32(hh);
        double want = ref_widen(FMT_F16, hh);
        if (half_is_nan(FMT_F16, hh)) {
            uint32_t wbits = ((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
            bad16 += f32_bits(got) != wbits;
            bad16 += f32_to_f16(got) != (hh | 0x0200u);
        } else {
            bad16 += f32_bits(got) != f32_bits((float)want);
            bad16 += f32_to_f16(got) != hh; /* round trip is the identity */
        }
        float gotb = bf16_to_f32(hh);
        if (half_is_nan(FMT_BF16, hh)) {
            badbf += !isnan(gotb) || (f32_bits(gotb) >> 16) != h;
            badbf += f32_to_bf16(gotb) != (hh | 0x0040u);
        } else {
            badbf += f32_bits(gotb) != f32_bits((float)ref_widen(FMT_BF16, hh));
            badbf += f32_to_bf16(gotb) != hh;
        }
    }
    CHECK_EQ_INT(bad16, 0);
    CHECK_EQ_INT(badbf, 0);

    reduce_two(KOLO_FLOAT16, KOLO_MAX, out, all, neg_inf16, 65536);
    for (unsigned h = 0; h < 65536; h++) {
        uint16_t want = half_is_nan(FMT_F16, (uint16_t)h) ? (uint16_t)(h | 0x0200u) : (uint16_t)h;
        bad16 += out[h] != want;
    }
    reduce_two(KOLO_BFLOAT16, KOLO_MAX, out, all, neg_infbf, 65536);
    for (unsigned h = 0; h < 65536; h++)
        badbf +=
            !(out[h] == h || (half_is_nan(FMT_BF16, (uint16_t)h) && half_is_nan(FMT_BF16, out[h])));
    CHECK_EQ_INT(bad16, 0);
    CHECK_EQ_INT(badbf, 0);

    /* Scaling every pattern rounds through the vector store: 0.5 makes
     * exact ties among the subnormals, 1/3 inexact results everywhere. */
    static const double factors[] = {0.5, 1.0 / 3.0, -1.75, 1024.0};
    for (size_t k = 0; k < sizeof factors / sizeof factors[0]; k++) {
        float f = (float)factors[k];
        memcpy(out, all, sizeof out);
        reduce_scale(KOLO_FLOAT16, out, 65536, factors[k]);
        int bad = 0;
        for (unsigned h = 0; h < 65536; h++) {
            uint16_t want = ref_narrow(FMT_F16, (float)ref_widen(FMT_F16, (uint16_t)h) * f);
            bad +=
                !(out[h] == want || (half_is_nan(FMT_F16, out[h]) && half_is_nan(FMT_F16, want)));
        }
        memcpy(out, all, sizeof out);
        reduce_scale(KOLO_BFLOAT16, out, 65536, factors[k]);
        for (unsigned h = 0; h < 65536; h++) {
            uint16_t want = ref_narrow(FMT_BF16, (float)ref_widen(FMT_BF16, (uint16_t)h) * f);
            bad +=
                !(out[h] == want || (half_is_nan(FMT_BF16, out[h]) && half_is_nan(FMT_BF16, want)));
        }
        CHECK_EQ_INT(bad, 0);
    }
}

/* float32 -> 16 bits against the reference: every exact tie between two
 * neighbouring values and the floats just either side of it, plus a
 * stride through all 2^32 patterns. These go through the scalar
 * functions; the vector stores are covered by the scale test above and
 * by the op matrix. */
static void test_narrowing(void)
{
    int bad16 = 0, badbf = 0;
    for (unsigned h = 0; h < 0x7c00; h++) {
        /* midpoint between h and h+1 is exact in float */
        double lo = ref_widen(FMT_F16, (uint16_t)h), hi = ref_widen(FMT_F16, (uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        float around[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid};
        for (int k = 0; k < 4; k++)
            bad16 += f32_to_f16(around[k]) != ref_narrow(FMT_F16, around[k]);
        /* ties round to the even neighbour */
        if (h < 0x7bff)
            bad16 += f32_to_f16(mid) != ((h & 1) ? h + 1 : h);
    }
    for (unsigned h = 0; h < 0x7f80; h++) {
        float mid = f32_from(((uint32_t)h << 16) | 0x8000u);
        float around[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid};
        for (int k = 0; k < 4; k++)
            badbf += f32_to_bf16(around[k]) != ref_narrow(FMT_BF16, around[k]);
        badbf += f32_to_bf16(mid) != ((h & 1) ? h + 1 : h);
    }
    for (uint64_t u = 0; u < (1ull << 32); u += 257) {
        float f = f32_from((uint32_t)u);
        bad16 += f32_to_f16(f) != ref_narrow(FMT_F16, f);
        badbf += f32_to_bf16(f) != ref_narrow(FMT_BF16, f);
    }
    CHECK_EQ_INT(bad16, 0);
    CHECK_EQ_INT(badbf, 0);
}

static uint16_t h16(double v)
{
    return ref_narrow(FMT_F16, (float)v);
}

static uint16_t hbf(double v)
{
    return ref_narrow(FMT_BF16, (float)v);
}

/* Named rounding cases, so a failure reads as what broke. */
static void test_rounding_cases(void)
{
    /* float16: spacing 2^-10 at 1, so 1 + 2^-11 is a tie. */
    CHECK_EQ_INT(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    CHECK_EQ_INT(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    CHECK_EQ_INT(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    CHECK_EQ_INT(f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(f32_to_f16(65519.99f), 0x7bff);
    CHECK_EQ_INT(f32_to_f16(65520.0f), 0x7c00); /* tie above the largest: to infinity */
    CHECK_EQ_INT(f32_to_f16(-1e9f), 0xfc00);
    CHECK_EQ_INT(f32_to_f16(0x1p-24f), 0x0001); /* smallest subnormal */
    CHECK_EQ_INT(f32_to_f16(0x1p-25f), 0x0000); /* tie: to even zero */
    CHECK_EQ_INT(f32_to_f16(0x1p-25f + 0x1p-40f), 0x0001);
    CHECK_EQ_INT(f32_to_f16(3 * 0x1p-25f), 0x0002); /* tie between 1 and 2 units */
    CHECK_EQ_INT(f32_to_f16(-0x1p-26f), 0x8000);
    CHECK_EQ_INT(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400); /* rounds up into the normals */
    CHECK_EQ_INT(f32_to_f16(1e-45f), 0x0000);
    CHECK_EQ_INT(f32_to_f16(-0.0f), 0x8000);
    /* bfloat16: spacing 2^-7 at 1. */
    CHECK_EQ_INT(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    CHECK_EQ_INT(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    CHECK_EQ_INT(f32_to_bf16(FLT_MAX), 0x7f80);
    CHECK_EQ_INT(f32_to_bf16(-FLT_MAX), 0xff80);
    CHECK_EQ_INT(f32_to_bf16(f32_from(0x7f7f7fffu)), 0x7f7f);
    CHECK_EQ_INT(f32_to_bf16(f32_from(0x00008000u)), 0x0000); /* subnormal tie to even */
    CHECK_EQ_INT(f32_to_bf16(f32_from(0x00018000u)), 0x0002);
    /* a NaN whose payload is only in the low bits stays NaN */
    CHECK_EQ_INT(f32_to_bf16(f32_from(0x7f800001u)), 0x7fc0);
    CHECK_EQ_INT(f32_to_bf16(f32_from(0xff800001u)), 0xffc0);
    CHECK_EQ_INT(f32_to_f16(f32_from(0x7f800001u)), 0x7e00);

    /* Sums are rounded once, from float32. */
    uint16_t a[17], b[17], d[17];
    for (int i = 0; i < 17; i++) {
        a[i] = h16(2048.0);
        b[i] = h16(i % 2 ? 1.0 : 3.0); /* 2049 ties down to 2048, 2051 up to 2052 */
    }
    reduce_two(KOLO_FLOAT16, KOLO_SUM, d, a, b, 17);
    for (int i = 0; i < 17; i++)
        CHECK_EQ_INT(d[i], h16(i % 2 ? 2048.0 : 2052.0));
    for (int i = 0; i < 17; i++) {
        a[i] = h16(65504.0);
        b[i] = h16(i % 2 ? 16.0 : 8.0); /* 65520 ties to infinity, 65512 to 65504 */
    }
    reduce_into(KOLO_FLOAT16, KOLO_SUM, a, b, 17);
    for (int i = 0; i < 17; i++)
        CHECK_EQ_INT(a[i], i % 2 ? 0x7c00 : 0x7bff);
    for (int i = 0; i < 17; i++) {
        a[i] = hbf(256.0);
        b[i] = hbf(i % 2 ? 1.0 : 3.0); /* bfloat16 spacing at 256 is 2 */
    }
    reduce_into(KOLO_BFLOAT16, KOLO_SUM, a, b, 17);
    for (int i = 0; i < 17; i++)
        CHECK_EQ_INT(a[i], hbf(i % 2 ? 256.0 : 260.0));
}

/* ---------------------------------------------------------------- specials */

static void test_integer_wrap(void)
{
    int8_t i8a[] = {127, -128, -128, 100}, i8b[] = {1, -1, -1, 100};
    reduce_into(KOLO_INT8, KOLO_SUM, i8a, i8b, 4);
    CHECK_EQ_INT(i8a[0], -128);
    CHECK_EQ_INT(i8a[1], 127);
    CHECK_EQ_INT(i8a[3], -56);
    int8_t i8c[] = {-128, 16}, i8d[] = {-1, 16};
    reduce_into(KOLO_INT8, KOLO_PRODUCT, i8c, i8d, 2);
    CHECK_EQ_INT(i8c[0], -128);
    CHECK_EQ_INT(i8c[1], 0);
    uint8_t u8a[] = {255, 16}, u8b[] = {1, 17};
    reduce_into(KOLO_UINT8, KOLO_SUM, u8a, u8b, 2);
    CHECK_EQ_INT(u8a[0], 0);
    CHECK_EQ_INT(u8a[1], 33);
    reduce_into(KOLO_UINT8, KOLO_PRODUCT, u8b, u8b, 2);
    CHECK_EQ_INT(u8b[0], 1);
    CHECK_EQ_INT(u8b[1], 33); /* 289 mod 256 */
    int16_t i16a[] = {300, -32768}, i16b[] = {300, 32767};
    reduce_into(KOLO_INT16, KOLO_PRODUCT, i16a, i16b, 2);
    CHECK_EQ_INT(i16a[0], 24464); /* 90000 - 65536 */
    CHECK_EQ_INT(i16a[1], -32768);
    int32_t i32a[] = {INT32_MAX, INT32_MIN, 65536}, i32b[] = {1, -1, 65536};
    reduce_into(KOLO_INT32, KOLO_SUM, i32a, i32b, 3);
    CHECK_EQ_INT(i32a[0], INT32_MIN);
    CHECK_EQ_INT(i32a[1], INT32_MAX);
    reduce_into(KOLO_INT32, KOLO_PRODUCT, i32a + 2, i32b + 2, 1);
    CHECK_EQ_INT(i32a[2], 0);
    int64_t i64a[] = {INT64_MAX, INT64_MIN, INT64_C(1) << 62}, i64b[] = {1, -1, 4};
    int64_t i64d[3];
    reduce_two(KOLO_INT64, KOLO_SUM, i64d, i64a, i64b, 3);
    CHECK(i64d[0] == INT64_MIN);
    CHECK(i64d[1] == INT64_MAX);
    reduce_two(KOLO_INT64, KOLO_PRODUCT, i64d, i64a, i64b, 3);
    CHECK(i64d[0] == INT64_MAX);
    CHECK(i64d[1] == INT64_MIN);
    CHECK(i64d[2] == 0);
}

static void test_float_specials(void)
{
    const float x[] = {NAN, 1.0f, NAN, -0.0f, 0.0f, INFINITY, -INFINITY, INFINITY, 1.0f};
    const float y[] = {1.0f, NAN, NAN, 0.0f, -0.0f, 1.0f, 1.0f, -INFINITY, -INFINITY};
    enum { N = sizeof x / sizeof x[0] };
    float mn[N], mx[N], sum[N], mn_r[N], mx_r[N];
    reduce_two(KOLO_FLOAT32, KOLO_MIN, mn, x, y, N);
    reduce_two(KOLO_FLOAT32, KOLO_MAX, mx, x, y, N);
    reduce_two(KOLO_FLOAT32, KOLO_SUM, sum, x, y, N);
    reduce_two(KOLO_FLOAT32, KOLO_MIN, mn_r, y, x, N);
    reduce_two(KOLO_FLOAT32, KOLO_MAX, mx_r, y, x, N);
    for (int i = 0; i < 3; i++) {
        CHECK(isnan(mn[i]) && isnan(mx[i]) && isnan(mn_r[i]) && isnan(mx_r[i]));
        CHECK(isnan(sum[i]));
    }
    /* signed zeros, either order */
    for (int i = 3; i < 5; i++) {
        CHECK(mn[i] == 0 && signbit(mn[i]) && mn_r[i] == 0 && signbit(mn_r[i]));
        CHECK(mx[i] == 0 && !signbit(mx[i]) && mx_r[i] == 0 && !signbit(mx_r[i]));
    }
    CHECK(mn[5] == 1.0f && mx[5] == INFINITY && sum[5] == INFINITY);
    CHECK(mn[6] == -INFINITY && mx[6] == 1.0f && sum[6] == -INFINITY);
    CHECK(isnan(sum[7]));
    CHECK(mn[8] == -INFINITY && mx[8] == 1.0f);

    const double dx[] = {NAN, 2.0, -0.0, 1e308}, dy[] = {-1.0, NAN, 0.0, 1e308};
    double dmn[4], dmx[4], dsum[4];
    reduce_two(KOLO_FLOAT64, KOLO_MIN, dmn, dx, dy, 4);
    reduce_two(KOLO_FLOAT64, KOLO_MAX, dmx, dx, dy, 4);
    reduce_two(KOLO_FLOAT64, KOLO_SUM, dsum, dx, dy, 4);
    CHECK(isnan(dmn[0]) && isnan(dmn[1]) && isnan(dmx[0]) && isnan(dmx[1]));
    CHECK(f64_bits(dmn[2]) == f64_bits(-0.0) && f64_bits(dmx[2]) == f64_bits(0.0));
    CHECK(dsum[3] == INFINITY);

    uint16_t hx[] = {0x7e00, 0x3c00, 0x8000, 0x7c00}, hy[] = {0x3c00, 0xfe00, 0x0000, 0xfc00};
    uint16_t hmn[4], hmx[4], hsum[4];
    reduce_two(KOLO_FLOAT16, KOLO_MIN, hmn, hx, hy, 4);
    reduce_two(KOLO_FLOAT16, KOLO_MAX, hmx, hx, hy, 4);
    reduce_two(KOLO_FLOAT16, KOLO_SUM, hsum, hx, hy, 4);
    CHECK(half_is_nan(FMT_F16, hmn[0]) && half_is_nan(FMT_F16, hmn[1]));
    CHECK(half_is_nan(FMT_F16, hmx[0]) && half_is_nan(FMT_F16, hmx[1]));
    CHECK_EQ_INT(hmn[2], 0x8000);
    CHECK_EQ_INT(hmx[2], 0x0000);
    CHECK(half_is_nan(FMT_F16, hsum[3])); /* inf + -inf */
}

/* ---------------------------------------------------------------- divide, scale */

/* The value v wrapped to the width of t, as C unsigned arithmetic would. */
static int64_t wrap_to(kolo_dtype t, uint64_t v)
{
    unsigned char tmp[8] = {0};
    put_wrapped(t, tmp, 0, v);
    return get_int(t, tmp, 0);
}

/* C's / truncates toward zero; the one overflowing quotient, MIN / -1,
 * wraps, and uint8 divided by a negative n wraps too. */
static int64_t ref_div(kolo_dtype t, int64_t x, int n)
{
    if (n == -1)
        return wrap_to(t, 0 - (uint64_t)x);
    return wrap_to(t, (uint64_t)(x / n));
}

static void test_divide(void)
{
    static const int ns[] = {2, 3, 5, 7, 8, 127, 1000003, INT32_MAX, -1, -3, INT32_MIN};
    enum { N = 4099 };
    for (int t = KOLO_UINT8; t <= KOLO_INT64; t++) {
        kolo_dtype dt = (kolo_dtype)t;
        size_t sz = dsize(dt);
        unsigned char *buf = malloc((N + 1) * sz), *orig = malloc((N + 1) * sz);
        REQUIRE(buf && orig);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            fill_random(dt, orig, N + 1);
            /* the extremes and values around multiples of n */
            if (dt == KOLO_INT64) {
                ((int64_t *)orig)[1] = INT64_MIN;
                ((int64_t *)orig)[2] = INT64_MAX;
                ((int64_t *)orig)[3] = INT64_MAX - 1;
            } else if (dt == KOLO_INT32) {
                ((int32_t *)orig)[1] = INT32_MIN;
                ((int32_t *)orig)[2] = INT32_MAX;
            }
            for (size_t i = 4; i < 64; i++)
                put_wrapped(
                    dt, orig, i,
                    (uint64_t)((int64_t)ns[k] * (int64_t)(i / 3 - 10) + (int64_t)(i % 3) - 1));
            memcpy(buf, orig, (N + 1) * sz);
            reduce_divide(dt, buf + sz, N, ns[k]);
            int bad = 0;
            for (size_t i = 1; i <= N; i++)
                bad += get_int(dt, buf, i) != ref_div(dt, get_int(dt, orig, i), ns[k]);
            bad += get_int(dt, buf, 0) != get_int(dt, orig, 0);
            if (bad)
                fprintf(stderr, "reduce_divide %s by %d: %d wrong\n", dname(dt), ns[k], bad);
            CHECK_EQ_INT(bad, 0);
        }
        /* 1 and 0 leave the buffer alone */
        fill_random(dt, orig, N);
        memcpy(buf, orig, N * sz);
        reduce_divide(dt, buf, N, 1);
        reduce_divide(dt, buf, N, 0);
        CHECK(memcmp(buf, orig, N * sz) == 0);
        free(buf);
        free(orig);
    }

    int8_t m8[] = {-128, -7, 7, 127};
    reduce_divide(KOLO_INT8, m8, 4, -1);
    CHECK_EQ_INT(m8[0], -128);
    CHECK_EQ_INT(m8[1], 7);
    int32_t m32[] = {-7, 7, INT32_MIN, -1};
    reduce_divide(KOLO_INT32, m32, 4, 2);
    CHECK_EQ_INT(m32[0], -3);
    CHECK_EQ_INT(m32[1], 3);
    CHECK_EQ_INT(m32[2], INT32_MIN / 2);
    CHECK_EQ_INT(m32[3], 0);
    int64_t m64[] = {INT64_MAX, INT64_MIN + 1, (INT64_C(1) << 53) + 1};
    reduce_divide(KOLO_INT64, m64, 3, 3);
    CHECK(m64[0] == INT64_MAX / 3);
    CHECK(m64[1] == (INT64_MIN + 1) / 3);
    CHECK(m64[2] == ((INT64_C(1) << 53) + 1) / 3);

    /* Floating types multiply by 1/n, rounded to the type they compute in. */
    for (int t = KOLO_FLOAT16; t <= KOLO_FLOAT64; t++) {
        kolo_dtype dt = (kolo_dtype)t;
        size_t sz = dsize(dt);
        for (int n = 2; n <= 9; n += 7) {
            unsigned char *buf = malloc(N * sz), *want = malloc(N * sz);
            REQUIRE(buf && want);
            fill_random(dt, buf, N);
            for (size_t i = 0; i < N; i++) {
                double v = get_float(dt, buf, i);
                double r =
                    dt == KOLO_FLOAT64 ? v * (1.0 / n) : (double)((float)v * (float)(1.0 / n));
                put_float(dt, want, i, r);
            }
            reduce_divide(dt, buf, N, n);
            CHECK(same_buffers(dt, buf, want, N, "reduce_divide", KOLO_AVERAGE));
            free(buf);
            free(want);
        }
    }
}

/* Integer scale: double product truncated toward zero, saturated at the
 * type's ends, NaN as 0. */
static int64_t ref_scale_int(kolo_dtype t, int64_t x, double f)
{
    static const double lo[] = {0.0, -0x1p7, -0x1p15, -0x1p31, -0x1p63};
    static const int64_t hi[] = {UINT8_MAX, INT8_MAX, INT16_MAX, INT32_MAX, INT64_MAX};
    double v = (double)x * f;
    if (isnan(v))
        return 0;
    if (v >= (double)hi[t] + 1.0) /* exact: a power of two */
        return hi[t];
    if (v <= lo[t])
        return (int64_t)lo[t];
    return (int64_t)trunc(v);
}

static void test_scale(void)
{
    static const double factors[] = {0.5, -0.25, 3.0, 1e-3, -2.5, 1e30, -1e300, NAN, INFINITY};
    static const size_t counts[] = {0, 1, 7, 8, 9, 4099};
    for (int t = 0; t < KOLO_DTYPE_COUNT; t++) {
        kolo_dtype dt = (kolo_dtype)t;
        size_t sz = dsize(dt);
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            size_t n = counts[c];
            for (size_t k = 0; k < sizeof factors / sizeof factors[0]; k++) {
                double f = factors[k];
                unsigned char *buf = malloc((n + 2) * sz), *want = malloc((n + 2) * sz);
                REQUIRE(buf && want);
                fill_random(dt, buf, n + 2);
                memcpy(want, buf, (n + 2) * sz);
                for (size_t i = 1; i <= n; i++) {
                    if (!is_float(dt)) {
                        put_wrapped(dt, want, i,
                                    (uint64_t)ref_scale_int(dt, get_int(dt, buf, i), f));
                        continue;
                    }
                    double v = get_float(dt, buf, i);
                    put_float(dt, want, i,
                              dt == KOLO_FLOAT64 ? v * f : (double)((float)v * (float)f));
                }
                reduce_scale(dt, buf + sz, n, f);
                if (!same_buffers(dt, buf, want, n + 2, "reduce_scale", KOLO_SUM))
                    fprintf(stderr, "  factor %g\n", f);
                CHECK(same_buffers(dt, buf, want, n + 2, "reduce_scale", KOLO_SUM));
                free(buf);
                free(want);
            }
        }
    }
    int8_t s8[] = {10, -7, 100, -100, 0};
    reduce_scale(KOLO_INT8, s8, 5, 0.5);
    CHECK_EQ_INT(s8[0], 5);
    CHECK_EQ_INT(s8[1], -3);
    CHECK_EQ_INT(s8[2], 50);
    reduce_scale(KOLO_INT8, s8, 5, 3.0);
    CHECK_EQ_INT(s8[2], 127);
    CHECK_EQ_INT(s8[3], -128);
    int64_t s64[] = {INT64_MAX / 2 + 1, -(INT64_MAX / 2) - 1};
    reduce_scale(KOLO_INT64, s64, 2, 4.0);
    CHECK(s64[0] == INT64_MAX);
    CHECK(s64[1] == INT64_MIN);
    /* factor 1 changes nothing, not even a signalling NaN's bits */
    float one[] = {f32_from(0x7f800001u), 3.0f};
    reduce_scale(KOLO_FLOAT32, one, 2, 1.0);
    CHECK(f32_bits(one[0]) == 0x7f800001u && one[1] == 3.0f);
}

/* ---------------------------------------------------------------- invalid */

static void test_invalid(void)
{
    int32_t d[4] = {1, 2, 3, 4}, s[4] = {5, 6, 7, 8};
    reduce_into((kolo_dtype)KOLO_DTYPE_COUNT, KOLO_SUM, d, s, 4);
    reduce_into((kolo_dtype)-1, KOLO_SUM, d, s, 4);
    reduce_into(KOLO_INT32, (kolo_op)KOLO_OP_COUNT, d, s, 4);
    reduce_into(KOLO_INT32, (kolo_op)-3, d, s, 4);
    reduce_two((kolo_dtype)99, KOLO_SUM, d, d, s, 4);
    reduce_two(KOLO_INT32, (kolo_op)99, d, d, s, 4);
    reduce_scale((kolo_dtype)99, d, 4, 2.0);
    reduce_divide((kolo_dtype)99, d, 4, 2);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(d[i], i + 1);
    /* count 0 touches nothing, even through NULL */
    reduce_into(KOLO_FLOAT32, KOLO_SUM, NULL, NULL, 0);
    reduce_two(KOLO_FLOAT32, KOLO_SUM, NULL, NULL, NULL, 0);
    reduce_scale(KOLO_FLOAT32, NULL, 0, 2.0);
    reduce_divide(KOLO_FLOAT32, NULL, 0, 2);
}

int main(void)
{
    test_invalid();
    test_integer_wrap();
    test_float_specials();
    test_rounding_cases();
    test_conversions_exhaustive();
    test_narrowing();
    test_divide();
    test_scale();
    test_all_ops();
    TEST_DONE();
}
