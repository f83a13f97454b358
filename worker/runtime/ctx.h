/*
 * ctx.h - the context's life (kolo_init, kolo_fini), its background thread,
 * the negotiation with the coordinator and the response log (ctx.c).
 * The top of runtime/: it drives ops.c, fastpath.c, exec.c and the
 * services (solo, report, snapshot, timeline).
 */
#ifndef KOLO_WORKER_CTX_H
#define KOLO_WORKER_CTX_H

#include <stdbool.h>

#include "ctx_model.h"

/* ctx_fail sets the sticky error and fails everything pending (mu held). */
void ctx_fail(struct kolo_ctx *c, int code, const char *msg);
/* ctx_run_log_entry executes the next response of the log, which must
 * have arrived (mu and the executor token held; mu released meanwhile). */
void ctx_run_log_entry(struct kolo_ctx *c);
void ctx_send_queued(struct kolo_ctx *c);
bool ctx_try_execute(struct kolo_ctx *c, uint64_t now_us);
/* ctx_token_release gives the executor token back and wakes whoever waits
 * for it or for an op it completed (mu held). */
void ctx_token_release(struct kolo_ctx *c);

#endif
