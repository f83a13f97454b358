/*
 * test_buf.c - growth, formatting, termination, steal and reset.
 */
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "test.h"

int main(void)
{
    struct buf b;
    buf_init(&b);
    CHECK_EQ_STR(buf_cstr(&b), "");
    CHECK_EQ_INT(b.len, 0);

    buf_puts(&b, "hello");
    buf_putc(&b, ' ');
    buf_printf(&b, "%s %d", "world", 42);
    CHECK_EQ_STR(buf_cstr(&b), "hello world 42");
    CHECK_EQ_INT(b.len, 14);
    CHECK(b.data[b.len] == '\0');

    /* Growth across many reallocations keeps every byte. */
    buf_reset(&b);
    CHECK_EQ_INT(b.len, 0);
    CHECK_EQ_STR(buf_cstr(&b), "");
    for (int i = 0; i < 10000; i++)
        buf_printf(&b, "%04d,", i % 10000);
    CHECK_EQ_INT(b.len, 50000);
    CHECK(memcmp(b.data, "0000,0001,", 10) == 0);
    CHECK(memcmp(b.data + 49995, "9999,", 5) == 0);
    CHECK(!b.oom);

    /* A single formatted piece larger than the spare room. */
    buf_reset(&b);
    char big[5000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    buf_puts(&b, "<");
    buf_printf(&b, "%s>", big);
    CHECK_EQ_INT(b.len, 5001);
    CHECK(b.data[0] == '<' && b.data[4999] == 'z' && b.data[5000] == '>');

    /* Binary data with NULs; appending nothing is a no-op. */
    buf_reset(&b);
    buf_append(&b, "a\0b", 3);
    buf_append(&b, NULL, 0);
    buf_puts(&b, NULL);
    CHECK_EQ_INT(b.len, 3);
    CHECK(memcmp(b.data, "a\0b", 4) == 0);

    /* Steal hands over the storage and leaves an empty buffer. */
    size_t len = 0;
    char *s = buf_steal(&b, &len);
    REQUIRE(s);
    CHECK_EQ_INT(len, 3);
    CHECK(memcmp(s, "a\0b", 4) == 0);
    free(s);
    CHECK(b.data == NULL);
    CHECK_EQ_INT(b.len, 0);

    /* Stealing an empty buffer still gives a freeable "". */
    s = buf_steal(&b, &len);
    REQUIRE(s);
    CHECK_EQ_STR(s, "");
    CHECK_EQ_INT(len, 0);
    free(s);

    /* A failed buffer ignores appends and steals as NULL. */
    buf_puts(&b, "x");
    b.oom = true;
    buf_puts(&b, "ignored");
    buf_printf(&b, "%d", 7);
    CHECK_EQ_INT(b.len, 1);
    s = buf_steal(&b, &len);
    CHECK(s == NULL);
    CHECK_EQ_INT(len, 0);
    CHECK(!b.oom); /* steal leaves a fresh buffer */

    /* An empty printf keeps the buffer terminated. */
    buf_printf(&b, "%s", "");
    CHECK_EQ_STR(buf_cstr(&b), "");
    buf_free(&b);
    buf_free(&b); /* freeing twice is harmless */
    TEST_DONE();
}
