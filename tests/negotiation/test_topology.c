/*
 * test_topology.c - a generation's hosts (negotiation/topology.h) as a
 * table: the rule the coordinator and every rank apply, and the checks
 * on a list the coordinator sent.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kolo/abi.h"
#include "test.h"
#include "topology.h"

/* expect: the hosts as text, "0,1|2" (ranks in local order, hosts in ring order) */
static void shown(const struct topology *t, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int h = 0; h < t->nhosts; h++)
        for (int i = 0; i < t->count[h]; i++)
            used += (size_t)snprintf(buf + used, len - used, "%s%d",
                                     i ? "," : h ? "|" : "", topology_rank(t, h, i));
}

struct derive_case {
    const char *what;
    int size;
    const char *hosts[8];
    bool leads[8];
    const char *expect;
    int min_local, max_local;
    bool contiguous;
};

static const struct derive_case derive_cases[] = {
    {"one rank", 1, {"a"}, {false}, "0", 1, 1, true},
    {"one host", 4, {"a", "a", "a", "a"}, {true}, "0,1,2,3", 4, 4, true},
    {"one rank per host", 3, {"a", "b", "c"}, {false}, "0|1|2", 1, 1, true},
    {"two hosts in blocks", 4, {"a", "a", "b", "b"}, {true, false, true}, "0,1|2,3", 2, 2, true},
    {"uneven 3+1+2", 6, {"a", "a", "a", "b", "c", "c"}, {true, false, false, true, true},
     "0,1,2|3|4,5", 1, 3, true},
    {"interleaved (an elastic reset)", 4, {"a", "b", "a", "b"}, {true, true}, "0,2|1,3", 2, 2,
     false},
    {"the segment's creator leads", 3, {"a", "a", "a"}, {false, false, true}, "2,0,1", 3, 3,
     false},
    {"hosts by their lowest rank", 5, {"x", "y", "y", "x", "z"}, {false}, "0,3|1,2|4", 1, 2,
     false},
};

static void test_derive(void)
{
    for (size_t k = 0; k < sizeof derive_cases / sizeof *derive_cases; k++) {
        const struct derive_case *c = &derive_cases[k];
        struct topology t;
        char why[128], got[128];
        REQUIRE(topology_derive(&t, c->size, c->hosts, c->leads, why, sizeof why) == 0);
        shown(&t, got, sizeof got);
        if (strcmp(got, c->expect) != 0)
            fprintf(stderr, "%s: %s, expected %s\n", c->what, got, c->expect);
        CHECK_EQ_STR(got, c->expect);
        CHECK_EQ_INT(t.min_local, c->min_local);
        CHECK_EQ_INT(t.max_local, c->max_local);
        CHECK_EQ_INT(topology_contiguous(&t), c->contiguous);
        for (int r = 0; r < c->size; r++) /* host and local index agree with the list */
            CHECK_EQ_INT(topology_rank(&t, t.host[r], t.local[r]), r);
        topology_free(&t);
    }
    struct topology t;
    char why[128];
    const char *empty[] = {"a", ""};
    CHECK_EQ_INT(topology_derive(&t, 2, empty, NULL, why, sizeof why), KOLO_EINVAL);
    CHECK(strstr(why, "rank 1") != NULL);
}

static void test_derive_large(void)
{
    /* 128 hosts x 8, ranks dealt round-robin over the hosts */
    static char names[128][8];
    static const char *ids[1024];
    for (int h = 0; h < 128; h++)
        snprintf(names[h], sizeof names[h], "h%d", h);
    for (int r = 0; r < 1024; r++)
        ids[r] = names[r % 128];
    struct topology t;
    char why[128];
    REQUIRE(topology_derive(&t, 1024, ids, NULL, why, sizeof why) == 0);
    CHECK_EQ_INT(t.nhosts, 128);
    CHECK_EQ_INT(t.min_local, 8);
    CHECK_EQ_INT(t.max_local, 8);
    CHECK_EQ_INT(topology_rank(&t, 5, 3), 3 * 128 + 5);
    CHECK_EQ_INT(t.local[3 * 128 + 5], 3);
    CHECK(!topology_contiguous(&t));
    topology_free(&t);
}

struct set_case {
    const char *what;
    int size, nhosts;
    int counts[4];
    int ranks[8];
    int code;
};

static const struct set_case set_cases[] = {
    {"fine", 3, 2, {2, 1}, {1, 0, 2}, 0},
    {"a rank twice", 3, 2, {2, 1}, {1, 1, 2}, KOLO_EPROTO},
    {"a rank out of range", 3, 2, {2, 1}, {0, 1, 3}, KOLO_EPROTO},
    {"a negative rank", 2, 1, {2}, {0, -1}, KOLO_EPROTO},
    {"an empty host", 2, 2, {2, 0}, {0, 1}, KOLO_EPROTO},
    {"too few ranks", 3, 1, {2}, {0, 1}, KOLO_EPROTO},
    {"too many hosts", 1, 2, {1, 1}, {0, 0}, KOLO_EPROTO},
};

static void test_set(void)
{
    for (size_t k = 0; k < sizeof set_cases / sizeof *set_cases; k++) {
        const struct set_case *c = &set_cases[k];
        struct topology t;
        char why[128] = "";
        int rc = topology_set(&t, c->size, c->nhosts, c->counts, c->ranks, why, sizeof why);
        if (rc != c->code)
            fprintf(stderr, "%s: %d (%s)\n", c->what, rc, why);
        CHECK_EQ_INT(rc, c->code);
        if (!rc) {
            CHECK_EQ_INT(t.host[0], 0);
            CHECK_EQ_INT(t.local[0], 1);
            CHECK_EQ_INT(t.host[2], 1);
            topology_free(&t);
        } else {
            CHECK(why[0] != '\0');
        }
    }
}

int main(void)
{
    test_derive();
    test_derive_large();
    test_set();
    TEST_DONE();
}
