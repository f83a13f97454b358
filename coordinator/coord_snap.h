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
void coord_snap_render_list(struct coord *c, struct job *j, struct jw *w);
void coord_snap_render_metrics(struct coord *c, struct buf *b);

#endif
