/*
 * client.c - what `kolo run` and `kolo status` share.
 */
#include "cli.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The python/ folder of the checkout this binary was built in, or "". */
static void checkout_python(char *out, size_t size)
{
    char exe[PATH_MAX];
    out[0] = '\0';
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *bin = dirname(exe);    /* <repo>/build/bin */
    char *build = dirname(bin);  /* <repo>/build */
    char *repo = dirname(build); /* <repo> */
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/python/kolo/__init__.py", repo);
    if (access(probe, R_OK) == 0)
        snprintf(out, size, "%s/python", repo);
}

/* Whether an entry of a PATH-like list holds kolo/__init__.py. */
static bool path_has_kolo(const char *list)
{
    char probe[PATH_MAX + 32];
    while (list && *list) {
        size_t len = strcspn(list, ":");
        if (len > 0 && len < PATH_MAX) {
            snprintf(probe, sizeof probe, "%.*s/kolo/__init__.py", (int)len, list);
            if (access(probe, R_OK) == 0)
                return true;
        }
        list += len + (list[len] == ':');
    }
    return false;
}

void cli_use_checkout_python(bool unless_provided)
{
    char py[PATH_MAX];
    checkout_python(py, sizeof py);
    const char *old = getenv("PYTHONPATH");
    if (!py[0] || (unless_provided && path_has_kolo(old)))
        return;
    char *path = malloc(strlen(py) + (old ? strlen(old) : 0) + 2);
    if (!path)
        return;
    sprintf(path, "%s%s%s", py, old && old[0] ? ":" : "", old ? old : "");
    setenv("PYTHONPATH", path, 1);
    free(path);
}
