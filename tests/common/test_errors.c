/*
 * test_errors.c - the error table: names, texts, and that codes stay put.
 */
#include <string.h>

#include "errors.h"
#include "test.h"

int main(void)
{
    CHECK_EQ_STR(kolo_errname(KOLO_OK), "KOLO_OK");
    CHECK_EQ_STR(kolo_errname(KOLO_ETIMEDOUT), "KOLO_ETIMEDOUT");
    CHECK_EQ_STR(kolo_errname(KOLO_ESTATE), "KOLO_ESTATE");
    CHECK_EQ_STR(kolo_strerror(KOLO_OK), "success");
    CHECK_EQ_STR(kolo_strerror(KOLO_EAUTH), "authentication failed");

    /* Codes are wire protocol: a renumbering must fail this test. */
    CHECK_EQ_INT(KOLO_EINVAL, 1);
    CHECK_EQ_INT(KOLO_EAUTH, 7);
    CHECK_EQ_INT(KOLO_ESTALE, 12);
    CHECK_EQ_INT(KOLO_ESYS, 23);
    CHECK_EQ_INT(KOLO_ESTATE, 25);

    /* Unknown codes still give a usable string, never NULL. */
    CHECK_EQ_STR(kolo_errname(-1), "KOLO_E?");
    CHECK_EQ_STR(kolo_errname(9999), "KOLO_E?");
    CHECK(kolo_strerror(-1) != NULL && kolo_strerror(-1)[0] != '\0');
    CHECK(kolo_strerror(9999) != NULL);

    /* Every code in the table has a distinct name starting KOLO_ and a
     * non-empty description. */
    static const int codes[] = {
#define CODE(name, num, text) num,
        KOLO_ERRORS(CODE)
#undef CODE
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        CHECK(strncmp(kolo_errname(codes[i]), "KOLO_", 5) == 0);
        CHECK(strcmp(kolo_errname(codes[i]), "KOLO_E?") != 0);
        CHECK(kolo_strerror(codes[i])[0] != '\0');
        for (size_t j = i + 1; j < n; j++)
            CHECK(strcmp(kolo_errname(codes[i]), kolo_errname(codes[j])) != 0);
    }
    TEST_DONE();
}
