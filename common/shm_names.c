/*
 * shm_names.c - naming and sweeping kolo's shared-memory segments (see
 * shm_names.h). Linux keeps POSIX shared memory under /dev/shm.
 */
#include "shm_names.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "errors.h"
#include "hmac.h"
#include "util.h"

int shm_names_make(uint64_t job, uint64_t generation, char *out, size_t outlen)
{
    char hex[17];
    if (random_hex(hex, 8) != 0)
        return KOLO_ESYS;
    int n = snprintf(out, outlen, "/kolo-%llu-%llu-%d-%s", (unsigned long long)job,
                     (unsigned long long)generation, (int)getpid(), hex);
    return n < 0 || (size_t)n >= outlen ? KOLO_EINVAL : 0;
}

int shm_names_derive(uint64_t job, uint64_t generation, int creator_pid, const char *host,
                     const void *key, size_t keylen, char *out, size_t outlen)
{
    char what[96];
    uint8_t mac[SHA256_LEN];
    int w = snprintf(what, sizeof what, "kolo segment %llu %llu %d ", (unsigned long long)job,
                     (unsigned long long)generation, creator_pid);
    if (!key || !keylen || !host || w < 0 || (size_t)w >= sizeof what)
        return KOLO_EINVAL;
    struct hmac_sha256 h;
    hmac_sha256_init(&h, key, keylen);
    hmac_sha256_update(&h, what, (size_t)w);
    hmac_sha256_update(&h, host, strlen(host));
    hmac_sha256_final(&h, mac);
    explicit_bzero(&h, sizeof h);
    char hex[17];
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    int n = snprintf(out, outlen, "/kolo-%llu-%llu-%d-%s", (unsigned long long)job,
                     (unsigned long long)generation, creator_pid, hex);
    return n < 0 || (size_t)n >= outlen ? KOLO_EINVAL : 0;
}

int shm_names_sweep(uint64_t job)
{
    char prefix[64];
    int plen = snprintf(prefix, sizeof prefix, "kolo-%llu-", (unsigned long long)job);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        /* kolo-<job>-<gen>-<pid>-<hex> */
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
            continue;
        const char *pid_at = strchr(e->d_name + plen, '-');
        char *end;
        long pid = pid_at ? strtol(pid_at + 1, &end, 10) : 0;
        if (pid <= 0 || *end != '-')
            continue;
        /* a creator still running owns it (perhaps another cluster's job
         * of the same number); ESRCH means nobody will unlink it */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[300];
        snprintf(path, sizeof path, "/%s", e->d_name);
        if (shm_unlink(path) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
