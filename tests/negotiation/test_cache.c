/*
 * test_cache.c - the response cache's table (negotiation/cache.h): one
 * name per id and one id per name, ages, retired signatures, the hash the
 * ranks and a restarted coordinator compare, and the signature rule.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "errors.h"
#include "round.h"
#include "test.h"
#include "util.h"

static int64_t shape_a[2] = {3, 4};
static int64_t shape_b[2] = {4, 3};

static struct tensor_req sig(uint32_t dtype, int64_t *shape)
{
    struct tensor_req t = {.coll = 0 /* allreduce */, .dtype = dtype, .op = 1, .ndim = 2,
                           .shape = shape, .prescale = 1.0, .postscale = 1.0, .device = -1};
    return t;
}

static void test_bind_and_lookup(void)
{
    struct tensor_cache *tc = tcache_new();
    struct tensor_req a = sig(7, shape_a);
    CHECK_EQ_INT(tcache_id(tc, "w"), 0);
    CHECK(tcache_name(tc, 1) == NULL);
    CHECK(tcache_sig(tc, 0) == NULL && tcache_sig(tc, ROUND_MAX_ID + 1) == NULL);
    CHECK_EQ_INT(tcache_top(tc), 0);
    /* out of range and empty names are refused */
    CHECK_EQ_INT(tcache_bind(tc, 0, "w", &a), KOLO_EINVAL);
    CHECK_EQ_INT(tcache_bind(tc, ROUND_MAX_ID + 1, "w", &a), KOLO_EINVAL);
    CHECK_EQ_INT(tcache_bind(tc, 1, "", &a), KOLO_EINVAL);
    CHECK_EQ_INT(tcache_count(tc), 0);

    CHECK_EQ_INT(tcache_bind(tc, 3, "w", &a), 0);
    CHECK_EQ_INT(tcache_id(tc, "w"), 3);
    /* the same lookup with the caller's hash of the name */
    CHECK_EQ_INT(tcache_id_hashed(tc, "w", str_hash("w")), 3);
    CHECK_EQ_INT(tcache_id_hashed(tc, "x", str_hash("x")), 0);
    CHECK_EQ_STR(tcache_name(tc, 3), "w");
    CHECK(tensor_sig_equal(tcache_sig(tc, 3), &a));
    CHECK(tcache_sig(tc, 3)->shape != a.shape); /* a copy */
    CHECK_EQ_INT(tcache_top(tc), 3);
    CHECK_EQ_INT(tcache_count(tc), 1);

    /* the name moves to another id: the old id is free */
    CHECK_EQ_INT(tcache_bind(tc, 5, "w", &a), 0);
    CHECK_EQ_INT(tcache_id(tc, "w"), 5);
    CHECK(tcache_name(tc, 3) == NULL);
    CHECK_EQ_INT(tcache_count(tc), 1);
    /* another name takes the id: the old name is gone */
    CHECK_EQ_INT(tcache_bind(tc, 5, "b", &a), 0);
    CHECK_EQ_INT(tcache_id(tc, "w"), 0);
    CHECK_EQ_INT(tcache_id(tc, "b"), 5);
    CHECK_EQ_INT(tcache_count(tc), 1);
    /* the top does not go down with a drop, and clear resets it */
    CHECK_EQ_INT(tcache_bind(tc, ROUND_MAX_ID, "last", &a), 0);
    tcache_drop(tc, ROUND_MAX_ID);
    tcache_drop(tc, ROUND_MAX_ID); /* twice: nothing */
    tcache_drop(tc, 0);
    CHECK_EQ_INT(tcache_top(tc), ROUND_MAX_ID);
    CHECK_EQ_INT(tcache_id(tc, "last"), 0);
    tcache_clear(tc);
    CHECK_EQ_INT(tcache_top(tc), 0);
    CHECK_EQ_INT(tcache_count(tc), 0);
    CHECK_EQ_INT(tcache_id(tc, "b"), 0);
    tcache_free(tc);
}

/* A replaced signature stays readable until the reap (the coordinator
 * lends it to pending entries); ASan sees a use after free otherwise. */
static void test_retired_until_reap(void)
{
    struct tensor_cache *tc = tcache_new();
    struct tensor_req a = sig(7, shape_a), b = sig(7, shape_b);
    CHECK_EQ_INT(tcache_bind(tc, 1, "w", &a), 0);
    const struct tensor_req *lent = tcache_sig(tc, 1);
    CHECK_EQ_INT(tcache_bind(tc, 1, "w", &b), 0); /* new signature, same name */
    CHECK(tensor_sig_equal(tcache_sig(tc, 1), &b));
    CHECK(tensor_sig_equal(lent, &a));
    CHECK_EQ_INT(tcache_bind(tc, 1, "other", &a), 0);
    tcache_drop(tc, 1);
    CHECK(tensor_sig_equal(lent, &a));
    tcache_reap(tc);
    tcache_reap(tc);
    tcache_free(tc);
}

struct busy_set {
    uint32_t ids[4];
    int n;
};

static bool is_busy(const void *arg, uint32_t id)
{
    const struct busy_set *b = arg;
    for (int i = 0; i < b->n; i++)
        if (b->ids[i] == id)
            return true;
    return false;
}

static void test_oldest(void)
{
    struct tensor_req a = sig(7, shape_a);
    static const struct {
        const char *what;
        uint32_t order[4]; /* ids bound, in this order (0: end) */
        uint32_t below;
        struct busy_set busy;
        uint32_t want;
    } cases[] = {
        {"empty table: the first id", {0}, 5, {{0}, 0}, 1},
        {"nothing below 1", {0}, 1, {{0}, 0}, 0},
        {"a free id before any bound one", {1, 3, 0}, 4, {{0}, 0}, 2},
        {"all bound: the first given", {2, 1, 3, 0}, 4, {{0}, 0}, 2},
        {"the first given is busy", {2, 1, 3, 0}, 4, {{2}, 1}, 1},
        {"all busy", {1, 2, 3, 0}, 4, {{1, 2, 3}, 3}, 0},
        {"a free id that is busy is skipped", {1, 3, 0}, 4, {{2}, 1}, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct tensor_cache *tc = tcache_new();
        char name[16];
        for (int i = 0; i < 4 && cases[c].order[i]; i++) {
            snprintf(name, sizeof name, "t%u", cases[c].order[i]);
            CHECK_EQ_INT(tcache_bind(tc, cases[c].order[i], name, &a), 0);
        }
        uint32_t got = tcache_oldest(tc, cases[c].below, is_busy, &cases[c].busy);
        if (got != cases[c].want)
            fprintf(stderr, "oldest case '%s': %u, want %u\n", cases[c].what, got,
                    cases[c].want);
        CHECK_EQ_INT(got, cases[c].want);
        tcache_free(tc);
    }
    /* a name rebinding its id keeps its age */
    struct tensor_cache *tc = tcache_new();
    struct tensor_req b = sig(7, shape_b);
    CHECK_EQ_INT(tcache_bind(tc, 1, "x", &a), 0);
    CHECK_EQ_INT(tcache_bind(tc, 2, "y", &a), 0);
    CHECK_EQ_INT(tcache_bind(tc, 1, "x", &b), 0);
    CHECK_EQ_INT(tcache_oldest(tc, 3, NULL, NULL), 1);
    tcache_free(tc);
}

/* Equal tables hash equal whatever order they were built in; any field a
 * rank could disagree on changes the hash. */
static void test_hash(void)
{
    struct tensor_req a = sig(7, shape_a);
    struct tensor_cache *x = tcache_new(), *y = tcache_new();
    uint64_t empty = tcache_hash(x);
    CHECK(empty == 0xcbf29ce484222325ull);
    CHECK_EQ_INT(tcache_bind(x, 1, "w1", &a), 0);
    CHECK_EQ_INT(tcache_bind(x, 2, "w2", &a), 0);
    CHECK_EQ_INT(tcache_bind(y, 2, "w2", &a), 0);
    CHECK(tcache_hash(x) != tcache_hash(y));
    CHECK_EQ_INT(tcache_bind(y, 1, "w1", &a), 0);
    CHECK(tcache_hash(x) == tcache_hash(y));
    uint64_t same = tcache_hash(x);

    struct tensor_req variants[6];
    for (int i = 0; i < 6; i++)
        variants[i] = a;
    variants[0].dtype = 8;
    variants[1].shape = shape_b;
    variants[2].op = 2;
    variants[3].prescale = 0.5;
    variants[4].postscale = 2.0;
    variants[5].device = 0;
    for (int i = 0; i < 6; i++) {
        CHECK(!tensor_sig_equal(&variants[i], &a));
        CHECK_EQ_INT(tcache_bind(y, 2, "w2", &variants[i]), 0);
        CHECK(tcache_hash(y) != same);
        CHECK_EQ_INT(tcache_bind(y, 2, "w2", &a), 0);
        CHECK(tcache_hash(y) == same);
    }
    /* another name, or the same names under swapped ids */
    CHECK_EQ_INT(tcache_bind(y, 2, "w3", &a), 0);
    CHECK(tcache_hash(y) != same);
    CHECK_EQ_INT(tcache_bind(y, 1, "w2", &a), 0);
    CHECK_EQ_INT(tcache_bind(y, 2, "w1", &a), 0);
    CHECK(tcache_hash(y) != same);
    /* roots and splits are no part of an allreduce's signature; a
     * broadcast's root is part of its own (and of the cache's hash) */
    struct tensor_req r = a;
    r.root = 3;
    CHECK(tensor_sig_equal(&r, &a));
    struct tensor_req b0 = a, b3 = a;
    b0.coll = b3.coll = KOLO_COLL_BROADCAST;
    b3.root = 3;
    CHECK(!tensor_sig_equal(&b0, &b3));
    CHECK_EQ_INT(tcache_bind(y, 2, "w2", &b0), 0);
    uint64_t with_root0 = tcache_hash(y);
    CHECK_EQ_INT(tcache_bind(y, 2, "w2", &b3), 0);
    CHECK(tcache_hash(y) != with_root0);
    tcache_clear(y);
    CHECK(tcache_hash(y) == empty);
    tcache_free(x);
    tcache_free(y);
}

static void test_copy(void)
{
    int32_t splits[3] = {1, 2, 3};
    struct tensor_req a = sig(7, shape_a);
    a.splits = splits;
    a.nsplits = 3;
    struct tensor_req *c = tensor_req_copy(&a);
    CHECK(c && c->shape != a.shape && c->splits != a.splits);
    CHECK(tensor_sig_equal(c, &a));
    CHECK_EQ_INT(c->splits[2], 3);
    tensor_req_free(c);
    struct tensor_req scalar = {.ndim = 0, .prescale = 1, .postscale = 1, .device = -1};
    c = tensor_req_copy(&scalar);
    CHECK(c && tensor_sig_equal(c, &scalar));
    tensor_req_free(c);
    tensor_req_free(NULL);
}

int main(void)
{
    test_bind_and_lookup();
    test_retired_until_reap();
    test_oldest();
    test_hash();
    test_copy();
    TEST_DONE();
}
