/*
 * snapshot.h - checkpoints through the coordinator (snapshot.c).
 */
#ifndef KOLO_WORKER_SNAPSHOT_H
#define KOLO_WORKER_SNAPSHOT_H

#include "ctx_model.h"

/* snapshot.c: kolo_fini stops the snapshot calls (mu not held), then
 * ctx_free frees what they used. */
void snapshot_ctx_stop(struct kolo_ctx *c);
void snapshot_ctx_free(struct kolo_ctx *c);

#endif
