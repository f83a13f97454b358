/*
 * test_plan.c - worker/runtime/plan.h as a table: fusion layout, the scales of a
 * reduction (AVERAGE folded in for floats, a division for integers),
 * Horovod's reducescatter split, allgather and alltoall byte counts, and
 * the malformed responses it refuses.
 */
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "plan.h"
#include "test.h"

static Kolo__Response response(kolo_coll coll, kolo_dtype dt, kolo_op op, int64_t *sizes,
                               size_t nsizes, size_t nnames)
{
    Kolo__Response r = KOLO__RESPONSE__INIT;
    static char *names[16] = {"a", "b", "c", "d", "e", "f", "g", "h",
                              "i", "j", "k", "l", "m", "n", "o", "p"};
    r.coll = coll;
    r.dtype = dt;
    r.op = op;
    r.sizes = sizes;
    r.n_sizes = nsizes;
    r.names = names;
    r.n_names = nnames;
    return r;
}

static void test_allreduce_layout(void)
{
    int64_t sizes[] = {3, 0, 5};
    Kolo__Response r = response(KOLO_COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_SUM, sizes, 3, 3);
    struct plan p;
    char why[128];
    CHECK_EQ_INT(plan_make(&p, &r, 1, 4, true, why, sizeof why), 0);
    CHECK(p.fused && p.k == 3 && p.total == 8 && p.es == 4);
    CHECK(p.offset[0] == 0 && p.offset[1] == 3 && p.offset[2] == 3);
    CHECK(p.count[0] == 3 && p.count[1] == 0 && p.count[2] == 5);
    CHECK(p.post_divisor == 1 && p.post_factor == 1.0 && p.pre == 1.0);
    plan_free(&p);
    /* one tensor: in place, unless this rank joined (zeros, fused) */
    r = response(KOLO_COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_SUM, sizes, 1, 1);
    CHECK_EQ_INT(plan_make(&p, &r, 0, 2, true, why, sizeof why), 0);
    CHECK(!p.fused && p.total == 3);
    plan_free(&p);
    CHECK_EQ_INT(plan_make(&p, &r, 0, 2, false, why, sizeof why), 0);
    CHECK(p.fused);
    plan_free(&p);
    /* more tensors than the plan keeps inline */
    int64_t many[12];
    for (int i = 0; i < 12; i++)
        many[i] = i + 1;
    r = response(KOLO_COLL_ALLREDUCE, KOLO_FLOAT64, KOLO_SUM, many, 12, 12);
    CHECK_EQ_INT(plan_make(&p, &r, 0, 2, true, why, sizeof why), 0);
    CHECK(p.k == 12 && p.total == 78 && p.offset[11] == 66 && p.count[11] == 12);
    plan_free(&p);
    /* 0 elements */
    int64_t zero[] = {0};
    r = response(KOLO_COLL_ALLREDUCE, KOLO_INT8, KOLO_MAX, zero, 1, 1);
    CHECK_EQ_INT(plan_make(&p, &r, 0, 1, true, why, sizeof why), 0);
    CHECK(p.total == 0 && !p.fused);
    plan_free(&p);
}

static void test_scales(void)
{
    static const struct {
        kolo_dtype dt;
        kolo_op op;
        double pre, post; /* as sent: 0 means 1 */
        int size;
        double want_pre, want_factor;
        int want_divisor;
    } cases[] = {
        {KOLO_FLOAT32, KOLO_SUM, 0, 0, 4, 1.0, 1.0, 1},
        {KOLO_FLOAT32, KOLO_AVERAGE, 0, 0, 4, 1.0, 0.25, 1},
        {KOLO_FLOAT16, KOLO_AVERAGE, 0.5, 2, 4, 0.5, 0.5, 1},
        {KOLO_BFLOAT16, KOLO_AVERAGE, 0, 0, 8, 1.0, 0.125, 1},
        {KOLO_FLOAT64, KOLO_SUM, 3, 0.5, 2, 3.0, 0.5, 1},
        {KOLO_INT32, KOLO_AVERAGE, 0, 0, 3, 1.0, 1.0, 3},
        {KOLO_INT64, KOLO_AVERAGE, 0, 2, 3, 1.0, 2.0, 3},
        {KOLO_UINT8, KOLO_SUM, 0, 0, 5, 1.0, 1.0, 1},
        {KOLO_INT16, KOLO_MIN, 0, 0, 5, 1.0, 1.0, 1},
        {KOLO_FLOAT32, KOLO_AVERAGE, 0, 0, 1, 1.0, 1.0, 1}, /* one rank */
    };
    int64_t sizes[] = {7};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int coll = 0; coll < 2; coll++) {
            Kolo__Response r =
                response(coll ? KOLO_COLL_REDUCESCATTER : KOLO_COLL_ALLREDUCE, cases[i].dt,
                         cases[i].op, sizes, 1, 1);
            r.prescale = cases[i].pre;
            r.postscale = cases[i].post;
            struct plan p;
            char why[128];
            CHECK_EQ_INT(plan_make(&p, &r, 0, cases[i].size, true, why, sizeof why), 0);
            if (p.pre != cases[i].want_pre || p.post_factor != cases[i].want_factor ||
                p.post_divisor != cases[i].want_divisor) {
                fprintf(stderr, "scales case %zu (%s): pre %g factor %g divisor %d\n", i,
                        coll ? "reducescatter" : "allreduce", p.pre, p.post_factor,
                        p.post_divisor);
                CHECK(0);
            }
            CHECK(p.post == (cases[i].post == 0 ? 1.0 : cases[i].post));
            plan_free(&p);
        }
    }
}

static void test_reducescatter_split(void)
{
    static const struct {
        int64_t total, row;
        int size;
        size_t want[4];
    } cases[] = {
        {10, 2, 3, {4, 4, 2}},   /* 5 rows over 3: 2, 2, 1 */
        {12, 1, 4, {3, 3, 3, 3}},
        {3, 1, 4, {1, 1, 1, 0}}, /* fewer rows than ranks */
        {0, 1, 2, {0, 0}},
        {7, 7, 1, {7}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t sizes[] = {cases[i].total};
        int64_t row[] = {cases[i].row};
        Kolo__Response r = response(KOLO_COLL_REDUCESCATTER, KOLO_FLOAT32, KOLO_SUM, sizes, 1, 1);
        r.row_elems = row;
        r.n_row_elems = 1;
        struct plan p;
        char why[128];
        CHECK_EQ_INT(plan_make(&p, &r, 0, cases[i].size, true, why, sizeof why), 0);
        for (int k = 0; k < cases[i].size; k++)
            if (p.rank_count[k] != cases[i].want[k]) {
                fprintf(stderr, "split case %zu: rank %d gets %zu, want %zu\n", i, k,
                        p.rank_count[k], cases[i].want[k]);
                CHECK(0);
            }
        plan_free(&p);
    }
}

static void test_gather_counts(void)
{
    int64_t rows[] = {2, 0, 3};
    int64_t row[] = {4};
    Kolo__Response r = response(KOLO_COLL_ALLGATHER, KOLO_FLOAT32, KOLO_SUM, rows, 3, 1);
    r.row_elems = row;
    r.n_row_elems = 1;
    struct plan p;
    char why[128];
    CHECK_EQ_INT(plan_make(&p, &r, 2, 3, true, why, sizeof why), 0);
    CHECK(p.recv_bytes[0] == 32 && p.recv_bytes[1] == 0 && p.recv_bytes[2] == 48);
    CHECK(p.rows == 5 && p.result_bytes == 80);
    plan_free(&p);

    /* alltoall: sizes[s * n + d] rows from s to d */
    int64_t m[] = {1, 2, 3, 4};
    r = response(KOLO_COLL_ALLTOALL, KOLO_INT64, KOLO_SUM, m, 4, 1);
    CHECK_EQ_INT(plan_make(&p, &r, 1, 2, true, why, sizeof why), 0);
    CHECK(p.send_bytes[0] == 24 && p.send_bytes[1] == 32);
    CHECK(p.recv_bytes[0] == 16 && p.recv_bytes[1] == 32);
    CHECK(p.recv_rows[0] == 2 && p.recv_rows[1] == 4);
    CHECK(p.rows == 6 && p.result_bytes == 48);
    plan_free(&p);
}

static void test_malformed(void)
{
    static int64_t two[] = {1, 2}, neg[] = {3, -1}, four[] = {1, 1, 1};
    const struct {
        kolo_coll coll;
        int dtype;
        int64_t *sizes;
        size_t nsizes, nnames;
        int rank, size;
        const char *text;
    } cases[] = {
        {KOLO_COLL_ALLREDUCE, KOLO_FLOAT32, two, 1, 2, 0, 2, "malformed allreduce response"},
        {KOLO_COLL_ALLREDUCE, KOLO_FLOAT32, neg, 2, 2, 0, 2, "malformed allreduce response"},
        {KOLO_COLL_ALLGATHER, KOLO_FLOAT32, two, 2, 1, 0, 3, "malformed allgather response"},
        {KOLO_COLL_ALLGATHER, KOLO_FLOAT32, neg, 2, 1, 0, 2, "malformed allgather response"},
        {KOLO_COLL_ALLTOALL, KOLO_FLOAT32, four, 3, 1, 0, 2, "malformed alltoall response"},
        {KOLO_COLL_REDUCESCATTER, KOLO_FLOAT32, neg + 1, 1, 1, 0, 2,
         "malformed reducescatter response"},
        {KOLO_COLL_ALLREDUCE, 99, two, 2, 2, 0, 2, "malformed allreduce response"},
        {KOLO_COLL_ALLREDUCE, KOLO_FLOAT32, two, 2, 2, 2, 2, "malformed allreduce response"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Kolo__Response r = response(cases[i].coll, (kolo_dtype)cases[i].dtype, KOLO_SUM,
                                    cases[i].sizes, cases[i].nsizes, cases[i].nnames);
        struct plan p;
        char why[128] = "";
        int rc = plan_make(&p, &r, cases[i].rank, cases[i].size, true, why, sizeof why);
        if (rc != KOLO_EPROTO || strcmp(why, cases[i].text) != 0) {
            fprintf(stderr, "malformed case %zu: rc %d, why '%s'\n", i, rc, why);
            CHECK(0);
        }
        plan_free(&p);
    }
}

int main(void)
{
    test_allreduce_layout();
    test_scales();
    test_reducescatter_split();
    test_gather_counts();
    test_malformed();
    TEST_DONE();
}
