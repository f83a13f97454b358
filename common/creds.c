/*
 * creds.c - derived secrets (see creds.h): HMAC-SHA256 over a label and
 * little-endian integers, so every language and version derives the same.
 */
#include "creds.h"

#include <string.h>

#include "hmac.h"

static void put_le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_hex(const unsigned char *mac, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[mac[i] >> 4];
        out[2 * i + 1] = hex[mac[i] & 15];
    }
    out[2 * n] = '\0';
}

void creds_job(const char *token, uint64_t job, char out[CREDS_JOB_HEX])
{
    static const char label[] = "kolo-job-credential";
    unsigned char msg[sizeof label + 8], mac[SHA256_LEN];
    memcpy(msg, label, sizeof label); /* the NUL separates label and job */
    put_le(msg + sizeof label, job);
    hmac_sha256(token, strlen(token), msg, sizeof msg, mac);
    put_hex(mac, SHA256_LEN, out);
}

void creds_view(const char *token, char out[CREDS_VIEW_HEX])
{
    static const char label[] = "kolo-dashboard-view";
    unsigned char mac[SHA256_LEN];
    hmac_sha256(token, strlen(token), label, sizeof label, mac);
    put_hex(mac, (CREDS_VIEW_HEX - 1) / 2, out);
}

void creds_data_key(const char *job_credential, uint64_t job, uint64_t generation,
                    uint32_t session, int32_t process_set, unsigned char out[CREDS_KEY_LEN])
{
    static const char label[] = "kolo-data-plane";
    unsigned char msg[sizeof label + 32];
    memcpy(msg, label, sizeof label);
    put_le(msg + sizeof label, job);
    put_le(msg + sizeof label + 8, generation);
    put_le(msg + sizeof label + 16, session);
    put_le(msg + sizeof label + 24, (uint64_t)(uint32_t)process_set);
    hmac_sha256(job_credential, strlen(job_credential), msg, sizeof msg, out);
}
