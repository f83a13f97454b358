/*
 * test_verdict.c - the stuck-job verdict: verdict_where on faulthandler
 * dumps as Python 3.11 writes them, verdict_build on stalls of odd shapes.
 */
#include <stdio.h>
#include <string.h>

#include "coord_verdict.h"
#include "test.h"

/* A rank blocked in a collective: the main thread (listed last) is in
 * kolo's package under the user's line; a data loader thread first. */
static const char blocked[] =
    "Thread 0x00007f3c5e7fc700 (most recent call first):\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap\n"
    "\n"
    "Current thread 0x00007f3c6c6a2740 (most recent call first):\n"
    "  File \"/work/main/python/kolo/_ops.py\", line 212 in synchronize\n"
    "  File \"/work/main/python/kolo/torch/__init__.py\", line 90 in allreduce\n"
    "  File \"/home/u/train.py\", line 42 in step\n"
    "  File \"/home/u/train.py\", line 88 in <module>\n";

static const char loader[] =
    "Current thread 0x00007f3c6c6a2740 (most recent call first):\n"
    "  File \"/usr/lib/python3.11/multiprocessing/queues.py\", line 107 in get\n"
    "  File \"/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py\", line 1100 in "
    "_next_data\n"
    "  File \"/srv/job/train.py\", line 30 in __next__\n"
    "  File \"/srv/job/train.py\", line 61 in <module>\n";

static const char own_loop[] = "Stack (most recent call first):\n"
                               "  File \"/tmp/spin.py\", line 7 in <module>\n";

static const char only_lib[] = "Current thread 0x1 (most recent call first):\n"
                               "  File \"<frozen importlib._bootstrap>\", line 241 in _call\n"
                               "  File \"/usr/lib/python3.11/runpy.py\", line 88 in _run_code\n";

static void test_where(void)
{
    char w[256];
    CHECK(verdict_where(blocked, w, sizeof w));
    CHECK_EQ_STR(w, "train.py:42 in step (in _ops.py:212 synchronize)");
    CHECK(verdict_where(loader, w, sizeof w));
    CHECK_EQ_STR(w, "train.py:30 in __next__ (in queues.py:107 get)");
    CHECK(verdict_where(own_loop, w, sizeof w));
    CHECK_EQ_STR(w, "spin.py:7 in <module>");
    CHECK(verdict_where(only_lib, w, sizeof w));
    CHECK_EQ_STR(w, "<frozen importlib._bootstrap>:241 in _call");
    CHECK(!verdict_where("", w, sizeof w));
    CHECK_EQ_STR(w, "");
    CHECK(!verdict_where(NULL, w, sizeof w));
    CHECK(!verdict_where("garbage\n  File \"unterminated\n", w, sizeof w));
    /* a line cut mid-frame (the 256 KiB bound) still gives what came */
    CHECK(verdict_where("Stack (most recent call first):\n  File \"/a/b.py\", line 3", w, sizeof w));
    CHECK_EQ_STR(w, "b.py:3 in ");
    /* a small buffer truncates, never overruns */
    char tiny[8];
    CHECK(verdict_where(blocked, tiny, sizeof tiny));
    CHECK_EQ_INT(strlen(tiny), 7);
}

static void test_build(void)
{
    char out[1024];
    struct verdict_rank ranks[6] = {
        {"a", "train.py:42 in step"}, {"a", "train.py:42 in step"},
        {"b", "train.py:42 in step"}, {"b", "train.py:30 in __next__ (in queues.py:107 get)"},
        {"c", ""},                    {"c", "no Python stack: T (stopped by a signal)"},
    };
    /* rank 3 never submitted the op the others wait in */
    bool miss3[6] = {false, false, false, true, false, false};
    struct verdict_op one = {"grad.layer4", 62000, miss3};
    verdict_build(&one, 1, ranks, 6, out, sizeof out);
    CHECK_EQ_STR(out, "ranks 0, 1, 2, 4 and 1 more wait in 'grad.layer4' for 62 s; rank 3 (host "
                      "b) never submitted it: train.py:30 in __next__ (in queues.py:107 get)");
    /* two ranks wait on one that never came */
    bool miss0[2] = {false, true};
    verdict_build(&(struct verdict_op){"x", 9000, miss0}, 1, ranks + 4, 2, out, sizeof out);
    CHECK_EQ_STR(out, "rank 0 (host c) waits in 'x' for 9 s; rank 1 (host c) never submitted it: "
                      "no Python stack: T (stopped by a signal)");
    /* different collectives: rank 0 broadcasts, the others sync state */
    bool bmiss[3] = {false, true, true}, smiss[3] = {true, false, false};
    struct verdict_op two[2] = {{"broadcast.w", 5000, bmiss}, {"state.sync", 7000, smiss}};
    struct verdict_rank r3[3] = {{"a", "train.py:12 in <module>"},
                                 {"b", "state.py:40 in sync"},
                                 {"b", "state.py:40 in sync"}};
    verdict_build(two, 2, r3, 3, out, sizeof out);
    CHECK_EQ_STR(out, "ranks 1, 2 wait in 'state.sync' for 7 s; rank 0 (host a) waits in "
                      "'broadcast.w' instead, which the others never submit (the ranks run "
                      "different collectives, which can never match): train.py:12 in <module>");
    /* no stall: the ranks grouped by place */
    verdict_build(NULL, 0, ranks, 6, out, sizeof out);
    CHECK_EQ_STR(out, "ranks 0, 1, 2: train.py:42 in step; rank 3 (host b): train.py:30 in "
                      "__next__ (in queues.py:107 get); rank 4 (host c): nothing known; "
                      "1 more rank(s) elsewhere");
    /* one rank; none */
    verdict_build(NULL, 0, ranks, 1, out, sizeof out);
    CHECK_EQ_STR(out, "rank 0 (host a): train.py:42 in step");
    verdict_build(NULL, 0, ranks, 0, out, sizeof out);
    CHECK_EQ_STR(out, "no rank to ask");
    /* many missing ranks: three named, the rest counted */
    bool many[6] = {false, true, true, true, true, true};
    verdict_build(&(struct verdict_op){"y", 1000, many}, 1, ranks, 6, out, sizeof out);
    CHECK(strstr(out, "rank 0 (host a) waits in 'y' for 1 s; rank 1 (host a) never submitted it"));
    CHECK(strstr(out, "; 2 more rank(s) never submitted it"));
    /* a small buffer truncates */
    char tiny[16];
    verdict_build(&one, 1, ranks, 6, tiny, sizeof tiny);
    CHECK_EQ_INT(strlen(tiny), 15);
}

int main(void)
{
    test_where();
    test_build();
    TEST_DONE();
}
