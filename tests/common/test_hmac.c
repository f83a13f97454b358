/*
 * test_hmac.c - SHA-256 against FIPS 180-4 examples, HMAC-SHA256 against
 * RFC 4231, streaming against one-shot, and ct_equal.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hmac.h"
#include "test.h"

static void to_hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha(const void *data, size_t len, const char *want, int line)
{
    uint8_t md[SHA256_LEN];
    char hex[2 * SHA256_LEN + 1];
    sha256(data, len, md);
    to_hex(md, sizeof md, hex);
    if (strcmp(hex, want) != 0) {
        fprintf(stderr, "line %d: sha256 %s, want %s\n", line, hex, want);
        test_failures++;
    }
}

/* check_hmac compares the first want_len/2 bytes (RFC 4231 case 5 checks
 * a truncated MAC). */
static void check_hmac(const void *key, size_t keylen, const void *data, size_t len,
                       const char *want, int line)
{
    uint8_t mac[SHA256_LEN];
    char hex[2 * SHA256_LEN + 1];
    hmac_sha256(key, keylen, data, len, mac);
    to_hex(mac, sizeof mac, hex);
    if (strncmp(hex, want, strlen(want)) != 0) {
        fprintf(stderr, "line %d: hmac %s, want %s\n", line, hex, want);
        test_failures++;
    }
}

static void fips_examples(void)
{
    /* FIPS 180-4 / NIST CSRC example values. */
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
              __LINE__);
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", __LINE__);
    /* 56 bytes: the padding needs a second block. */
    const char *two_block = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(two_block, strlen(two_block),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", __LINE__);
    const char *long_msg = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                           "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    check_sha(long_msg, strlen(long_msg),
              "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1", __LINE__);
    size_t million = 1000000;
    char *a = malloc(million);
    REQUIRE(a);
    memset(a, 'a', million);
    check_sha(a, million, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
              __LINE__);
    free(a);
}

int main(void)
{
    /* Both compression loops (the SHA-extension one where the CPU has it,
     * and the portable one) against the examples, then against each other
     * on 4 MiB of pseudo-random bytes at every offset and length mod 64. */
    sha256_portable_only = 0;
    fips_examples();
    sha256_portable_only = 1;
    fips_examples();
    sha256_portable_only = 0;
    size_t big = 4u << 20;
    uint8_t *r = malloc(big + 64);
    REQUIRE(r);
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < big + 64; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        r[i] = (uint8_t)seed;
    }
    for (size_t k = 0; k < 64; k++) {
        uint8_t fast[SHA256_LEN], slow[SHA256_LEN];
        size_t len = k == 0 ? big : (k * 977) % 5000;
        sha256(r + k, len, fast);
        sha256_portable_only = 1;
        sha256(r + k, len, slow);
        sha256_portable_only = 0;
        CHECK(memcmp(fast, slow, sizeof fast) == 0);
    }
    free(r);

    /* Streaming in odd chunk sizes equals one call, for every length
     * around the block and padding boundaries. */
    uint8_t data[300];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (uint8_t)(i * 7 + 3);
    for (size_t len = 0; len <= sizeof data; len++) {
        uint8_t one[SHA256_LEN], many[SHA256_LEN];
        sha256(data, len, one);
        for (size_t chunk = 1; chunk <= 65; chunk += 16) {
            struct sha256 s;
            sha256_init(&s);
            for (size_t off = 0; off < len; off += chunk)
                sha256_update(&s, data + off, len - off < chunk ? len - off : chunk);
            sha256_final(&s, many);
            CHECK(memcmp(one, many, sizeof one) == 0);
        }
    }

    /* RFC 4231 test cases 1-7. */
    uint8_t key[131];
    uint8_t msg[50];
    memset(key, 0x0b, 20);
    check_hmac(key, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", __LINE__);
    check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", __LINE__);
    memset(key, 0xaa, 20);
    memset(msg, 0xdd, 50);
    check_hmac(key, 20, msg, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
               __LINE__);
    for (int i = 0; i < 25; i++)
        key[i] = (uint8_t)(i + 1);
    memset(msg, 0xcd, 50);
    check_hmac(key, 25, msg, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
               __LINE__);
    memset(key, 0x0c, 20);
    check_hmac(key, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b", __LINE__);
    memset(key, 0xaa, 131);
    const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(key, 131, t6, strlen(t6),
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", __LINE__);
    const char *t7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the "
                     "HMAC algorithm.";
    check_hmac(key, 131, t7, strlen(t7),
               "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", __LINE__);

    /* Streaming HMAC equals one-shot. */
    uint8_t *a = malloc(100000);
    REQUIRE(a);
    memset(a, 'a', 100000);
    uint8_t one[SHA256_LEN], many[SHA256_LEN];
    hmac_sha256("k", 1, a, 100000, one);
    struct hmac_sha256 h;
    hmac_sha256_init(&h, "k", 1);
    for (size_t off = 0; off < 100000; off += 999)
        hmac_sha256_update(&h, a + off, 100000 - off < 999 ? 100000 - off : 999);
    hmac_sha256_final(&h, many);
    CHECK(memcmp(one, many, sizeof one) == 0);
    /* An empty key is a valid (if useless) key, and differs from "k". */
    hmac_sha256("", 0, a, 100000, many);
    CHECK(memcmp(one, many, sizeof one) != 0);
    free(a);

    /* ct_equal. */
    uint8_t x[32], y[32];
    memset(x, 5, sizeof x);
    memcpy(y, x, sizeof y);
    CHECK(ct_equal(x, y, sizeof x));
    CHECK(ct_equal(x, y, 0));
    y[0] ^= 1;
    CHECK(!ct_equal(x, y, sizeof x));
    y[0] ^= 1;
    y[31] ^= 0x80;
    CHECK(!ct_equal(x, y, sizeof x));
    CHECK(ct_equal(x, y, 31));
    TEST_DONE();
}
