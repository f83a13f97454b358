/*
 * ctx_model.c - see ctx_model.h: the functions on the context that only
 * read or write its fields, so that every file of runtime/ may call them
 * without calling up into ctx.c.
 */
#include "ctx_model.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc.h"
#include "util.h"

int ctx_error(struct kolo_ctx *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
    va_end(ap);
    return code;
}

void ctx_set_error(struct kolo_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
    va_end(ap);
}

void ctx_wake(struct kolo_ctx *c)
{
    pthread_cond_signal(&c->wake);
}

uint64_t ctx_deadline(const struct kolo_ctx *c)
{
    return now_mono_ms_coarse() + (uint64_t)c->timeout_ms;
}

bool ctx_log_put(struct kolo_ctx *c, Kolo__Response *x)
{
    if (x->index < c->resp_base) {
        kolo__response__free_unpacked(x, NULL);
        return false; /* already executed: a repeated read */
    }
    size_t slot = (size_t)(x->index - c->resp_base);
    if (slot >= c->resp_cap) {
        size_t cap = c->resp_cap ? c->resp_cap : 64;
        while (cap <= slot)
            cap *= 2;
        Kolo__Response **nr = realloc(c->resp, cap * sizeof(*nr));
        if (!nr) {
            kolo__response__free_unpacked(x, NULL);
            return false;
        }
        memset(nr + c->resp_cap, 0, (cap - c->resp_cap) * sizeof(*nr));
        c->resp = nr;
        c->resp_cap = cap;
    }
    if (c->resp[slot]) {
        kolo__response__free_unpacked(x, NULL);
        return false;
    }
    c->resp[slot] = x;
    return true;
}

void ctx_rpc_config(const struct kolo_ctx *c, char *ident, size_t identlen,
                    struct rpc_client_config *rc)
{
    snprintf(ident, identlen, "job%llu-rank%d", (unsigned long long)c->job, c->rank);
    *rc = (struct rpc_client_config){.url = c->coord_url,
                                     .token = c->coord_token,
                                     .token_is_job = c->coord_token_job,
                                     .identity = ident,
                                     .job_id = c->job,
                                     .generation = c->generation,
                                     .rank = c->rank,
                                     .tls = &c->tls,
                                     /* someone else's parked calls must
                                      * not fail a training job (issue 28) */
                                     .retry_busy = true,
                                     /* init -> shutdown -> init keeps
                                      * its connections (rpc.h) */
                                     .reuse = true};
}
