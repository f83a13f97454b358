/*
 * clock_offset.c - another clock's offset from round trips (clock_offset.h).
 */
#include "clock_offset.h"

bool clock_offset_add(struct clock_offset *co, uint64_t t0, uint64_t t1, uint64_t t2,
                      uint64_t t3)
{
    if (t3 < t0 || t2 < t1 || t2 - t1 > t3 - t0)
        return false;
    /* in signed arithmetic: the clocks may be any distance apart */
    int64_t there = (int64_t)(t1 - t0), back = (int64_t)(t2 - t3);
    co->s[co->next].offset_us = there / 2 + back / 2 + (there % 2 + back % 2) / 2;
    co->s[co->next].rtt_us = (t3 - t0) - (t2 - t1);
    co->next = (co->next + 1) % CLOCK_OFFSET_SAMPLES;
    if (co->n < CLOCK_OFFSET_SAMPLES)
        co->n++;
    return true;
}

bool clock_offset_best(const struct clock_offset *co, int64_t *offset_us, uint64_t *rtt_us)
{
    int best = -1;
    for (int i = 0; i < co->n; i++)
        if (best < 0 || co->s[i].rtt_us < co->s[best].rtt_us)
            best = i;
    if (best < 0)
        return false;
    *offset_us = co->s[best].offset_us;
    *rtt_us = co->s[best].rtt_us;
    return true;
}
