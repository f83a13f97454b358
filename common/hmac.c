/*
 * hmac.c - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104).
 *
 * A plain, portable implementation, and on x86-64 CPUs with the SHA
 * extensions (sha_ni) a second compression loop over them, chosen at run
 * time: snapshots are hashed on both ends of every commit (hundreds of MB),
 * where the portable loop's ~165 MB/s was the largest part of a commit's
 * cost and the instructions do ~1.5 GB/s. In the portable loop, words are
 * assembled from bytes explicitly (big-endian, as the standard specifies)
 * so the code does not depend on the host's byte order or on unaligned
 * loads. test_hmac checks both loops against FIPS 180-4's examples and
 * against each other.
 */
#include "hmac.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define SHA_HAVE_NI_PATH 1
#endif

/* FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of
 * the cube roots of the first 64 primes. */
static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotr32(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

/* The six logical functions of FIPS 180-4 section 4.1.2. */
#define SHA_CH(x, y, z)  (((x) & (y)) ^ (~(x) & (z)))
#define SHA_MAJ(x, y, z) (((x) & (y)) ^ ((x) & (z)) ^ ((y) & (z)))
#define SHA_BSIG0(x)     (rotr32((x), 2) ^ rotr32((x), 13) ^ rotr32((x), 22))
#define SHA_BSIG1(x)     (rotr32((x), 6) ^ rotr32((x), 11) ^ rotr32((x), 25))
#define SHA_SSIG0(x)     (rotr32((x), 7) ^ rotr32((x), 18) ^ ((x) >> 3))
#define SHA_SSIG1(x)     (rotr32((x), 17) ^ rotr32((x), 19) ^ ((x) >> 10))

/* sha256_block runs the compression function (section 6.2.2) over one
 * 64-byte block. */
static void sha256_block(uint32_t h[8], const uint8_t block[64])
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
               (uint32_t)block[4 * t + 2] << 8 | (uint32_t)block[4 * t + 3];
    for (int t = 16; t < 64; t++)
        w[t] = SHA_SSIG1(w[t - 2]) + w[t - 7] + SHA_SSIG0(w[t - 15]) + w[t - 16];

    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    uint32_t e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + SHA_BSIG1(e) + SHA_CH(e, f, g) + sha256_k[t] + w[t];
        uint32_t t2 = SHA_BSIG0(a) + SHA_MAJ(a, b, c);
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

#ifdef SHA_HAVE_NI_PATH
/*
 * The same compression with the SHA extensions, over nblocks blocks. The
 * instructions keep the state as two vectors, (A, B, E, F) and (C, D, G,
 * H); sha256rnds2 does two rounds, sha256msg1/msg2 the message schedule
 * (W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16]) four words at a
 * time, the W[t-7] terms coming from two earlier vectors by alignr.
 */
__attribute__((target("sha,sse4.1,ssse3"))) static void sha256_blocks_ni(uint32_t h[8],
                                                                        const uint8_t *data,
                                                                        size_t nblocks)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i t = _mm_loadu_si128((const __m128i *)&h[0]); /* A B C D */
    __m128i cdgh = _mm_loadu_si128((const __m128i *)&h[4]); /* E F G H */
    t = _mm_shuffle_epi32(t, 0xB1);                   /* B A D C */
    cdgh = _mm_shuffle_epi32(cdgh, 0x1B);             /* H G F E */
    __m128i abef = _mm_alignr_epi8(t, cdgh, 8);       /* F E B A, i.e. ABEF high to low */
    cdgh = _mm_blend_epi16(cdgh, t, 0xF0);            /* H G D C, i.e. CDGH */
    for (size_t b = 0; b < nblocks; b++, data += 64) {
        __m128i abef0 = abef, cdgh0 = cdgh, m[4];
        for (int g = 0; g < 16; g++) {
            if (g < 4) {
                m[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * g)), bswap);
            } else {
                __m128i w = _mm_sha256msg1_epu32(m[(g - 4) & 3], m[(g - 3) & 3]);
                w = _mm_add_epi32(w, _mm_alignr_epi8(m[(g - 1) & 3], m[(g - 2) & 3], 4));
                m[g & 3] = _mm_sha256msg2_epu32(w, m[(g - 1) & 3]);
            }
            __m128i wk =
                _mm_add_epi32(m[g & 3], _mm_loadu_si128((const __m128i *)&sha256_k[4 * g]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    t = _mm_shuffle_epi32(abef, 0x1B);           /* F E B A -> A B E F order reversed */
    cdgh = _mm_shuffle_epi32(cdgh, 0xB1);
    abef = _mm_blend_epi16(t, cdgh, 0xF0);       /* A B C D */
    cdgh = _mm_alignr_epi8(cdgh, t, 8);          /* E F G H */
    _mm_storeu_si128((__m128i *)&h[0], abef);
    _mm_storeu_si128((__m128i *)&h[4], cdgh);
}

/* CPUID itself (leaf 7 EBX bit 29: SHA; leaf 1 ECX bit 19: SSE4.1): clang
 * has no "sha" for __builtin_cpu_supports. */
static bool sha_ni(void)
{
    static int have = -1;
    if (have < 0) {
        unsigned a, b, c, d;
        bool sha = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
        bool sse41 = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 19));
        have = sha && sse41;
    }
    return have > 0;
}
#endif

int sha256_portable_only;

/* Runs the compression over nblocks whole blocks. */
static void sha256_blocks(uint32_t h[8], const uint8_t *data, size_t nblocks)
{
#ifdef SHA_HAVE_NI_PATH
    if (sha_ni() && !sha256_portable_only) {
        sha256_blocks_ni(h, data, nblocks);
        return;
    }
#endif
    for (size_t b = 0; b < nblocks; b++)
        sha256_block(h, data + 64 * b);
}

void sha256_init(struct sha256 *s)
{
    /* Section 5.3.3: fractional parts of the square roots of the first 8
     * primes. */
    static const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, initial, sizeof initial);
    s->len = 0;
    s->fill = 0;
}

void sha256_update(struct sha256 *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->len += len;
    if (s->fill > 0) {
        size_t take = 64 - s->fill < len ? 64 - s->fill : len;
        memcpy(s->buf + s->fill, p, take);
        s->fill += take;
        p += take;
        len -= take;
        if (s->fill < 64)
            return;
        sha256_blocks(s->h, s->buf, 1);
        s->fill = 0;
    }
    /* Whole blocks straight from the caller's memory, no copy. */
    if (len >= 64) {
        sha256_blocks(s->h, p, len / 64);
        p += len / 64 * 64;
        len %= 64;
    }
    if (len > 0) {
        memcpy(s->buf, p, len);
        s->fill = len;
    }
}

void sha256_final(struct sha256 *s, uint8_t out[SHA256_LEN])
{
    /* Section 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the
     * message length in bits as a 64-bit big-endian integer. */
    uint64_t bits = s->len * 8;
    s->buf[s->fill++] = 0x80;
    if (s->fill > 56) {
        memset(s->buf + s->fill, 0, 64 - s->fill);
        sha256_blocks(s->h, s->buf, 1);
        s->fill = 0;
    }
    memset(s->buf + s->fill, 0, 56 - s->fill);
    for (int i = 0; i < 8; i++)
        s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_blocks(s->h, s->buf, 1);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
    /* The state may hold key material (HMAC pads); leave nothing behind. */
    memset(s, 0, sizeof *s);
}

void sha256(const void *data, size_t len, uint8_t out[SHA256_LEN])
{
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, data, len);
    sha256_final(&s, out);
}

/* RFC 2104: H(K ^ opad, H(K ^ ipad, text)), with K hashed first when it is
 * longer than the block size and zero-padded to the block size. */
void hmac_sha256_init(struct hmac_sha256 *h, const void *key, size_t keylen)
{
    uint8_t k[64] = {0};
    if (keylen > sizeof k)
        sha256(key, keylen, k);
    else if (keylen > 0)
        memcpy(k, key, keylen);

    uint8_t pad[64];
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    sha256_init(&h->inner);
    sha256_update(&h->inner, pad, sizeof pad);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    sha256_init(&h->outer);
    sha256_update(&h->outer, pad, sizeof pad);

    /* A plain memset of a dying local may be optimised away; a volatile
     * pointer keeps the key bytes from lingering on the stack. */
    volatile uint8_t *wipe = k;
    for (size_t i = 0; i < sizeof k; i++)
        wipe[i] = 0;
    wipe = pad;
    for (size_t i = 0; i < sizeof pad; i++)
        wipe[i] = 0;
}

void hmac_sha256_update(struct hmac_sha256 *h, const void *data, size_t len)
{
    sha256_update(&h->inner, data, len);
}

void hmac_sha256_final(struct hmac_sha256 *h, uint8_t out[SHA256_LEN])
{
    uint8_t inner[SHA256_LEN];
    sha256_final(&h->inner, inner);
    sha256_update(&h->outer, inner, sizeof inner);
    sha256_final(&h->outer, out);
}

void hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                 uint8_t out[SHA256_LEN])
{
    struct hmac_sha256 h;
    hmac_sha256_init(&h, key, keylen);
    hmac_sha256_update(&h, data, len);
    hmac_sha256_final(&h, out);
}

int ct_equal(const void *a, const void *b, size_t len)
{
    /* Accumulate every difference and decide once at the end, so the time
     * taken says nothing about where the first mismatch is. */
    const volatile uint8_t *pa = a, *pb = b;
    uint8_t diff = 0;
    for (size_t i = 0; i < len; i++)
        diff |= pa[i] ^ pb[i];
    return diff == 0;
}
