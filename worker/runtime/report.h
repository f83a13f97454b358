/*
 * report.h - telemetry and timeline spans sent to the coordinator on a
 * thread of their own (report.c).
 */
#ifndef KOLO_WORKER_REPORT_H
#define KOLO_WORKER_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctx_model.h"

/* report.c (issue 6): kolo_fini flushes and stops the report sender
 * (mu not held): report_ctx_stop_begin tells it to send what is queued
 * and exit, and returns at once (kolo_fini says goodbye to the
 * coordinator meanwhile); report_ctx_stop waits until it has. ctx_free
 * frees it. */
void report_ctx_stop_begin(struct kolo_ctx *c);
void report_ctx_stop(struct kolo_ctx *c);
/* report_start starts the sender before any report (readiness rounds send
 * telemetry from the first round; call it without c->mu). report_round
 * queues one round's telemetry: ops agreed, this rank's moving average
 * wait per op, and the round's reduced longest wait in microseconds; only
 * the executor token's holder calls it (its one writer: no lock). */
int report_start(struct kolo_ctx *c);
void report_round(struct kolo_ctx *c, uint32_t agreed, double wait_avg_s, uint64_t wait_us);
void report_ctx_free(struct kolo_ctx *c);
/* The timeline's spans (fastpath.c, ctx.c): report_span_fill makes s a
 * span with copies of name and shape (false: out of memory);
 * report_trace hands n spans to the sender, which owns their copies from
 * then (a full queue drops them, counted); report_span_free frees one's
 * copies. */
bool report_span_fill(Kolo__TraceSpan *s, const char *name, const int64_t *shape, int ndim);
void report_span_free(Kolo__TraceSpan *s);
void report_trace(struct kolo_ctx *c, Kolo__TraceSpan *spans, size_t n);
/* report_flush_spans has the sender send the queued spans now (and the
 * clock sample they wait for first, if none came yet) and waits until it
 * has, at most timeout_ms (call without c->mu): stop_timeline, so that the
 * ops traced before it reach the file. false: not all went in time. */
bool report_flush_spans(struct kolo_ctx *c, int timeout_ms);

#endif
