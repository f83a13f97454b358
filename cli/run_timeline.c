/*
 * run_timeline.c - the launcher's last copy of a local job's timeline.
 *
 * Rank 0 copies the coordinator's timeline to the job's HOROVOD_TIMELINE
 * path while it runs (worker/runtime/timeline.c), but the ends of the job's last
 * ops are written only when the job ends, after rank 0 left. So kolo run,
 * whose embedded coordinator ran the job on this host, writes the
 * finished file once more when the job is over: what Horovod leaves at
 * --timeline-filename. The coordinator's own file stays where it is
 * (docs/timeline.md).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "errors.h"
#include "kolo.pb-c.h"
#include "run.h"
#include "util.h"

#define FINAL_WAIT_MS 5000

void run_timeline_final(struct rpc_client *cli, uint64_t job_id, const char *path)
{
    if (!path || !path[0])
        return;
    int fd = -1;
    uint64_t offset = 0, deadline = now_mono_ms() + FINAL_WAIT_MS;
    char err[512];
    while (now_mono_ms() < deadline) {
        Kolo__TimelineReadRequest req = KOLO__TIMELINE_READ_REQUEST__INIT;
        req.path = (char *)path;
        req.offset = offset;
        req.job = job_id;
        ProtobufCMessage *msg = NULL;
        int rv = cli_call(cli, "WorkerService.TimelineRead", &req.base,
                          &kolo__timeline_read_reply__descriptor, &msg, 5000, err, sizeof err);
        if (rv == KOLO_ENOTFOUND)
            break; /* the coordinator wrote none: rank 0's file, if any, stands */
        if (rv != 0) {
            fprintf(stderr, "[kolo] the timeline %s: %s\n", path, err);
            break;
        }
        Kolo__TimelineReadReply *rep = (Kolo__TimelineReadReply *)msg;
        if (fd < 0 && (fd = trace_file_open(path)) < 0) {
            int e = errno;
            fprintf(stderr, "[kolo] cannot write the timeline %s: %s\n", path,
                    e == EEXIST ? TRACE_FILE_EEXIST : strerror(e));
            protobuf_c_message_free_unpacked(msg, NULL);
            break;
        }
        bool failed = rep->data.len && pwrite_all(fd, rep->data.data, rep->data.len, offset) != 0;
        offset += rep->data.len;
        bool done = failed || (rep->ended && offset >= rep->size);
        bool more = offset < rep->size;
        protobuf_c_message_free_unpacked(msg, NULL);
        if (failed)
            fprintf(stderr, "[kolo] cannot write the timeline %s: %s\n", path, strerror(errno));
        if (done)
            break;
        if (!more)
            usleep(100000); /* its writer is closing it */
    }
    if (fd >= 0)
        close(fd);
}
