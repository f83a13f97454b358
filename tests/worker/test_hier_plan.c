/*
 * test_hier_plan.c - one rank's part in a job that spans hosts
 * (worker/coll/hier_plan.h) as tables: the lanes' links, each rank's lane and
 * links on odd shapes (1 host; 1 rank per host; 3+1+2; 128 x 8), and the
 * allreduce's choice of algorithm.
 */
#include <stdio.h>
#include <string.h>

#include "hier_plan.h"
#include "kolo/abi.h"
#include "test.h"
#include "topology.h"

static int ceil_log2(int n)
{
    int k = 0;
    while ((1 << k) < n)
        k++;
    return k;
}

/* hier_links: symmetric, at most 2 ceil(log2 n), ring neighbours in it */
static void test_links(void)
{
    static const struct {
        int m, n;
        const char *expect;
    } cases[] = {
        {0, 1, ""},          {0, 2, "1"},          {1, 2, "0"},
        {0, 3, "1,2"},       {0, 4, "1,2,3"},      {0, 6, "1,2,4,5"},
        {3, 6, "1,2,4,5"},   {0, 8, "1,2,4,6,7"},  {5, 12, "1,3,4,6,7,9"},
        {0, 128, "1,2,4,8,16,32,64,96,112,120,124,126,127"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int out[64], nl = hier_links(cases[k].m, cases[k].n, out);
        char got[256] = "";
        size_t used = 0;
        for (int i = 0; i < nl; i++)
            used += (size_t)snprintf(got + used, sizeof got - used, "%s%d", i ? "," : "", out[i]);
        if (strcmp(got, cases[k].expect) != 0)
            fprintf(stderr, "links of %d in %d: %s\n", cases[k].m, cases[k].n, got);
        CHECK_EQ_STR(got, cases[k].expect);
    }
    for (int n = 1; n <= 300; n++) {
        for (int m = 0; m < n; m++) {
            int out[64], nl = hier_links(m, n, out);
            CHECK(nl <= 2 * ceil_log2(n));
            for (int i = 0; i < nl; i++) { /* j links m whenever m links j */
                int back[64], nb = hier_links(out[i], n, back), found = 0;
                for (int j = 0; j < nb; j++)
                    found |= back[j] == m;
                CHECK(found);
            }
            if (n > 1) {
                int found = 0;
                for (int i = 0; i < nl; i++)
                    found |= out[i] == (m + 1) % n;
                CHECK(found);
            }
        }
    }
}

struct shape_case {
    const char *what;
    int nhosts;
    int counts[8];
    int rank;
    /* expected */
    int host, local, nlocal, lanes, lane, nlinks;
    const char *links;
};

/* ranks numbered host after host */
static const struct shape_case shapes[] = {
    {"1 host", 1, {4}, 2, 0, 2, 4, 4, 2, 0, ""},
    {"1 rank per host, 4 hosts", 4, {1, 1, 1, 1}, 1, 1, 0, 1, 1, 0, 3, "0,2,3"},
    {"2 x 2, rank 3", 2, {2, 2}, 3, 1, 1, 2, 2, 1, 1, "1"},
    {"3+1+2, rank 0 (a leader)", 3, {3, 1, 2}, 0, 0, 0, 3, 1, 0, 2, "3,4"},
    {"3+1+2, rank 1 (beyond the lanes)", 3, {3, 1, 2}, 1, 0, 1, 3, 1, -1, 0, ""},
    {"3+1+2, rank 5", 3, {3, 1, 2}, 5, 2, 1, 2, 1, -1, 0, ""},
    {"3+2+2, rank 4 (lane 1)", 3, {3, 2, 2}, 4, 1, 1, 2, 2, 1, 2, "1,6"},
};

static void make_topology(struct topology *t, int nhosts, const int *counts)
{
    int size = 0, ranks[64];
    for (int h = 0; h < nhosts; h++)
        size += counts[h];
    for (int r = 0; r < size; r++)
        ranks[r] = r;
    char why[128];
    REQUIRE(topology_set(t, size, nhosts, counts, ranks, why, sizeof why) == 0);
}

static void test_shapes(void)
{
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const struct shape_case *c = &shapes[k];
        struct topology t;
        make_topology(&t, c->nhosts, c->counts);
        struct hier_plan p;
        REQUIRE(hier_plan_make(&p, &t, c->rank) == 0);
        char got[256] = "";
        size_t used = 0;
        for (int i = 0; i < p.nlinks; i++)
            used += (size_t)snprintf(got + used, sizeof got - used, "%s%d", i ? "," : "",
                                     p.links[i]);
        fprintf(stderr, "%s: host %d local %d/%d lanes %d lane %d links %s\n", c->what, p.host,
                p.local, p.nlocal, p.lanes, p.lane, got);
        CHECK_EQ_INT(p.host, c->host);
        CHECK_EQ_INT(p.local, c->local);
        CHECK_EQ_INT(p.nlocal, c->nlocal);
        CHECK_EQ_INT(p.lanes, c->lanes);
        CHECK_EQ_INT(p.lane, c->lane);
        CHECK_EQ_INT(p.nlinks, c->nlinks);
        CHECK_EQ_STR(got, c->links);
        CHECK(p.contiguous);
        hier_plan_free(&p);
        topology_free(&t);
    }
}

/* 128 hosts x 8: every rank is in lane local, links within its lane only,
 * at most 2 ceil(log2 128) = 14 of them (the bound 2 ceil(log2 H) + 4),
 * and the links are symmetric across the whole job. */
static void test_128x8(void)
{
    int counts[128], ranks[1024];
    for (int h = 0; h < 128; h++)
        counts[h] = 8;
    for (int r = 0; r < 1024; r++) /* hosts in ring order, ranks dealt round-robin */
        ranks[(r % 128) * 8 + r / 128] = r;
    struct topology t;
    char why[128];
    REQUIRE(topology_set(&t, 1024, 128, counts, ranks, why, sizeof why) == 0);
    static struct hier_plan p[1024];
    int most = 0;
    for (int r = 0; r < 1024; r++) {
        REQUIRE(hier_plan_make(&p[r], &t, r) == 0);
        CHECK_EQ_INT(p[r].lane, r / 128);
        CHECK_EQ_INT(p[r].host, r % 128);
        CHECK(!p[r].contiguous);
        if (p[r].nlinks > most)
            most = p[r].nlinks;
    }
    CHECK(most <= 14);
    for (int r = 0; r < 1024; r++)
        for (int i = 0; i < p[r].nlinks; i++) {
            int j = p[r].links[i], back = 0;
            CHECK_EQ_INT(t.local[j], t.local[r]);
            for (int x = 0; x < p[j].nlinks; x++)
                back |= p[j].links[x] == r;
            CHECK(back);
        }
    for (int r = 0; r < 1024; r++)
        hier_plan_free(&p[r]);
    topology_free(&t);
}

static void test_algo(void)
{
    int c22[] = {2, 2}, c31[] = {3, 1}, c1[] = {1, 1};
    struct topology t;
    struct hier_plan p;
    make_topology(&t, 2, c22);
    REQUIRE(hier_plan_make(&p, &t, 0) == 0);
    CHECK_EQ_INT(hier_allreduce_algo(&p, 1, 4), HIER_LEADERS);
    CHECK_EQ_INT(hier_allreduce_algo(&p, HIER_LANES_MIN_BYTES / 4 - 1, 4), HIER_LEADERS);
    CHECK_EQ_INT(hier_allreduce_algo(&p, HIER_LANES_MIN_BYTES / 4, 4), HIER_LANES);
    CHECK_EQ_INT(hier_allreduce_algo(&p, (size_t)1 << 22, 4), HIER_LANES);
    hier_plan_free(&p);
    topology_free(&t);
    /* one lane (a host of one rank): always the leaders */
    make_topology(&t, 2, c31);
    REQUIRE(hier_plan_make(&p, &t, 0) == 0);
    CHECK_EQ_INT(hier_allreduce_algo(&p, (size_t)1 << 22, 4), HIER_LEADERS);
    hier_plan_free(&p);
    topology_free(&t);
    make_topology(&t, 2, c1);
    REQUIRE(hier_plan_make(&p, &t, 1) == 0);
    CHECK_EQ_INT(hier_allreduce_algo(&p, (size_t)1 << 22, 4), HIER_LEADERS);
    CHECK_EQ_INT(p.nlinks, 1);
    hier_plan_free(&p);
    topology_free(&t);
}

int main(void)
{
    test_links();
    test_shapes();
    test_128x8();
    test_algo();
    TEST_DONE();
}
