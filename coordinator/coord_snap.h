/*
 * coord_snap.h - snapshots (domain): uploads, the snapshot writer, reads.
 */
#ifndef KOLO_COORDINATOR_COORD_SNAP_H
#define KOLO_COORDINATOR_COORD_SNAP_H

#include "coord_model.h"

void coord_rpc_snapshot(struct coord *c, struct rpc_call *call, enum coord_method m);
void coord_snap_cron(struct coord *c, uint64_t now);
/* The snapshot writer thread (own SQLite connection): started after the
 * store is open, stopped before the RPC server closes. */
int coord_snap_start(struct coord *c, char *err, size_t errlen);
void coord_snap_stop(struct coord *c);
void coord_snap_free(struct coord *c);

/* ---- queries (read-only; under the state lock) ---- */

/* coord_snap_list reads a job's snapshots, newest first, into l (free it
 * with coord_snap_list_free, also on failure); 0, or KOLO_ENOMEM /
 * KOLO_ESTORE. */
struct snap_list {
    struct store_snapshot *v;
    size_t n, cap;
    bool oom;
};
int coord_snap_list(struct coord *c, uint64_t job_id, struct snap_list *l);
void coord_snap_list_free(struct snap_list *l);
/* How many snapshots per job retention keeps (--snapshot-keep). */
int64_t coord_snap_keep(const struct coord *c);
/* Uploads in flight, at most, in all. */
#define SNAP_MAX_UPLOADS 64
/* An upload in progress. coord_snap_uploads fills at most max of a job's
 * and returns how many. */
struct snap_upload_info {
    uint64_t upload_id;
    int rank;
    uint32_t chunks_received, chunks;
    uint64_t bytes_received, bytes;
    uint64_t age_ms;
};
size_t coord_snap_uploads(struct coord *c, uint64_t job_id, struct snap_upload_info *out,
                          size_t max);
void coord_snap_render_metrics(struct coord *c, struct buf *b);

#endif
