/*
 * coord_verdict.h - the one line kolo run prints about a stuck or stopped
 * job, from the ranks' stacks and the operations they wait in. Pure: no
 * I/O, no coordinator state; table-tested in tests/coordinator.
 */
#ifndef KOLO_COORDINATOR_COORD_VERDICT_H
#define KOLO_COORDINATOR_COORD_VERDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a faulthandler dump says the program is: in its main thread (the
 * last one listed), the innermost frame in the user's own files (not the
 * standard library, site- or dist-packages, nor kolo's package), as
 * "train.py:88 in step", followed by " (in queues.py:107 get)" when the
 * innermost frame is elsewhere; the innermost frame when no frame is the
 * user's. false (out = "") when the text has no frame. */
bool verdict_where(const char *text, char *out, size_t size);

/* One operation some ranks submitted and others did not. */
struct verdict_op {
    const char *name;
    uint64_t waiting_ms;
    const bool *missing; /* [nranks]: has yet to submit it */
};

/* One rank as the verdict names it. */
struct verdict_rank {
    const char *host;  /* its host's name */
    const char *where; /* verdict_where of its stack, or what is known instead */
};

/* The verdict: with ops, which ranks wait in the oldest one and where the
 * ranks that never submitted it are instead (and when those wait in an
 * operation of another name, that the two can never match); without, where
 * the ranks are, the same places grouped. */
void verdict_build(const struct verdict_op *ops, size_t nops, const struct verdict_rank *ranks,
                   int nranks, char *out, size_t size);

#endif
