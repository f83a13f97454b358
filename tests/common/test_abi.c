/*
 * test_abi.c - the shared vocabulary (include/kolo/abi.h, common/abi.c):
 * names, texts and sizes; values that travel on the wire stay put; every
 * table runs from 0 without gaps; unknown values give the fallbacks.
 */
#include <string.h>

#include "abi.h"
#include "errors.h"
#include "test.h"

static void test_errors(void)
{
    CHECK_EQ_STR(abi_errname(KOLO_OK), "KOLO_OK");
    CHECK_EQ_STR(abi_errname(KOLO_ETIMEDOUT), "KOLO_ETIMEDOUT");
    CHECK_EQ_STR(abi_errname(KOLO_ESTATE), "KOLO_ESTATE");
    CHECK_EQ_STR(abi_strerror(KOLO_OK), "success");
    CHECK_EQ_STR(abi_strerror(KOLO_EAUTH), "authentication failed");

    /* Codes are wire protocol: a renumbering must fail this test. */
    CHECK_EQ_INT(KOLO_EINVAL, 1);
    CHECK_EQ_INT(KOLO_EAUTH, 7);
    CHECK_EQ_INT(KOLO_ESTALE, 12);
    CHECK_EQ_INT(KOLO_ESYS, 23);
    CHECK_EQ_INT(KOLO_ESTATE, 25);

    /* Unknown codes still give a usable string, never NULL. */
    CHECK_EQ_STR(abi_errname(-1), "KOLO_E?");
    CHECK_EQ_STR(abi_errname(9999), "KOLO_E?");
    CHECK_EQ_STR(abi_strerror(-1), "unknown error");
    CHECK_EQ_STR(abi_strerror(9999), "unknown error");

    /* Every code in the table has a distinct name starting KOLO_ and a
     * non-empty description. */
    static const int codes[] = {
#define CODE(name, num, text) num,
        KOLO_ERRORS(CODE)
#undef CODE
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        CHECK(strncmp(abi_errname(codes[i]), "KOLO_", 5) == 0);
        CHECK(strcmp(abi_errname(codes[i]), "KOLO_E?") != 0);
        CHECK(abi_strerror(codes[i])[0] != '\0');
        for (size_t j = i + 1; j < n; j++)
            CHECK(strcmp(abi_errname(codes[i]), abi_errname(codes[j])) != 0);
    }
}

static void test_dtypes(void)
{
    /* wire values and sizes */
    CHECK_EQ_INT(KOLO_UINT8, 0);
    CHECK_EQ_INT(KOLO_FLOAT16, 5);
    CHECK_EQ_INT(KOLO_BFLOAT16, 6);
    CHECK_EQ_INT(KOLO_FLOAT32, 7);
    CHECK_EQ_INT(KOLO_FLOAT64, 8);
    CHECK_EQ_INT(KOLO_DTYPE_COUNT, 9);
    static const size_t sizes[] = {1, 1, 2, 4, 8, 2, 2, 4, 8};
    for (int d = 0; d < KOLO_DTYPE_COUNT; d++) {
        CHECK_EQ_INT(abi_dtype_size(d), sizes[d]);
        CHECK(abi_dtype_name(d) != NULL && abi_dtype_symbol(d) != NULL);
        /* the name is the symbol in lower case */
        const char *a = abi_dtype_name(d), *b = abi_dtype_symbol(d);
        CHECK_EQ_INT(strlen(a), strlen(b));
        for (size_t i = 0; a[i] && b[i]; i++)
            CHECK(a[i] == (b[i] >= 'A' && b[i] <= 'Z' ? b[i] - 'A' + 'a' : b[i]));
    }
    CHECK_EQ_STR(abi_dtype_name(KOLO_BFLOAT16), "bfloat16");
    CHECK_EQ_STR(abi_dtype_symbol(KOLO_INT64), "INT64");
    CHECK_EQ_INT(abi_dtype_size(KOLO_DTYPE_COUNT), 0);
    CHECK_EQ_INT(abi_dtype_size(-1), 0);
    CHECK(abi_dtype_name(KOLO_DTYPE_COUNT) == NULL);
    CHECK(abi_dtype_symbol(-1) == NULL);
}

static void test_ops_and_colls(void)
{
    CHECK_EQ_INT(KOLO_SUM, 0);
    CHECK_EQ_INT(KOLO_PRODUCT, 4);
    CHECK_EQ_INT(KOLO_OP_COUNT, 5);
    CHECK_EQ_INT(KOLO_COLL_ALLREDUCE, 0);
    CHECK_EQ_INT(KOLO_COLL_REDUCESCATTER, 4);
    CHECK_EQ_INT(KOLO_COLL_JOIN, 6);
    CHECK_EQ_INT(KOLO_COLL_COUNT, 7);
    for (int o = 0; o < KOLO_OP_COUNT; o++)
        CHECK(abi_op_name(o) != NULL && abi_op_symbol(o) != NULL);
    for (int k = 0; k < KOLO_COLL_COUNT; k++)
        CHECK(abi_coll_name(k) != NULL && abi_coll_symbol(k) != NULL);
    CHECK_EQ_STR(abi_op_name(KOLO_AVERAGE), "average");
    CHECK_EQ_STR(abi_op_symbol(KOLO_MAX), "MAX");
    CHECK_EQ_STR(abi_coll_name(KOLO_COLL_ALLTOALL), "alltoall");
    CHECK_EQ_STR(abi_coll_symbol(KOLO_COLL_BARRIER), "BARRIER");
    CHECK(abi_op_name(KOLO_OP_COUNT) == NULL && abi_op_symbol(-1) == NULL);
    CHECK(abi_coll_name(KOLO_COLL_COUNT) == NULL && abi_coll_symbol(99) == NULL);
}

int main(void)
{
    test_errors();
    test_dtypes();
    test_ops_and_colls();
    TEST_DONE();
}
