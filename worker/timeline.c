/*
 * timeline.c - kolo_timeline: start or stop the job's timeline at run time.
 *
 * The timeline is written by the coordinator (every rank's negotiation in
 * one file, see coordinator/coord_timeline.c); this asks it to. A rare
 * call, so it uses a connection of its own for the one request rather than
 * the background thread's, which may be parked in a negotiation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "kolo.pb-c.h"
#include "rpc.h"
#include "worker_int.h"

#define TIMELINE_CALL_MS 10000

int kolo_timeline(kolo_ctx *c, const char *path)
{
    if (!c || (path && strlen(path) >= 4096))
        return KOLO_EINVAL;
    char ident[64], url[512], err[512] = "";
    char *token = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->solo) {
        pthread_mutex_unlock(&c->mu);
        return ctx_error(c, KOLO_ENOTSUP,
                         "the timeline is written by the coordinator; start the program with "
                         "`kolo run`");
    }
    if (c->stopping || !c->coord_url) {
        pthread_mutex_unlock(&c->mu);
        return KOLO_ESHUTDOWN;
    }
    struct rpc_client_config rc;
    ctx_rpc_config(c, ident, sizeof ident, &rc);
    /* copies: c's may go once mu is released */
    snprintf(url, sizeof(url), "%s", c->coord_url);
    token = c->coord_token ? strdup(c->coord_token) : NULL;
    struct tls_files tls = c->tls;
    rc.url = url;
    rc.token = token;
    rc.tls = &tls;
    pthread_mutex_unlock(&c->mu);
    struct rpc_client *cli = NULL;
    int code = rpc_client_open(&cli, &rc);
    if (code) {
        free(token);
        return code;
    }
    Kolo__TimelineRequest req = KOLO__TIMELINE_REQUEST__INIT;
    req.path = (char *)(path ? path : "");
    size_t len = kolo__timeline_request__get_packed_size(&req);
    uint8_t *buf = malloc(len + 1);
    void *out = NULL;
    size_t olen = 0;
    if (!buf)
        code = KOLO_ENOMEM;
    else {
        kolo__timeline_request__pack(&req, buf);
        code = rpc_client_call(cli, "WorkerService.Timeline", buf, len, &out, &olen,
                               TIMELINE_CALL_MS, err, sizeof(err));
    }
    free(buf);
    free(out);
    rpc_client_close(cli);
    free(token);
    pthread_mutex_lock(&c->mu);
    if (code) {
        ctx_set_error(c, "kolo_timeline: %s", err[0] ? err : kolo_strerror(code));
    } else {
        /* The coordinator writes it now: this rank's next round carries
         * TRACE, so every rank reports the ops it agrees from then on
         * without waiting for the long-poll to tell. Stopped, the
         * long-poll's word ends TRACE. */
        c->timeline_asked = path && path[0];
        fast_news(c);
    }
    pthread_mutex_unlock(&c->mu);
    return code;
}
