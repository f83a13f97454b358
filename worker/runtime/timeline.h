/*
 * timeline.h - rank 0's copy of the job's timeline (timeline.c).
 */
#ifndef KOLO_WORKER_TIMELINE_H
#define KOLO_WORKER_TIMELINE_H

#include "ctx_model.h"

/* Rank 0's copy of the job's timeline goes on in (or, with
 * HOROVOD_TIMELINE, starts with) a new context, and is made current and
 * a valid file when one ends. Contexts of process sets leave it alone. */
void timeline_ctx_init(struct kolo_ctx *c);
void timeline_ctx_fini(struct kolo_ctx *c);

#endif
