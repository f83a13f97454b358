/*
 * clock_offset.h - how far another process's clock is from ours, from the
 * round trips of requests we send it (NTP's way): each exchange gives
 *   t0  we send (our clock)       t1  it receives (its clock)
 *   t3  we get the reply (ours)   t2  it replies (its clock)
 * offset = ((t1 - t0) + (t2 - t3)) / 2, its clock minus ours, and
 * rtt = (t3 - t0) - (t2 - t1), the time on the wire. The offset is exact
 * when the two ways take as long; its error is at most rtt / 2, so the
 * sample with the smallest rtt of the last CLOCK_OFFSET_SAMPLES is the one
 * to believe. Ranks use it to place their telemetry's timestamps (their
 * own CLOCK_MONOTONIC) on the coordinator's.
 */
#ifndef KOLO_COMMON_CLOCK_OFFSET_H
#define KOLO_COMMON_CLOCK_OFFSET_H

#include <stdbool.h>
#include <stdint.h>

#define CLOCK_OFFSET_SAMPLES 16

struct clock_offset {
    struct {
        int64_t offset_us;
        uint64_t rtt_us;
    } s[CLOCK_OFFSET_SAMPLES];
    int n, next;
};

/* clock_offset_add records one exchange (a zeroed struct has none). An
 * exchange whose times cannot be (the reply before the request, the peer
 * replying before receiving) is ignored: false. */
bool clock_offset_add(struct clock_offset *co, uint64_t t0, uint64_t t1, uint64_t t2,
                      uint64_t t3);
/* clock_offset_best: the offset and rtt of the sample with the smallest
 * rtt among the last CLOCK_OFFSET_SAMPLES; false when there is none. */
bool clock_offset_best(const struct clock_offset *co, int64_t *offset_us, uint64_t *rtt_us);

#endif
