/*
 * test_placement.c - rank assignment and -H parsing.
 */
#include <string.h>

#include "placement.h"
#include "test.h"

static void test_parse(void)
{
    struct place_spec_entry e[8];
    char err[256];
    CHECK_EQ_INT(place_parse_hosts("a:2,b.example.com:3,c", e, 8, err, sizeof(err)), 3);
    CHECK_EQ_STR(e[0].name, "a");
    CHECK_EQ_INT(e[0].slots, 2);
    CHECK_EQ_STR(e[1].name, "b.example.com");
    CHECK_EQ_INT(e[1].slots, 3);
    CHECK_EQ_INT(e[2].slots, 1);
    CHECK_EQ_INT(place_parse_hosts("", e, 8, err, sizeof(err)), 0);
    const char *bad[] = {"a:", "a:0", "a:-1", ":2", "a:2,,b:1", "a b:1", "a:2,a:1", "a:1x", ","};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        CHECK_EQ_INT(place_parse_hosts(bad[i], e, 8, err, sizeof(err)), -1);
        CHECK(err[0] != '\0');
    }
    CHECK_EQ_INT(place_parse_hosts("a,b,c", e, 2, err, sizeof(err)), -1);
}

static void test_fill_host_by_host(void)
{
    struct place_host h[3] = {
        {"h0", "h0", "id0", 2, 1}, {"h1", "h1", "id1", 2, 1}, {"h2", "h2", "id2", 4, 1}};
    struct place_rank r[8];
    char err[256];
    CHECK_EQ_INT(place_ranks(h, 3, NULL, 0, 4, r, err, sizeof(err)), PLACE_OK);
    int want_host[] = {0, 0, 1, 1};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(r[i].rank, i);
        CHECK_EQ_INT(r[i].host, want_host[i]);
        CHECK_EQ_INT(r[i].local_rank, i % 2);
        CHECK_EQ_INT(r[i].local_size, 2);
        CHECK_EQ_INT(r[i].cross_rank, i / 2);
        CHECK_EQ_INT(r[i].cross_size, 2);
    }
    /* uneven: 2 + 2 + 3 -> local_rank 2 exists only on h2 */
    CHECK_EQ_INT(place_ranks(h, 3, NULL, 0, 7, r, err, sizeof(err)), PLACE_OK);
    CHECK_EQ_INT(r[6].host, 2);
    CHECK_EQ_INT(r[6].local_rank, 2);
    CHECK_EQ_INT(r[6].local_size, 3);
    CHECK_EQ_INT(r[6].cross_rank, 0);
    CHECK_EQ_INT(r[6].cross_size, 1);
    CHECK_EQ_INT(r[4].cross_rank, 2); /* local_rank 0 on the third host */
    CHECK_EQ_INT(r[4].cross_size, 3);
    /* one rank */
    CHECK_EQ_INT(place_ranks(h, 3, NULL, 0, 1, r, err, sizeof(err)), PLACE_OK);
    CHECK_EQ_INT(r[0].local_size, 1);
    CHECK_EQ_INT(r[0].cross_size, 1);
}

static void test_wait_and_impossible(void)
{
    struct place_host h[2] = {{"h0", "x", "id0", 2, 1}, {"h1", "y", "id1", 2, 0}};
    struct place_rank r[8];
    char err[256];
    CHECK_EQ_INT(place_ranks(h, 2, NULL, 0, 3, r, err, sizeof(err)), PLACE_WAIT);
    CHECK(strstr(err, "needs 3, 2 free on 1 live host") != NULL);
    CHECK_EQ_INT(place_ranks(h, 2, NULL, 0, 0, r, err, sizeof(err)), PLACE_IMPOSSIBLE);
    struct place_spec_entry s[2] = {{"h0", 2}, {"h1", 2}};
    CHECK_EQ_INT(place_ranks(h, 2, s, 2, 5, r, err, sizeof(err)), PLACE_IMPOSSIBLE);
    CHECK(strstr(err, "4 slot(s) but np is 5") != NULL);
    /* h1 is not alive: wait for it by name */
    CHECK_EQ_INT(place_ranks(h, 2, s, 2, 4, r, err, sizeof(err)), PLACE_WAIT);
    CHECK(strstr(err, "'h1'") != NULL);
    /* enough on the first entry: the dead host is not needed */
    CHECK_EQ_INT(place_ranks(h, 2, s, 2, 2, r, err, sizeof(err)), PLACE_OK);
    /* host list entries match hostname and id too, in the list's order */
    h[1].alive = 1;
    struct place_spec_entry s2[2] = {{"y", 1}, {"id0", 2}};
    CHECK_EQ_INT(place_ranks(h, 2, s2, 2, 3, r, err, sizeof(err)), PLACE_OK);
    CHECK_EQ_INT(r[0].host, 1);
    CHECK_EQ_INT(r[1].host, 0);
    CHECK_EQ_INT(r[2].host, 0);
    CHECK_EQ_INT(r[1].local_rank, 0);
    CHECK_EQ_INT(r[2].local_rank, 1);
    /* a listed host with too few free slots waits */
    h[0].free_slots = 1;
    CHECK_EQ_INT(place_ranks(h, 2, s2, 2, 3, r, err, sizeof(err)), PLACE_WAIT);
    CHECK(strstr(err, "2 needed, 1 free") != NULL);
}

int main(void)
{
    test_parse();
    test_fill_host_by_host();
    test_wait_and_impossible();
    TEST_DONE();
}
