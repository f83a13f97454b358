/*
 * coord_api.h - the api layer, on top: coord.c's work queue (the RPC
 * method table dispatches from it) and coord_http.c's REST API and
 * dashboard, the only place that renders JSON.
 */
#ifndef KOLO_COORDINATOR_COORD_API_H
#define KOLO_COORDINATOR_COORD_API_H

#include "coord_model.h"

/* coord.c: runs w (an RPC call or an HTTP request) under the state lock,
 * or refuses it while the coordinator stops. */
void coord_post(struct coord *c, struct work *w);

/* coord_http_uint_param reads the integer parameter key of a query string
 * ("a=1&b=2") from lo to hi into *v, which keeps its default when the
 * query does not have it. Anything else (not digits, out of range, empty)
 * returns false with err naming the parameter: a typo must not silently
 * turn into the default. */
bool coord_http_uint_param(const char *query, const char *key, uint64_t lo, uint64_t hi,
                           uint64_t *v, char *err, size_t errlen);
/* coord_http_report renders sub ("/epochs", "/steps", "/ranks") of job j
 * into w and returns the HTTP status; on another status than 200 err
 * holds the message and w's output is to be discarded. */
int coord_http_report(struct coord *c, struct job *j, const char *sub, const char *query,
                      struct jw *w, char *err, size_t errlen);
/* coord_http_study renders REST /studies (name NULL) or /studies/{name}
 * into w, as coord_http_report does. */
int coord_http_study(struct coord *c, const char *name, struct jw *w, char *err, size_t errlen);
int coord_http_start(struct coord *c, char *err, size_t errlen);

/* Limits on HTTP connections (coord_http_guard.c), checked every
 * HTTP_GUARD_MS from the cron: idle (no byte either way) at most
 * cfg.http_idle_ms (HTTP_IDLE_MS by default), at most HTTP_MAX_PER_SOURCE from one address and
 * HTTP_MAX_CONNS in all; the longest idle go first. */
#define HTTP_GUARD_MS       1000
#define HTTP_IDLE_MS        60000
#define HTTP_MAX_PER_SOURCE 64
#define HTTP_MAX_CONNS      1024
enum { HTTP_CLOSED_IDLE, HTTP_CLOSED_PER_SOURCE, HTTP_CLOSED_TOTAL };
void coord_http_guard(struct coord *c, uint64_t now);
void coord_http_handle(struct coord *c, nng_aio *aio);
/* coord_http_stop stops the HTTP server, waiting at most HTTP_STOP_MS
 * for nng: past it the server is left behind (logged) and c->http_left
 * set, so that the state a late callback could touch outlives the stop. */
#define HTTP_STOP_MS 3000
void coord_http_stop(struct coord *c);

#endif
