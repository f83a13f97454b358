/*
 * client.c - what `kolo run` and `kolo status` share.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "tls.h"
#include "util.h"

int cli_token(const char *path, char **token, char *err, size_t errlen)
{
    *token = NULL;
    if (!path || !path[0])
        return 0;
    return read_token_file(path, token, err, errlen);
}

int cli_connect(struct rpc_client **cli, const char *url, const char *token,
                const struct tls_files *tls, const char *identity, char *err, size_t errlen)
{
    char dialed[256];
    int rv = tls_url(dialed, sizeof dialed, url, tls, err, errlen);
    if (rv != 0)
        return rv;
    /* busy (someone else's waiting calls fill the coordinator) is tried
     * again within each call's deadline, as libkolo's calls do */
    struct rpc_client_config rc = {
        .url = url, .token = token, .identity = identity, .tls = tls, .retry_busy = true};
    if ((rv = rpc_client_open(cli, &rc)) != 0)
        snprintf(err, errlen, "invalid coordinator address '%s' (want tcp://HOST:PORT)", url);
    return rv;
}

int cli_call(struct rpc_client *cli, const char *method, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *rep_desc, ProtobufCMessage **rep, int timeout_ms,
             char *err, size_t errlen)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    void *out = NULL;
    size_t out_len = 0;
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return KOLO_ENOMEM;
    }
    protobuf_c_message_pack(req, buf);
    int rv = rpc_client_call(cli, method, buf, len, &out, &out_len, timeout_ms, err, errlen);
    free(buf);
    if (rv != 0)
        return rv;
    *rep = protobuf_c_message_unpack(rep_desc, NULL, out_len, out);
    free(out);
    if (!*rep) {
        snprintf(err, errlen, "malformed %s reply", method);
        return KOLO_EPROTO;
    }
    return 0;
}

bool cli_transient(int rv)
{
    return rv == KOLO_ETIMEDOUT || rv == KOLO_ECONNREFUSED || rv == KOLO_ESHUTDOWN ||
           rv == KOLO_EIO || rv == KOLO_EBUSY;
}

char *cli_state_dir(void)
{
    const char *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    char path[4096];
    if (xdg && xdg[0])
        snprintf(path, sizeof(path), "%s/kolo", xdg);
    else if (home && home[0])
        snprintf(path, sizeof(path), "%s/.local/state/kolo", home);
    else
        snprintf(path, sizeof(path), "/tmp/kolo-state");
    return strdup(path);
}
