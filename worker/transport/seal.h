/*
 * seal.h - an encrypted byte stream over a non-blocking TCP socket: the
 * data plane's record layer when a job asks for one (KOLO_DATA_ENCRYPT).
 *
 * Each direction is a sequence of records
 *
 *     length u32 (little-endian, 1..SEAL_RECORD_MAX) | ciphertext | tag [16]
 *
 * sealed with AES-256-GCM under that direction's key; the nonce is the
 * record's number in its direction (never sent, so a record dropped,
 * replayed or moved fails the next tag), and the length is authenticated
 * data. The keys come from the connection's handshake (transport_tcp.c),
 * so they are fresh per connection and differ per direction.
 *
 * The cipher is the system's libcrypto (OpenSSL 3, Debian's libssl3),
 * opened with dlopen the first time a job asks for encryption: kolo
 * builds without a crypto library and a job that does not encrypt never
 * loads one. Its AES-GCM uses the CPU's AES and carry-less multiply
 * instructions.
 *
 * seal_send and seal_recv behave like send(2) and recv(2) on plaintext:
 * they move what they can without blocking and return how much. Two
 * rules follow from records being atomic:
 *  - seal_send counts a record's bytes only once the whole record is on
 *    the wire. While one is part-way out (seal_midrecord), the next call
 *    must pass the same bytes at the same place: it finishes the record
 *    before it takes anything new. A caller that gives up then has left
 *    the stream out of step with its peer.
 *  - seal_recv hands out nothing of a record before its tag checked out.
 *    A record it read further than the caller asked for stays buffered
 *    for the next call, so "nothing returned" means the socket had
 *    nothing more: poll() on it is then the right wait.
 */
#ifndef KOLO_WORKER_SEAL_H
#define KOLO_WORKER_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define SEAL_KEY_LEN    32
#define SEAL_TAG_LEN    16
#define SEAL_RECORD_MAX (64 << 10)

/* What besides a count seal_send / seal_recv return. */
enum seal_error {
    SEAL_ERRNO = -1, /* the socket failed: errno says how */
    SEAL_EOF = -2,   /* the peer closed the connection */
    SEAL_FORGED = -3, /* a record's tag did not check out: tampered, or not our peer */
    SEAL_GARBLED = -4, /* a record's length is out of range */
    SEAL_MISUSE = -5, /* seal_send resumed with fewer bytes than the record in flight */
    SEAL_CRYPTO = -6, /* libcrypto failed (out of memory and the like) */
};

struct seal;

/* seal_available: 0 when the cipher can be loaded, else KOLO_ENOTSUP
 * with the reason in err. Loads libcrypto once per process (its outcome
 * is kept); KOLO_CRYPTO_LIBRARY names another file to load. */
int seal_available(char *err, size_t errlen);

/* seal_new: a stream that sends under send_key and receives under
 * recv_key (the peer has them the other way round). 0, KOLO_ENOTSUP
 * (no libcrypto, err says why) or KOLO_ENOMEM. */
int seal_new(const unsigned char send_key[SEAL_KEY_LEN], const unsigned char recv_key[SEAL_KEY_LEN],
             struct seal **out, char *err, size_t errlen);
void seal_free(struct seal *s);

ssize_t seal_send(struct seal *s, int fd, const void *buf, size_t len);
ssize_t seal_recv(struct seal *s, int fd, void *buf, size_t len);
/* true while a record is part-way onto the wire */
bool seal_midrecord(const struct seal *s);
/* true while received bytes wait in s (a record, or part of one, read
 * ahead): a poll() on the socket does not see them */
bool seal_buffered(const struct seal *s);
const char *seal_error_text(enum seal_error e);

#endif
