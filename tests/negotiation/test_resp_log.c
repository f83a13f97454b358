/*
 * test_resp_log.c - the response log (negotiation/resp_log.h): numbering,
 * trimming, restarting at a base, and the hand-packed reply, read back
 * with protobuf-c as a rank reads it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resp_log.h"
#include "test.h"

static void append_named(struct resp_log *l, const char *name)
{
    Kolo__Response r = KOLO__RESPONSE__INIT;
    char *names[1] = {(char *)name};
    r.names = names;
    r.n_names = 1;
    r.coll = 0;
    CHECK_EQ_INT(rlog_append(l, &r), 0);
}

/* What a rank at cursor would read: the entries' names and next_cursor. */
static Kolo__NegotiateReply *reply(const struct resp_log *l, uint64_t cursor, size_t max)
{
    size_t len = 0;
    uint8_t *b = rlog_reply(l, cursor, max, 26, &len);
    CHECK(b != NULL);
    /* the caller's own fields go after ours: field 6 (timeline) */
    b[len++] = (6 << 3) | 0;
    b[len++] = 1;
    Kolo__NegotiateReply *m = kolo__negotiate_reply__unpack(NULL, len, b);
    free(b);
    CHECK(m != NULL);
    CHECK(m->timeline);
    return m;
}

static void test_append_read_trim(void)
{
    struct resp_log l = {0};
    CHECK_EQ_INT(rlog_end(&l), 0);
    Kolo__NegotiateReply *m = reply(&l, 0, 1 << 20);
    CHECK_EQ_INT(m->n_responses, 0);
    CHECK_EQ_INT(m->next_cursor, 0);
    kolo__negotiate_reply__free_unpacked(m, NULL);

    char name[32];
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "grad.%d", i);
        append_named(&l, name);
    }
    CHECK_EQ_INT(rlog_end(&l), 10);
    m = reply(&l, 3, 1 << 20);
    CHECK_EQ_INT(m->n_responses, 7);
    CHECK_EQ_INT(m->responses[0]->index, 3);
    CHECK_EQ_STR(m->responses[0]->names[0], "grad.3");
    CHECK_EQ_INT(m->responses[6]->index, 9);
    CHECK_EQ_INT(m->next_cursor, 10);
    kolo__negotiate_reply__free_unpacked(m, NULL);

    /* a cursor at or past the end: nothing, and the end */
    m = reply(&l, 10, 1 << 20);
    CHECK_EQ_INT(m->n_responses, 0);
    CHECK_EQ_INT(m->next_cursor, 10);
    kolo__negotiate_reply__free_unpacked(m, NULL);
    m = reply(&l, 99, 1 << 20);
    CHECK_EQ_INT(m->n_responses, 0);
    CHECK_EQ_INT(m->next_cursor, 10);
    kolo__negotiate_reply__free_unpacked(m, NULL);

    /* trimmed: a cursor behind the trim reads from the first kept */
    rlog_trim(&l, 4);
    CHECK_EQ_INT(l.base, 4);
    CHECK_EQ_INT(l.len, 6);
    rlog_trim(&l, 2); /* behind: nothing */
    CHECK_EQ_INT(l.base, 4);
    m = reply(&l, 1, 1 << 20);
    CHECK_EQ_INT(m->n_responses, 6);
    CHECK_EQ_INT(m->responses[0]->index, 4);
    kolo__negotiate_reply__free_unpacked(m, NULL);
    append_named(&l, "after.trim");
    CHECK_EQ_INT(rlog_end(&l), 11);
    rlog_trim(&l, 100); /* past the end: everything */
    CHECK_EQ_INT(l.len, 0);
    CHECK_EQ_INT(l.base, 11);

    /* a restart at a base numbers from there */
    rlog_restart(&l, 500);
    append_named(&l, "rebuilt");
    m = reply(&l, 500, 1 << 20);
    CHECK_EQ_INT(m->n_responses, 1);
    CHECK_EQ_INT(m->responses[0]->index, 500);
    CHECK_EQ_INT(m->next_cursor, 501);
    kolo__negotiate_reply__free_unpacked(m, NULL);
    rlog_free(&l);
}

/* A reply stops before max_bytes; the rank reads on from next_cursor. */
static void test_reply_limit(void)
{
    struct resp_log l = {0};
    char name[600];
    memset(name, 'x', sizeof name - 8);
    for (int i = 0; i < 20; i++) {
        snprintf(name + sizeof name - 8, 8, ".%d", i);
        append_named(&l, name);
    }
    uint64_t cursor = 0;
    int reads = 0, got = 0;
    while (cursor < rlog_end(&l)) {
        Kolo__NegotiateReply *m = reply(&l, cursor, 2000);
        CHECK(m->n_responses >= 1 && m->n_responses <= 3);
        CHECK_EQ_INT(m->responses[0]->index, cursor);
        got += (int)m->n_responses;
        cursor = m->next_cursor;
        kolo__negotiate_reply__free_unpacked(m, NULL);
        reads++;
    }
    CHECK_EQ_INT(got, 20);
    CHECK(reads >= 7);
    /* too small for even one entry: none, and the same cursor */
    Kolo__NegotiateReply *m = reply(&l, 5, 100);
    CHECK_EQ_INT(m->n_responses, 0);
    CHECK_EQ_INT(m->next_cursor, 5);
    kolo__negotiate_reply__free_unpacked(m, NULL);
    rlog_free(&l);
}

static void test_varint(void)
{
    static const struct {
        uint64_t v;
        size_t bytes;
    } cases[] = {{0, 1}, {127, 1}, {128, 2}, {300, 2}, {1ull << 35, 6}, {UINT64_MAX, 10}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t buf[16], *p = buf;
        pb_put_varint(&p, cases[c].v);
        CHECK_EQ_INT((size_t)(p - buf), cases[c].bytes);
        uint64_t back = 0;
        for (size_t i = 0; i < cases[c].bytes; i++)
            back |= (uint64_t)(buf[i] & 0x7f) << (7 * i);
        CHECK(back == cases[c].v);
    }
}

int main(void)
{
    test_append_read_trim();
    test_reply_limit();
    test_varint();
    TEST_DONE();
}
