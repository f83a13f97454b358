/*
 * test_time_split.c - worker/runtime/time_split.h as a table: sequences of
 * blocked/running changes at given microseconds, and the window's totals
 * they must add up to (compute = wall - wait - data; overlap inside
 * compute), nested waiters and collectives, a window taken in the middle
 * of a state, and the first window (from the first change on).
 */
#include <stdio.h>
#include <string.h>

#include "test.h"
#include "time_split.h"

/* one change: at `t` µs, `what` ('b' blocked, 'r' running) by `delta`;
 * 't' takes the window */
struct step {
    char what;
    uint64_t t;
    int delta;
};

struct split_case {
    const char *name;
    struct step steps[12];
    struct time_split_window want; /* the last window taken */
};

static const struct split_case cases[] = {
    {"compute only", {{'b', 100, +1}, {'b', 100, -1}, {'t', 1100, 0}}, {1000, 0, 0, 0}},
    {"wait for the others, then data",
     {{'b', 100, +1}, {'r', 400, +1}, {'r', 500, -1}, {'b', 500, -1}, {'t', 1100, 0}},
     {1000, 300, 100, 0}},
    {"data behind compute (overlap)",
     {{'r', 100, +1}, {'r', 600, -1}, {'t', 1100, 0}},
     {1000, 0, 0, 500}},
    {"overlap, then the user waits for the rest",
     {{'r', 100, +1}, {'b', 300, +1}, {'r', 400, -1}, {'b', 450, -1}, {'t', 1100, 0}},
     {1000, 50, 100, 200}},
    {"two waiters, nested collectives",
     {{'b', 100, +1},
      {'b', 200, +1},
      {'r', 300, +1},
      {'r', 350, +1},
      {'r', 400, -1},
      {'b', 450, -1},
      {'r', 500, -1},
      {'b', 700, -1},
      {'t', 1100, 0}},
     {1000, 400, 200, 0}},
    {"a window taken while waiting: the state carries over",
     {{'b', 100, +1}, {'t', 600, 0}, {'b', 800, -1}, {'t', 1600, 0}},
     {1000, 200, 0, 0}},
    {"a window taken while running behind compute",
     {{'r', 100, +1}, {'t', 300, 0}, {'r', 700, -1}, {'t', 1300, 0}},
     {1000, 0, 0, 400}},
    {"an unmatched end never goes below zero",
     {{'b', 100, +1}, {'b', 200, -1}, {'b', 300, -1}, {'b', 400, +1}, {'b', 500, -1},
      {'t', 1100, 0}},
     {1000, 200, 0, 0}},
    {"time running backwards adds nothing",
     {{'b', 500, +1}, {'b', 400, -1}, {'t', 1500, 0}},
     {1000, 0, 0, 0}},
};

static void test_table(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct split_case *k = &cases[i];
        struct time_split t;
        memset(&t, 0, sizeof t);
        struct time_split_window w = {0};
        bool took = false;
        for (size_t s = 0; s < 12 && k->steps[s].what; s++) {
            const struct step *st = &k->steps[s];
            if (st->what == 'b')
                time_split_blocked(&t, st->t, st->delta);
            else if (st->what == 'r')
                time_split_running(&t, st->t, st->delta);
            else
                took = time_split_take(&t, st->t, &w);
        }
        if (!took || w.wall_us != k->want.wall_us || w.wait_us != k->want.wait_us ||
            w.data_us != k->want.data_us || w.overlap_us != k->want.overlap_us) {
            fprintf(stderr,
                    "%s: took %d, wall %llu wait %llu data %llu overlap %llu "
                    "(want %llu %llu %llu %llu)\n",
                    k->name, took, (unsigned long long)w.wall_us, (unsigned long long)w.wait_us,
                    (unsigned long long)w.data_us, (unsigned long long)w.overlap_us,
                    (unsigned long long)k->want.wall_us, (unsigned long long)k->want.wait_us,
                    (unsigned long long)k->want.data_us, (unsigned long long)k->want.overlap_us);
            CHECK(0);
        }
        CHECK(w.wait_us + w.data_us <= w.wall_us && w.overlap_us <= w.wall_us);
    }
}

static void test_nothing_measured(void)
{
    struct time_split t;
    memset(&t, 0, sizeof t);
    struct time_split_window w;
    CHECK(!time_split_take(&t, 1000, &w)); /* no change yet: no window */
    time_split_blocked(&t, 2000, +1);
    CHECK(!time_split_take(&t, 2000, &w)); /* an empty window */
    CHECK(time_split_take(&t, 2500, &w));
    CHECK(w.wall_us == 500 && w.wait_us == 500);
}

int main(void)
{
    test_table();
    test_nothing_measured();
    TEST_DONE();
}
