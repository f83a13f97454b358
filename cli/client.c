/*
 * client.c - what `kolo run` and `kolo status` share.
 */
#include "cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

/* How long the first connection may take before the RPC client's own
 * dialing (which keeps trying until each call's deadline) is left to it. */
#define PROBE_MS 1000

/* connect_error connects to one address and closes: 0 when the
 * connection was taken or no answer came within PROBE_MS, else errno. */
static int connect_error(const struct addrinfo *ai)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int why = 0;
    if (fd < 0)
        return 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        why = errno;
        if (why == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            socklen_t len = sizeof why;
            why = 0;
            if (poll(&p, 1, PROBE_MS) == 1)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &why, &len);
        }
    }
    close(fd);
    return why;
}

/* probe_refused connects once to the host and port of a tcp:// (or
 * tls+tcp://) url. The RPC client dials in the background and retries, so
 * a port where nothing listens would only show as a call that times out
 * after --timeout; a person wants to hear it at once. Returns true, with
 * the reason in err, when every address of the host answered that nobody
 * listens (or could not be reached at all); false when one took the
 * connection, the address is not TCP, or no answer came within PROBE_MS
 * (a slow network: the calls' deadlines decide). */
static bool probe_refused(const char *url, char *err, size_t errlen)
{
    char host[256];
    const char *colon = strrchr(url, ':');
    if (!strstr(url, "tcp://") || !colon || tls_url_host(url, host, sizeof host) != 0)
        return false;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || !ai)
        return false; /* the RPC client names a bad address */
    int why = 0;
    for (const struct addrinfo *a = ai; a; a = a->ai_next) {
        int e = connect_error(a);
        if (e != ECONNREFUSED && e != EHOSTUNREACH && e != ENETUNREACH) {
            why = 0;
            break;
        }
        why = why ? why : e;
    }
    freeaddrinfo(ai);
    if (!why)
        return false;
    snprintf(err, errlen,
             "cannot connect to %s: %s (is the coordinator running, and at this "
             "address?)",
             url, strerror(why));
    return true;
}

int cli_connect(struct rpc_client **cli, const char *url, const char *token,
                const struct tls_files *tls, const char *identity, char *err, size_t errlen)
{
    char dialed[256];
    int rv = tls_url(dialed, sizeof dialed, url, tls, err, errlen);
    if (rv != 0)
        return rv;
    if (probe_refused(url, err, errlen))
        return KOLO_ECONNREFUSED;
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
