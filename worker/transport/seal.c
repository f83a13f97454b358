/*
 * seal.c - the encrypted record stream (seal.h) and the loading of the
 * cipher from libcrypto.
 *
 * DESIGN. Sending seals one record of up to SEAL_RECORD_MAX plaintext
 * bytes into tx and writes it; the caller is credited a record's bytes
 * when its last byte is written. Receiving reads as much as the socket
 * has into rx (room for two whole records, so one read usually brings
 * several), opens each complete record straight into the caller's buffer
 * when it fits there, else into `plain`, from which later calls are
 * served. A record is opened once: its tag is checked before any of its
 * bytes are handed out, and a failed tag fails the stream for good (the
 * transport makes the failure sticky).
 *
 * libcrypto's API is declared here by hand, the few functions we call
 * with opaque pointers and the documented control codes, so the build
 * needs no OpenSSL headers; the ABI of these calls has been stable since
 * OpenSSL 1.1.
 */
#include "seal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "errors.h"
#include "settings.h"

#define SEAL_HDR_LEN   4
#define SEAL_OVERHEAD  (SEAL_HDR_LEN + SEAL_TAG_LEN)
#define SEAL_NONCE_LEN 12
#define SEAL_RX_CAP    (2 * (SEAL_RECORD_MAX + SEAL_OVERHEAD))

/* libcrypto's control codes for GCM (openssl/evp.h) */
#define EVP_CTRL_GCM_SET_IVLEN 0x9
#define EVP_CTRL_GCM_GET_TAG   0x10
#define EVP_CTRL_GCM_SET_TAG   0x11

typedef struct evp_cipher_ctx EVP_CIPHER_CTX;
typedef struct evp_cipher EVP_CIPHER;

static struct {
    EVP_CIPHER_CTX *(*ctx_new)(void);
    void (*ctx_free)(EVP_CIPHER_CTX *);
    int (*ctx_ctrl)(EVP_CIPHER_CTX *, int, int, void *);
    const EVP_CIPHER *(*aes_256_gcm)(void);
    int (*enc_init)(EVP_CIPHER_CTX *, const EVP_CIPHER *, void *, const unsigned char *,
                    const unsigned char *);
    int (*enc_update)(EVP_CIPHER_CTX *, unsigned char *, int *, const unsigned char *, int);
    int (*enc_final)(EVP_CIPHER_CTX *, unsigned char *, int *);
    int (*dec_init)(EVP_CIPHER_CTX *, const EVP_CIPHER *, void *, const unsigned char *,
                    const unsigned char *);
    int (*dec_update)(EVP_CIPHER_CTX *, unsigned char *, int *, const unsigned char *, int);
    int (*dec_final)(EVP_CIPHER_CTX *, unsigned char *, int *);
} evp;
static bool evp_ok;
static char evp_err[256];
static pthread_once_t evp_once = PTHREAD_ONCE_INIT;

static void evp_load(void)
{
    static const char *const names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so",
                                        NULL};
    const char *forced = settings_raw(SET_CRYPTO_LIBRARY);
    void *h = NULL;
    if (forced && forced[0]) {
        h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    } else {
        for (size_t i = 0; names[i] && !h; i++)
            h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        snprintf(evp_err, sizeof evp_err,
                 "an encrypted data plane needs libcrypto (Debian package libssl3): %s",
                 forced && forced[0] ? dlerror() : "libcrypto.so.3 is not installed");
        return;
    }
    struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&evp.ctx_new, "EVP_CIPHER_CTX_new"},
        {(void **)&evp.ctx_free, "EVP_CIPHER_CTX_free"},
        {(void **)&evp.ctx_ctrl, "EVP_CIPHER_CTX_ctrl"},
        {(void **)&evp.aes_256_gcm, "EVP_aes_256_gcm"},
        {(void **)&evp.enc_init, "EVP_EncryptInit_ex"},
        {(void **)&evp.enc_update, "EVP_EncryptUpdate"},
        {(void **)&evp.enc_final, "EVP_EncryptFinal_ex"},
        {(void **)&evp.dec_init, "EVP_DecryptInit_ex"},
        {(void **)&evp.dec_update, "EVP_DecryptUpdate"},
        {(void **)&evp.dec_final, "EVP_DecryptFinal_ex"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(evp_err, sizeof evp_err, "the loaded libcrypto has no %s", syms[i].name);
            return; /* the handle stays open: harmless, and loading is once */
        }
    }
    evp_ok = true;
}

int seal_available(char *err, size_t errlen)
{
    pthread_once(&evp_once, evp_load);
    if (evp_ok)
        return 0;
    if (err && errlen)
        snprintf(err, errlen, "%s", evp_err);
    return KOLO_ENOTSUP;
}

/* One direction: its cipher context and the next record's number. */
struct way {
    EVP_CIPHER_CTX *ctx;
    uint64_t seq;
};

struct seal {
    struct way tx, rx;
    /* the record being written: tx_len bytes, tx_done of them sent, and
     * how many plaintext bytes it carries */
    unsigned char *txb;
    size_t tx_len, tx_done, tx_plain;
    /* bytes read but not yet opened: rxb[rx_start, rx_end) */
    unsigned char *rxb;
    size_t rx_start, rx_end;
    /* an opened record not yet handed out: plain[p_off, p_len) */
    unsigned char *plain;
    size_t p_off, p_len;
};

static int way_init(struct way *w, const unsigned char key[SEAL_KEY_LEN], bool sending)
{
    w->ctx = evp.ctx_new();
    if (!w->ctx)
        return KOLO_ENOMEM;
    /* Key now, nonce per record: the context keeps the expanded key. */
    int ok = sending ? evp.enc_init(w->ctx, evp.aes_256_gcm(), NULL, NULL, NULL)
                     : evp.dec_init(w->ctx, evp.aes_256_gcm(), NULL, NULL, NULL);
    ok = ok && evp.ctx_ctrl(w->ctx, EVP_CTRL_GCM_SET_IVLEN, SEAL_NONCE_LEN, NULL);
    ok = ok && (sending ? evp.enc_init(w->ctx, NULL, NULL, key, NULL)
                        : evp.dec_init(w->ctx, NULL, NULL, key, NULL));
    return ok ? 0 : KOLO_ENOMEM;
}

int seal_new(const unsigned char send_key[SEAL_KEY_LEN], const unsigned char recv_key[SEAL_KEY_LEN],
             struct seal **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = seal_available(err, errlen);
    if (rc)
        return rc;
    struct seal *s = calloc(1, sizeof *s);
    if (!s)
        return KOLO_ENOMEM;
    s->txb = malloc(SEAL_RECORD_MAX + SEAL_OVERHEAD);
    s->rxb = malloc(SEAL_RX_CAP);
    s->plain = malloc(SEAL_RECORD_MAX);
    if (!s->txb || !s->rxb || !s->plain || way_init(&s->tx, send_key, true) ||
        way_init(&s->rx, recv_key, false)) {
        seal_free(s);
        snprintf(err, errlen, "out of memory for the data plane's encryption");
        return KOLO_ENOMEM;
    }
    *out = s;
    return 0;
}

void seal_free(struct seal *s)
{
    if (!s)
        return;
    if (s->tx.ctx)
        evp.ctx_free(s->tx.ctx);
    if (s->rx.ctx)
        evp.ctx_free(s->rx.ctx);
    free(s->txb);
    free(s->rxb);
    free(s->plain);
    free(s);
}

bool seal_midrecord(const struct seal *s)
{
    return s->tx_len > 0 && s->tx_done > 0;
}

bool seal_buffered(const struct seal *s)
{
    return s->p_off < s->p_len || s->rx_end > s->rx_start;
}

const char *seal_error_text(enum seal_error e)
{
    switch (e) {
    case SEAL_ERRNO:
        return "the socket failed";
    case SEAL_EOF:
        return "the peer closed the connection";
    case SEAL_FORGED:
        return "a record failed its authentication tag (tampered with, or not sent by the peer)";
    case SEAL_GARBLED:
        return "a record's length is out of range (the stream is garbled)";
    case SEAL_MISUSE:
        return "a send resumed with fewer bytes than the record in flight";
    case SEAL_CRYPTO:
        return "the cipher failed";
    }
    return "?";
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The nonce of record seq: 4 zero bytes, then seq little-endian. */
static void nonce_of(uint64_t seq, unsigned char nonce[SEAL_NONCE_LEN])
{
    memset(nonce, 0, 4);
    for (int i = 0; i < 8; i++)
        nonce[4 + i] = (unsigned char)(seq >> (8 * i));
}

/* Seals len plaintext bytes into s->txb as the next record. */
static int seal_record(struct seal *s, const unsigned char *in, size_t len)
{
    unsigned char nonce[SEAL_NONCE_LEN];
    nonce_of(s->tx.seq, nonce);
    unsigned char *hdr = s->txb, *ct = s->txb + SEAL_HDR_LEN, *tag = ct + len;
    put_u32(hdr, (uint32_t)len);
    int n = 0;
    if (!evp.enc_init(s->tx.ctx, NULL, NULL, NULL, nonce) ||
        !evp.enc_update(s->tx.ctx, NULL, &n, hdr, SEAL_HDR_LEN) ||
        !evp.enc_update(s->tx.ctx, ct, &n, in, (int)len) ||
        !evp.enc_final(s->tx.ctx, ct + n, &n) ||
        !evp.ctx_ctrl(s->tx.ctx, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_LEN, tag))
        return SEAL_CRYPTO;
    s->tx.seq++;
    s->tx_len = len + SEAL_OVERHEAD;
    s->tx_done = 0;
    s->tx_plain = len;
    return 0;
}

ssize_t seal_send(struct seal *s, int fd, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    size_t credited = 0;
    if (s->tx_len && len < s->tx_plain)
        return SEAL_MISUSE;
    for (;;) {
        if (!s->tx_len) {
            if (credited == len)
                return (ssize_t)credited;
            size_t n = len - credited;
            int rc = seal_record(s, p + credited, n > SEAL_RECORD_MAX ? SEAL_RECORD_MAX : n);
            if (rc)
                return rc;
        }
        ssize_t n = send(fd, s->txb + s->tx_done, s->tx_len - s->tx_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            s->tx_done += (size_t)n;
            if (s->tx_done == s->tx_len) {
                credited += s->tx_plain;
                s->tx_len = s->tx_done = s->tx_plain = 0;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return (ssize_t)credited;
        return SEAL_ERRNO;
    }
}

/* Opens the record at the front of rx if it is all there: its plaintext
 * goes to dst when dst has room for all of it (*direct true), else to
 * s->plain. 1 opened (*n plaintext bytes), 0 incomplete, or an error. */
static int open_record(struct seal *s, unsigned char *dst, size_t room, size_t *n, bool *direct)
{
    size_t have = s->rx_end - s->rx_start;
    if (have < SEAL_HDR_LEN)
        return 0;
    const unsigned char *hdr = s->rxb + s->rx_start;
    uint32_t len = get_u32(hdr);
    if (len == 0 || len > SEAL_RECORD_MAX)
        return SEAL_GARBLED;
    if (have < len + SEAL_OVERHEAD)
        return 0;
    const unsigned char *ct = hdr + SEAL_HDR_LEN;
    unsigned char *tag = (unsigned char *)ct + len;
    *direct = room >= len;
    unsigned char *out = *direct ? dst : s->plain;
    unsigned char nonce[SEAL_NONCE_LEN];
    nonce_of(s->rx.seq, nonce);
    int k = 0;
    if (!evp.dec_init(s->rx.ctx, NULL, NULL, NULL, nonce) ||
        !evp.dec_update(s->rx.ctx, NULL, &k, hdr, SEAL_HDR_LEN) ||
        !evp.dec_update(s->rx.ctx, out, &k, ct, (int)len) ||
        !evp.ctx_ctrl(s->rx.ctx, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_LEN, tag))
        return SEAL_CRYPTO;
    if (evp.dec_final(s->rx.ctx, out + k, &k) <= 0) {
        memset(out, 0, len); /* nothing unauthenticated is left behind */
        return SEAL_FORGED;
    }
    s->rx.seq++;
    s->rx_start += len + SEAL_OVERHEAD;
    if (s->rx_start == s->rx_end)
        s->rx_start = s->rx_end = 0;
    *n = len;
    return 1;
}

/* Makes room in rx for the rest of the record at its front (or for the
 * next read at all): moves the unopened bytes to the front when the
 * space behind them is short. */
static void rx_compact(struct seal *s)
{
    if (!s->rx_start)
        return;
    size_t have = s->rx_end - s->rx_start;
    size_t need = SEAL_RECORD_MAX + SEAL_OVERHEAD;
    if (SEAL_RX_CAP - s->rx_start >= need && s->rx_end < SEAL_RX_CAP)
        return;
    memmove(s->rxb, s->rxb + s->rx_start, have);
    s->rx_start = 0;
    s->rx_end = have;
}

ssize_t seal_recv(struct seal *s, int fd, void *buf, size_t len)
{
    unsigned char *p = buf;
    size_t got = 0;
    while (got < len) {
        if (s->p_off < s->p_len) {
            size_t k = s->p_len - s->p_off;
            if (k > len - got)
                k = len - got;
            memcpy(p + got, s->plain + s->p_off, k);
            s->p_off += k;
            got += k;
            continue;
        }
        size_t n;
        bool direct;
        int rc = open_record(s, p + got, len - got, &n, &direct);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            if (direct)
                got += n;
            else
                s->p_off = 0, s->p_len = n;
            continue;
        }
        rx_compact(s);
        ssize_t r = recv(fd, s->rxb + s->rx_end, SEAL_RX_CAP - s->rx_end, MSG_DONTWAIT);
        if (r > 0) {
            s->rx_end += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (got)
            break; /* hand out what we have; the next call sees the end */
        return r == 0 ? SEAL_EOF : SEAL_ERRNO;
    }
    return (ssize_t)got;
}
