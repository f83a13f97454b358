/*
 * test_keep.c - worker/runtime/keep.h: what a host does with the segments
 * its ranks kept from the last elastic generation, as a table of the codes
 * the rendezvous relays, and the list the segments are parked in.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "keep.h"
#include "test.h"

/* codes[i] for a host whose members report: 'L' the leader's kept segment
 * at its own index, 'l' that segment at another index (the order changed),
 * 'o' another segment, '-' none */
static void codes_of(const char *who, uint64_t seg, uint64_t other, uint64_t *codes)
{
    for (int i = 0; who[i]; i++) {
        switch (who[i]) {
        case 'L': codes[i] = seg | (uint64_t)i; break;
        case 'l': codes[i] = seg | (uint64_t)(i + 1); break;
        case 'o': codes[i] = other | (uint64_t)i; break;
        default: codes[i] = 0; break;
        }
    }
}

static void test_plan_table(void)
{
    /* the segment's code with its member bits clear, as keep_code makes it */
    const uint64_t seg = (UINT64_C(1) << 63) | (UINT64_C(0xabcdef) << 12);
    const uint64_t other = (UINT64_C(1) << 63) | (UINT64_C(0x123456) << 12);
    static const struct {
        const char *who; /* the host's members in local order, leader first */
        int held;        /* the size of the segment this rank holds, 0 none */
        enum keep_plan want;
    } rows[] = {
        {"L", 1, KEEP_REUSE},        /* one rank: nothing to agree on */
        {"LL", 2, KEEP_REUSE},
        {"LLLL", 4, KEEP_REUSE},
        {"----", 0, KEEP_NONE},      /* the leader made a new one */
        {"-LLL", 4, KEEP_NONE},
        {"LLL-", 4, KEEP_FRESH},     /* a new member */
        {"LLL-", 0, KEEP_FRESH},     /* ... which decides alike */
        {"LLLo", 4, KEEP_FRESH},     /* a member from another segment */
        {"LLl", 4, KEEP_FRESH},      /* another order */
        {"LLL", 4, KEEP_FRESH},      /* a member of the segment gone */
        {"LLLLL", 4, KEEP_FRESH},    /* more members than it has */
        {"oLL", 3, KEEP_FRESH},      /* the leader's is not ours */
    };
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        uint64_t codes[8];
        int n = (int)strlen(rows[r].who);
        codes_of(rows[r].who, seg, other, codes);
        int held = rows[r].held;
        enum keep_plan got = keep_plan(codes, n, held);
        if (got != rows[r].want) {
            fprintf(stderr, "row %zu (%s, holding %d): plan %d, want %d\n", r, rows[r].who,
                    held, (int)got, (int)rows[r].want);
            CHECK(0);
        }
    }
    CHECK_EQ_INT(keep_plan(NULL, 0, 0), KEEP_NONE);
}

/* Parked segments: taken back once by the worker that parked them; a
 * second park of the same worker, or a park of another job, destroys the
 * older ones. Real one-rank segments. */
static struct coll *one_rank_segment(int i)
{
    char name[64];
    snprintf(name, sizeof name, "/kolo-test-keep-%d-%d", (int)getpid(), i);
    struct coll *c = NULL;
    REQUIRE(shmcoll_create(name, 0, 1, 0, &c) == 0);
    int pid = (int)getpid();
    REQUIRE(shmcoll_ready(c, &pid, 0) == 0);
    struct coll *kept = c->ops->keep_segment(c);
    REQUIRE(kept == c);
    return kept;
}

static void test_parking(void)
{
    struct coll *a = one_rank_segment(1), *b = one_rank_segment(2);
    CHECK(shmcoll_id(a) != 0 && shmcoll_id(a) != shmcoll_id(b));
    uint64_t code = keep_code(a);
    CHECK(code != 0);
    CHECK_EQ_INT((int)(code & 0xfff), 0); /* member 0 */
    CHECK(keep_take(7, 1) == NULL);
    keep_park(7, 1, a);
    keep_park(7, 2, b);
    CHECK(keep_take(7, 3) == NULL);
    CHECK(keep_take(8, 1) == NULL);
    CHECK(keep_take(7, 1) == a);
    CHECK(keep_take(7, 1) == NULL); /* once */
    keep_park(7, 1, a);
    keep_park(9, 1, one_rank_segment(3)); /* another job: 7's go */
    CHECK(keep_take(7, 1) == NULL);
    CHECK(keep_take(7, 2) == NULL);
    struct coll *c = keep_take(9, 1);
    REQUIRE(c != NULL);
    CHECK_EQ_INT(shmcoll_rearm(c, 1, 0), 0); /* a member of one comes back alone */
    float v = 2;
    CHECK_EQ_INT(c->ops->allreduce(c, KOLO_FLOAT32, KOLO_SUM, &v, &v, 1, 0), 0);
    CHECK(v == 2);
    c->ops->destroy(c);
}

int main(void)
{
    test_plan_table();
    test_parking();
    TEST_DONE();
}
