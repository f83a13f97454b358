/*
 * report_rate.h - how often a rank sends the coordinator its telemetry
 * (worker/runtime/report.c; bench/coord_load.c plays the same rule).
 *
 * Every rank's sender wakes every REPORT_PERIOD_MS. A batch with an epoch
 * boundary goes at once (`kolo run` prints epoch lines from them). One with
 * only step times and the readiness rounds' telemetry goes every
 * report_period_ms(rank, size): REPORT_PERIOD_MS for rank 0 (it carries the
 * job's round-wait samples) and in jobs of up to REPORT_RANKS_FULL ranks;
 * in larger jobs the other ranks stretch it, so a job sends at most about
 * 2 x REPORT_RANKS_FULL such reports a second however large it is. Each
 * costs the coordinator ~170 us of CPU on a 2-vCPU machine: 1024 ranks at
 * 500 ms took 3.5 ms of coordinator CPU per 10 ms step, at the stretched
 * period ~0.9 ms. What they feed (/ranks lag, the step heatmap) moves
 * slowly, so a 2 s lag at 1024 ranks costs nothing a user sees.
 */
#ifndef KOLO_WORKER_REPORT_RATE_H
#define KOLO_WORKER_REPORT_RATE_H

#define REPORT_PERIOD_MS     500
#define REPORT_PERIOD_MAX_MS 4000
#define REPORT_RANKS_FULL    256

static inline int report_period_ms(int rank, int size)
{
    if (rank == 0 || size <= REPORT_RANKS_FULL)
        return REPORT_PERIOD_MS;
    long ms = (long)REPORT_PERIOD_MS * size / REPORT_RANKS_FULL;
    return ms > REPORT_PERIOD_MAX_MS ? REPORT_PERIOD_MAX_MS : (int)ms;
}

#endif
