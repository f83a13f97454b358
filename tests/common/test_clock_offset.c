/*
 * test_clock_offset.c - another clock's offset from round trips
 * (common/clock_offset.h), as a table of exchanges.
 */
#include <stdint.h>
#include <stdio.h>

#include "clock_offset.h"
#include "test.h"

struct exchange {
    const char *what;
    int64_t offset;     /* the true one: their clock minus ours */
    uint64_t out, back; /* the two ways' delays */
    uint64_t work;      /* how long they took to reply */
};

static void test_exchanges(void)
{
    static const struct exchange cases[] = {
        {"same clock, symmetric", 0, 50, 50, 10},
        {"ahead by 4 ms", 4000, 1000, 1000, 100},
        {"behind by 100 s (a time namespace)", -100000000, 30, 30, 5},
        {"asymmetric: off by half the difference", 250, 900, 100, 0},
        {"instant", 7, 0, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct exchange *e = &cases[c];
        struct clock_offset co = {0};
        uint64_t t0 = 200000000, t1 = (uint64_t)((int64_t)(t0 + e->out) + e->offset);
        uint64_t t2 = t1 + e->work, t3 = (uint64_t)((int64_t)t2 - e->offset) + e->back;
        CHECK(clock_offset_add(&co, t0, t1, t2, t3));
        int64_t off;
        uint64_t rtt;
        CHECK(clock_offset_best(&co, &off, &rtt));
        int64_t want = e->offset + ((int64_t)e->out - (int64_t)e->back) / 2;
        if (off != want || rtt != e->out + e->back)
            fprintf(stderr, "case '%s': offset %lld rtt %llu\n", e->what, (long long)off,
                    (unsigned long long)rtt);
        CHECK(off == want);
        CHECK_EQ_INT(rtt, e->out + e->back);
        /* the error is never more than half the round trip */
        int64_t err = off - e->offset;
        CHECK((uint64_t)(err < 0 ? -err : err) <= rtt / 2);
    }
}

static void test_impossible(void)
{
    struct clock_offset co = {0};
    int64_t off;
    uint64_t rtt;
    CHECK(!clock_offset_best(&co, &off, &rtt));
    CHECK(!clock_offset_add(&co, 100, 5, 6, 50));   /* the reply before the request */
    CHECK(!clock_offset_add(&co, 100, 9, 5, 200));  /* replied before it received */
    CHECK(!clock_offset_add(&co, 100, 0, 500, 200)); /* worked longer than the round trip */
    CHECK(!clock_offset_best(&co, &off, &rtt));
}

/* The sample with the smallest round trip wins, among the last 16. */
static void test_best_of_last(void)
{
    struct clock_offset co = {0};
    int64_t off;
    uint64_t rtt;
    /* a quick exchange with offset 10, then 16 slow ones with offset 900 */
    CHECK(clock_offset_add(&co, 1000, 1015, 1015, 1010)); /* offset 10, rtt 10 */
    CHECK(clock_offset_best(&co, &off, &rtt));
    CHECK(off == 10 && rtt == 10);
    for (int i = 0; i < 15; i++)
        CHECK(clock_offset_add(&co, 2000, 2950, 2950, 2100)); /* offset 900, rtt 100 */
    CHECK(clock_offset_best(&co, &off, &rtt));
    CHECK(off == 10 && rtt == 10); /* still among the last 16 */
    CHECK(clock_offset_add(&co, 2000, 2950, 2950, 2100));
    CHECK(clock_offset_best(&co, &off, &rtt));
    CHECK(off == 900 && rtt == 100); /* pushed out */
}

int main(void)
{
    test_exchanges();
    test_impossible();
    test_best_of_last();
    TEST_DONE();
}
