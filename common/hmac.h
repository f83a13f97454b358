/*
 * hmac.h - SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), written for
 * kolo's frame authentication so the build needs no crypto library.
 */
#ifndef KOLO_COMMON_HMAC_H
#define KOLO_COMMON_HMAC_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32

struct sha256 {
    uint32_t h[8];
    uint64_t len; /* bytes hashed so far */
    uint8_t buf[64];
    size_t fill;
};

/* sha256_portable_only: non-zero makes SHA-256 use the portable loop even
 * where the CPU has the SHA extensions (tests compare the two). */
extern int sha256_portable_only;
void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
void sha256_final(struct sha256 *s, uint8_t out[SHA256_LEN]);
void sha256(const void *data, size_t len, uint8_t out[SHA256_LEN]);

struct hmac_sha256 {
    struct sha256 inner, outer;
};

void hmac_sha256_init(struct hmac_sha256 *h, const void *key, size_t keylen);
void hmac_sha256_update(struct hmac_sha256 *h, const void *data, size_t len);
void hmac_sha256_final(struct hmac_sha256 *h, uint8_t out[SHA256_LEN]);
void hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                 uint8_t out[SHA256_LEN]);

/* ct_equal compares in time independent of where the buffers differ. */
int ct_equal(const void *a, const void *b, size_t len);

#endif
