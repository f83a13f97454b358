/*
 * test_resume.c - a restarted coordinator taking the negotiation back from
 * the ranks (negotiation/resume.h): the log rebuilt from the entries they
 * hold, and the response cache's id map from their tables, as tables of
 * cases: which differences between the ranks' tables are a lag (fine) and
 * which mean every cache must be cleared.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "resume.h"
#include "test.h"

/* ---------------------------------------------------------------- builders */

#define MAXE 8

/* One rank's held entries: packed Responses, each naming one tensor and
 * giving it cache id `id` (0: none). */
struct held {
    ProtobufCBinaryData bin[MAXE];
    size_t n;
};

static void hold(struct held *h, uint64_t index, const char *name, uint32_t id)
{
    Kolo__Response r = KOLO__RESPONSE__INIT;
    char *names[1] = {(char *)name};
    uint32_t ids[1] = {id};
    r.index = index;
    r.names = names;
    r.n_names = 1;
    r.cache_ids = ids;
    r.n_cache_ids = 1;
    size_t len = kolo__response__get_packed_size(&r);
    h->bin[h->n].data = malloc(len + 1);
    h->bin[h->n].len = kolo__response__pack(&r, h->bin[h->n].data);
    h->n++;
}

static void held_free(struct held *h)
{
    for (size_t i = 0; i < h->n; i++)
        free(h->bin[i].data);
    h->n = 0;
}

/* One rank's cache table as the resume sends it. */
struct table {
    Kolo__CacheEntry ents[MAXE];
    Kolo__TensorRequest ts[MAXE];
    Kolo__CacheEntry *ptrs[MAXE];
    int64_t shape[MAXE][1];
    size_t n;
};

static void put(struct table *t, uint32_t id, const char *name, int64_t rows)
{
    size_t k = t->n++;
    kolo__cache_entry__init(&t->ents[k]);
    kolo__tensor_request__init(&t->ts[k]);
    t->shape[k][0] = rows;
    t->ts[k].name = (char *)name;
    t->ts[k].dtype = 7;
    t->ts[k].op = 1;
    t->ts[k].shape = t->shape[k];
    t->ts[k].n_shape = 1;
    t->ts[k].prescale = 1.0;
    t->ts[k].postscale = 1.0;
    t->ts[k].device = -1;
    t->ents[k].id = id;
    t->ents[k].tensor = &t->ts[k];
    t->ptrs[k] = &t->ents[k];
}

/* The hash the rank computes over the same table. */
static uint64_t hash_of(const struct table *t)
{
    struct tensor_cache *tc = tcache_new();
    for (size_t i = 0; i < t->n; i++) {
        struct tensor_req *q = tensor_req_from_msg(&t->ts[i]);
        CHECK_EQ_INT(tcache_bind(tc, t->ents[i].id, t->ts[i].name, q), 0);
        tensor_req_free(q);
    }
    uint64_t h = tcache_hash(tc);
    tcache_free(tc);
    return h;
}

static struct resume_rank rank_of(uint64_t cursor, uint64_t executed, const struct held *h,
                                  const struct table *t)
{
    struct resume_rank r = {.cursor = cursor, .executed = executed, .held = h->bin,
                            .nheld = h->n, .cache = t->ptrs, .ncache = t->n,
                            .cache_hash = hash_of(t), .rounds = true};
    return r;
}

/* ---------------------------------------------------------------- the log */

static void test_log_rebuild(void)
{
    struct held h0 = {0}, h1 = {0};
    struct table none = {0};
    hold(&h0, 3, "a", 1);
    hold(&h0, 4, "b", 2);
    hold(&h1, 3, "a", 1);
    hold(&h1, 4, "b", 2);
    hold(&h1, 5, "c", 0);
    /* rank 0 received up to 5, rank 1 up to 6: entry 5 comes from rank 1 */
    struct resume_rank rk[2] = {rank_of(5, 3, &h0, &none), rank_of(6, 5, &h1, &none)};
    struct resume_log l;
    char why[300];
    CHECK_EQ_INT(resume_log_rebuild(rk, 2, 100, true, &l, why, sizeof why), 0);
    CHECK_EQ_INT(l.base, 5);
    CHECK_EQ_INT(l.top, 6);
    CHECK_EQ_STR(l.ents[0]->names[0], "c");
    CHECK(resume_log_answers(&l, 5, "c"));
    CHECK(!resume_log_answers(&l, 6, "c"));
    CHECK(!resume_log_answers(&l, 0, "a")); /* below the rebuilt part */
    resume_log_free(&l);

    /* ids kept or zeroed */
    rk[0].cursor = 3;
    CHECK_EQ_INT(resume_log_rebuild(rk, 2, 100, true, &l, why, sizeof why), 0);
    CHECK_EQ_INT(l.top - l.base, 3);
    CHECK_EQ_INT(l.ents[1]->cache_ids[0], 2);
    resume_log_free(&l);
    CHECK_EQ_INT(resume_log_rebuild(rk, 2, 100, false, &l, why, sizeof why), 0);
    CHECK_EQ_INT(l.ents[1]->cache_ids[0], 0);
    resume_log_free(&l);

    /* too far apart, and an entry nobody holds */
    CHECK_EQ_INT(resume_log_rebuild(rk, 2, 2, true, &l, why, sizeof why), KOLO_EPEER);
    CHECK(strstr(why, "3 log entries apart") != NULL);
    rk[0].cursor = 2;
    CHECK_EQ_INT(resume_log_rebuild(rk, 2, 100, true, &l, why, sizeof why), KOLO_EPEER);
    CHECK(strstr(why, "log entry 2 was lost") != NULL);
    /* every rank at one cursor: nothing to rebuild */
    rk[0].cursor = rk[1].cursor = 6;
    CHECK_EQ_INT(resume_log_rebuild(rk, 2, 0, true, &l, why, sizeof why), 0);
    CHECK_EQ_INT(l.top, l.base);
    resume_log_free(&l);
    held_free(&h0);
    held_free(&h1);
}

/* ---------------------------------------------------------------- the cache */

struct cache_case {
    const char *what;
    struct {
        uint32_t id;
        const char *name;
        int64_t rows;
    } t[3][4];          /* per rank (3 ranks), up to 4 ids; id 0 ends */
    uint64_t executed[3];
    struct {
        uint64_t index;
        const char *name;
        uint32_t id;
    } held[2];          /* entries every rank holds; id 0 ends */
    bool bad_hash;      /* rank 2 reports a hash of something else */
    int want;           /* 0 restored, 1 reset */
    const char *why;    /* in the text when 1 */
    uint32_t want_id[4]; /* for names a, b, c, d: the restored id (0: left out) */
    uint32_t next_id;
};

static void test_cache_cases(void)
{
    static const struct cache_case cases[] = {
        {"identical tables",
         {{{1, "a", 4}, {2, "b", 4}}, {{1, "a", 4}, {2, "b", 4}}, {{1, "a", 4}, {2, "b", 4}}},
         {9, 9, 9}, {{0}}, false, 0, NULL, {1, 2, 0, 0}, 3},
        {"a rank that has dropped an id (a round the others have not run)",
         {{{1, "a", 4}, {2, "b", 4}}, {{1, "a", 4}}, {{1, "a", 4}, {2, "b", 4}}},
         {9, 9, 9}, {{0}}, false, 0, NULL, {1, 2, 0, 0}, 3},
        {"an id given anew by an entry rank 0 has not run: left out",
         {{{1, "a", 4}, {2, "b", 4}}, {{1, "a", 4}, {2, "c", 4}}, {{1, "a", 4}, {2, "c", 4}}},
         {8, 9, 9}, {{8, "c", 2}}, false, 0, NULL, {1, 0, 0, 0}, 3},
        {"the same difference with that entry run by everyone: reset",
         {{{1, "a", 4}, {2, "b", 4}}, {{1, "a", 4}, {2, "c", 4}}, {{1, "a", 4}, {2, "c", 4}}},
         {9, 9, 9}, {{8, "c", 2}}, false, 1, "ranks 0 and 1 disagree on response cache id 2 (b against c)",
         {0, 0, 0, 0}, 3},
        {"a signature that differs: reset",
         {{{1, "a", 4}}, {{1, "a", 4}}, {{1, "a", 5}}},
         {9, 9, 9}, {{0}}, false, 1, "ranks 0 and 2 disagree on response cache id 1", {0, 0, 0, 0}, 2},
        {"a table that does not hash to its hash: reset",
         {{{1, "a", 4}}, {{1, "a", 4}}, {{1, "a", 4}}},
         {9, 9, 9}, {{0}}, true, 1, "rank 2's response cache (1 ids) does not match its hash",
         {0, 0, 0, 0}, 2},
        {"an id named twice in one table: reset",
         {{{1, "a", 4}}, {{1, "a", 4}, {1, "d", 4}}, {{1, "a", 4}}},
         {9, 9, 9}, {{0}}, false, 1, "rank 1's response cache is malformed", {0, 0, 0, 0}, 2},
        {"ids above every table: next id above the held entries' ids",
         {{{1, "a", 4}}, {{1, "a", 4}}, {{1, "a", 4}}},
         {9, 9, 9}, {{3, "d", 7}}, false, 0, NULL, {1, 0, 0, 0}, 8},
        {"one name under two ids, nothing to explain it: reset",
         {{{1, "a", 4}, {5, "b", 4}}, {{1, "a", 4}, {7, "b", 4}}, {{1, "a", 4}}},
         {9, 9, 9}, {{0}}, false, 1, "the ranks disagree on the response cache id of b (5 and 7)",
         {0, 0, 0, 0}, 8},
        {"one name under two ids, the new one given by an entry rank 0 has not run",
         {{{1, "a", 4}, {5, "b", 4}}, {{1, "a", 4}, {7, "b", 4}}, {{1, "a", 4}, {7, "b", 4}}},
         {8, 9, 9}, {{8, "b", 7}}, false, 0, NULL, {1, 5, 0, 0}, 8},
        {"empty tables", {{{0}}, {{0}}, {{0}}}, {1, 1, 1}, {{0}}, false, 0, NULL, {0, 0, 0, 0}, 1},
    };
    const char *names[4] = {"a", "b", "c", "d"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct cache_case *k = &cases[c];
        struct table t[3];
        memset(t, 0, sizeof t);
        struct held h = {0};
        for (int i = 0; i < 2 && k->held[i].id; i++)
            hold(&h, k->held[i].index, k->held[i].name, k->held[i].id);
        struct resume_rank rk[3];
        for (int r = 0; r < 3; r++) {
            for (int i = 0; i < 4 && k->t[r][i].id; i++)
                put(&t[r], k->t[r][i].id, k->t[r][i].name, k->t[r][i].rows);
            rk[r] = rank_of(10, k->executed[r], &h, &t[r]);
        }
        if (k->bad_hash)
            rk[2].cache_hash ^= 1;
        struct tensor_cache *into = tcache_new();
        uint32_t next = 0;
        char why[300] = "";
        int rc = resume_cache(into, rk, 3, &next, why, sizeof why);
        if (rc != k->want || (k->why && !strstr(why, k->why)) || next != k->next_id)
            fprintf(stderr, "cache case '%s': rc %d next %u why '%s'\n", k->what, rc, next, why);
        CHECK_EQ_INT(rc, k->want);
        CHECK_EQ_INT(next, k->next_id);
        if (k->why)
            CHECK(strstr(why, k->why) != NULL);
        for (int i = 0; i < 4; i++) {
            if (tcache_id(into, names[i]) != k->want_id[i])
                fprintf(stderr, "cache case '%s': %s has id %u, want %u\n", k->what, names[i],
                        tcache_id(into, names[i]), k->want_id[i]);
            CHECK_EQ_INT(tcache_id(into, names[i]), k->want_id[i]);
        }
        if (rc == 1)
            CHECK_EQ_INT(tcache_count(into), 0);
        tcache_free(into);
        held_free(&h);
    }
}

/* Ranks without readiness rounds send no table: nothing is restored and
 * nothing is reset. */
static void test_cache_without_rounds(void)
{
    struct held h = {0};
    struct table t = {0};
    put(&t, 1, "a", 4);
    struct resume_rank rk[2] = {rank_of(4, 4, &h, &t), rank_of(4, 4, &h, &t)};
    rk[0].rounds = rk[1].rounds = false;
    rk[1].cache_hash = 42;
    struct tensor_cache *into = tcache_new();
    uint32_t next = 0;
    char why[300];
    CHECK_EQ_INT(resume_cache(into, rk, 2, &next, why, sizeof why), 0);
    CHECK_EQ_INT(tcache_count(into), 0);
    CHECK_EQ_INT(next, 1);
    tcache_free(into);
}

/* A signature survives the trip through a message both ways. */
static void test_messages(void)
{
    int64_t shape[3] = {2, 3, 5};
    int32_t splits[2] = {1, 1};
    struct tensor_req t = {.coll = 1, .dtype = 9, .op = 3, .ndim = 3, .shape = shape,
                           .prescale = 0.5, .postscale = 2, .root = 1, .device = 0,
                           .splits = splits, .nsplits = 2};
    Kolo__TensorRequest m = KOLO__TENSOR_REQUEST__INIT;
    tensor_req_to_msg(&t, "w", &m);
    CHECK_EQ_STR(m.name, "w");
    struct tensor_req *back = tensor_req_from_msg(&m);
    CHECK(back && tensor_sig_equal(back, &t));
    CHECK_EQ_INT(back->root, 1);
    CHECK_EQ_INT(back->nsplits, 2);
    tensor_req_free(back);
    /* unset scale factors are 1 */
    Kolo__TensorRequest z = KOLO__TENSOR_REQUEST__INIT;
    back = tensor_req_from_msg(&z);
    CHECK(back && back->prescale == 1.0 && back->postscale == 1.0);
    tensor_req_free(back);
}

int main(void)
{
    test_log_rebuild();
    test_cache_cases();
    test_cache_without_rounds();
    test_messages();
    TEST_DONE();
}
