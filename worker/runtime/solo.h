/*
 * solo.h - the one-rank context of a process started without kolo run
 * (solo.c).
 */
#ifndef KOLO_WORKER_SOLO_H
#define KOLO_WORKER_SOLO_H

#include <stddef.h>

#include "ctx_model.h"

/* solo_config checks a configuration without a coordinator (a size above
 * 1 is refused, with the reason in err) and fills cfg with one rank's. */
int solo_config(const kolo_config *given, kolo_config *cfg, char *err, size_t errlen);
/* solo_setup makes the data plane of one rank (a ring of one). */
int solo_setup(struct kolo_ctx *c);
/* solo_negotiate answers every queued op at once with the log entry a
 * coordinator writes for one rank, appended to the log (mu held). */
void solo_negotiate(struct kolo_ctx *c);

#endif
