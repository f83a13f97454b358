/*
 * exec.h - the executor: runs a response of the log, or a round's agreed
 * ops, on the data plane (exec.c; GPU responses go to nccl_exec.c).
 */
#ifndef KOLO_WORKER_EXEC_H
#define KOLO_WORKER_EXEC_H

#include <stddef.h>

#include "ctx_model.h"

/* exec.c (background thread, mu not held) */
void exec_response(struct kolo_ctx *c, const Kolo__Response *r);
/* Runs a response on ops the caller already holds (the agreed ops of a
 * readiness round), pinned by the caller under mu (op.pinned); r's names
 * are not read. */
void exec_pinned(struct kolo_ctx *c, const Kolo__Response *r, struct op **ops);
/* exec_post_scale: a reduction's average and postscale, after it
 * (plan.h: post_divisor, post_factor). */
struct plan;
void exec_post_scale(const struct plan *p, void *buf, size_t count);

#endif
