/*
 * fuzz_rpc_frame.c - libFuzzer harness for the RPC frame decoder and MAC
 * check (common/rpc.c), the first code every byte from the network meets.
 * Whatever decodes must re-encode to the same bytes (with its MAC, when
 * it had one and it verified), and nothing may read out of bounds.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "creds.h"
#include "rpc.h"

#define TOKEN "fuzz-token-0123456789abcdef"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct rpc_frame f;
    if (rpc_frame_decode(data, size, &f) != 0)
        return 0;
    /* verify with the cluster key and with a job key, as the server may */
    char cred[CREDS_JOB_HEX];
    creds_job(TOKEN, f.job_id, cred);
    int cluster_ok = rpc_frame_verify(data, size, TOKEN) == 0;
    int job_ok = rpc_frame_verify(data, size, cred) == 0;
    if (f.flags & ~(RPC_FLAG_MAC | RPC_FLAG_JOB_KEY))
        return 0; /* unknown flag bits are not re-encoded */
    uint8_t *out = NULL;
    size_t len = 0;
    const char *key = !(f.flags & RPC_FLAG_MAC) ? NULL : job_ok ? cred : cluster_ok ? TOKEN : NULL;
    if ((f.flags & RPC_FLAG_MAC) && !key)
        return 0; /* a MAC nobody can reproduce */
    if (!key)
        f.flags = 0;
    if (rpc_frame_encode(&f, key, &out, &len) != 0)
        abort(); /* it decoded, so it must encode */
    /* the same frame; without a MAC the flags and the MAC field mean
     * nothing (they are written as zeros) */
    if (len != size || memcmp(out, data, 7) != 0 ||
        (key && memcmp(out + 7, data + 7, 33) != 0) || memcmp(out + 40, data + 40, size - 40) != 0)
        abort();
    free(out);
    return 0;
}
