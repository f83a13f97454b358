/*
 * coord_timeline.h - Horovod's timeline of a job's negotiation (domain).
 */
#ifndef KOLO_COORDINATOR_COORD_TIMELINE_H
#define KOLO_COORDINATOR_COORD_TIMELINE_H

#include "coord_model.h"
#include "kolo.pb-c.h"

/* coord_timeline.c (issue 6): Horovod's Chrome-trace timeline of a job's
 * negotiation. coord_timeline_open returns NULL when the job's env has no
 * HOROVOD_TIMELINE (or the file cannot be created, logged). The event
 * functions only buffer; coord_timeline_cron writes (and, job_ended,
 * closes the file with its "]"); coord_timeline_free closes and frees. */
struct timeline;
struct timeline *coord_timeline_open(struct coord *c, const struct job *j);
/* coord_timeline_open_path opens one for path (relative to the job's
 * cwd): a label; the coordinator writes its own file in its own
 * directory, and the rank that asked copies it to path on its host
 * (coord_rpc_timeline_read, worker/runtime/timeline.c). */
struct timeline *coord_timeline_open_path(struct coord *c, const struct job *j, const char *path);
/* The coordinator's file it writes ("" if none); the path the job named;
 * what a failed open's errno means. */
const char *coord_timeline_path(const struct timeline *tl);
const char *coord_timeline_label(const struct timeline *tl);
const char *coord_timeline_why(int err);
void coord_timeline_request(struct timeline *tl, const char *name, const char *op, int rank,
                            bool first);
/* The tensor is ready: ends NEGOTIATE_<op>; with error set, that is all;
 * else begins <op>, ended by coord_timeline_fetched once every rank's
 * cursor passed index, with args (a JSON object) on the end event. */
void coord_timeline_ready(struct timeline *tl, const char *name, const char *op, uint64_t index,
                          const char *args, const char *error);
/* The ranks' spans under readiness rounds (coord_timeline.c, "the ranks'
 * spans"), from rank `rank` of `size`, whose clock is the coordinator's
 * minus offset_us. */
void coord_timeline_spans(struct timeline *tl, int rank, int size,
                          Kolo__TraceSpan *const *spans, size_t n, int64_t offset_us);
/* coord_timeline_stop: ops that began after now are not its; it keeps
 * taking the ranks' spans of earlier ones until coord_timeline_drained,
 * when its owner frees (closes) it. */
void coord_timeline_stop(struct timeline *tl);
/* coord_timeline_rank_dropped: a rank said it dropped this many spans so
 * far (logged when the file closes). NULL tl is fine. */
void coord_timeline_rank_dropped(struct timeline *tl, uint64_t dropped);
bool coord_timeline_drained(const struct timeline *tl);
bool coord_timeline_waiting(const struct timeline *tl);
void coord_timeline_fetched(struct timeline *tl, uint64_t min_cursor);
void coord_timeline_cron(struct timeline *tl, bool job_ended);
void coord_timeline_free(struct timeline *tl);
/* coord_timeline_serve puts the job's current timeline (else the last one
 * it stopped, else, for a job started under an earlier coordinator, the
 * file its HOROVOD_TIMELINE names) into out as a JSON array: unwritten
 * events written out first, and an array the writer has not closed yet
 * closed (a torn last event left out). Returns an HTTP status, with why
 * set unless it is 200: 404 no timeline or no file, 413 a file over
 * TL_MAX_SERVE, 500 unreadable. */
int coord_timeline_serve(struct coord *c, struct job *j, struct buf *out, char *why, size_t whylen);
/* Whether coord_timeline_serve has a file to serve for the job (the job
 * JSON's "timeline"). */
bool coord_timeline_available(struct coord *c, const struct job *j);
/* WorkerService.TimelineRead: the bytes of the job's timeline for a path
 * from an offset, and whether it is complete (worker/runtime/timeline.c). */
void coord_rpc_timeline_read(struct coord *c, struct rpc_call *call, enum coord_method m);

#endif
