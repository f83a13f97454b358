/*
 * test_lines.c - the agent's pure parts: the line splitter (newlines,
 * "\r\n", 64 KiB pieces, a last line without newline) and the outbound
 * queue (batch cuts that keep lines before events, sizes, the cap that
 * drops the oldest lines but never events, batch numbers).
 */
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "test.h"

struct got {
    char *lines[64];
    size_t lens[64];
    int n;
};

static void collect(void *arg, const char *line, size_t len)
{
    struct got *g = arg;
    if (g->n < 64) {
        g->lines[g->n] = malloc(len + 1);
        memcpy(g->lines[g->n], line, len);
        g->lines[g->n][len] = '\0';
        g->lens[g->n] = len;
    }
    g->n++;
}

static void got_free(struct got *g)
{
    for (int i = 0; i < g->n && i < 64; i++)
        free(g->lines[i]);
    memset(g, 0, sizeof(*g));
}

static void test_splitter_basic(void)
{
    struct got g = {0};
    struct line_splitter ls;
    REQUIRE(line_splitter_init(&ls, 16, collect, &g) == 0);
    line_splitter_feed(&ls, "a\nbb\r\n", 6);
    line_splitter_feed(&ls, "\n", 1);  /* an empty line */
    line_splitter_feed(&ls, "par", 3); /* split across reads */
    line_splitter_feed(&ls, "tial\nx\r", 7);
    line_splitter_feed(&ls, "\ny", 2); /* "\r\n" split across reads */
    CHECK_EQ_INT(g.n, 5);
    CHECK_EQ_STR(g.lines[0], "a");
    CHECK_EQ_STR(g.lines[1], "bb");
    CHECK_EQ_STR(g.lines[2], "");
    CHECK_EQ_STR(g.lines[3], "partial");
    CHECK_EQ_STR(g.lines[4], "x");
    line_splitter_finish(&ls); /* "y" had no newline */
    CHECK_EQ_INT(g.n, 6);
    CHECK_EQ_STR(g.lines[5], "y");
    line_splitter_finish(&ls); /* nothing more */
    CHECK_EQ_INT(g.n, 6);
    line_splitter_free(&ls);
    got_free(&g);
}

static void test_splitter_long_lines(void)
{
    struct got g = {0};
    struct line_splitter ls;
    REQUIRE(line_splitter_init(&ls, 8, collect, &g) == 0);
    /* 20 bytes without newline: two 8-byte pieces, 4 left. */
    line_splitter_feed(&ls, "0123456789abcdefghij", 20);
    CHECK_EQ_INT(g.n, 2);
    CHECK_EQ_STR(g.lines[0], "01234567");
    CHECK_EQ_STR(g.lines[1], "89abcdef");
    line_splitter_feed(&ls, "\n", 1);
    CHECK_EQ_INT(g.n, 3);
    CHECK_EQ_STR(g.lines[2], "ghij");
    /* Exactly 8 bytes then a newline: one piece, no empty line after it. */
    line_splitter_feed(&ls, "ABCDEFGH\nnext\n", 14);
    CHECK_EQ_INT(g.n, 5);
    CHECK_EQ_STR(g.lines[3], "ABCDEFGH");
    CHECK_EQ_STR(g.lines[4], "next");
    /* The same with "\r\n", the "\r" arriving alone. */
    line_splitter_feed(&ls, "ABCDEFGH", 8);
    line_splitter_feed(&ls, "\r", 1);
    line_splitter_feed(&ls, "\nz\n", 3);
    CHECK_EQ_INT(g.n, 7);
    CHECK_EQ_STR(g.lines[5], "ABCDEFGH");
    CHECK_EQ_STR(g.lines[6], "z");
    /* A full piece, then EOF right after a lone "\r". */
    line_splitter_feed(&ls, "12345678\r", 9);
    line_splitter_finish(&ls);
    CHECK_EQ_INT(g.n, 8);
    CHECK_EQ_STR(g.lines[7], "12345678");
    line_splitter_free(&ls);
    got_free(&g);
}

static void test_splitter_real_size(void)
{
    /* A 150000-byte line in one go with the agent's real limit. */
    struct got g = {0};
    struct line_splitter ls;
    REQUIRE(line_splitter_init(&ls, AGENT_LINE_MAX, collect, &g) == 0);
    size_t n = 150000;
    char *big = malloc(n + 1);
    memset(big, 'x', n);
    big[n] = '\n';
    line_splitter_feed(&ls, big, n + 1);
    CHECK_EQ_INT(g.n, 3);
    CHECK_EQ_INT(g.lens[0], AGENT_LINE_MAX);
    CHECK_EQ_INT(g.lens[1], AGENT_LINE_MAX);
    CHECK_EQ_INT(g.lens[2], n - 2 * AGENT_LINE_MAX);
    free(big);
    line_splitter_free(&ls);
    got_free(&g);
}

static void push_event(struct outbox *o, int kind, int rank)
{
    Kolo__WorkerEvent ev = KOLO__WORKER_EVENT__INIT;
    ev.job_id = 1;
    ev.rank = rank;
    ev.kind = kind;
    ev.message = "m";
    outbox_push_event(o, &ev);
}

static void push_line(struct outbox *o, int rank, const char *text)
{
    outbox_push_line(o, 1, rank, 0, KOLO__OUTPUT_STREAM__OUTPUT_STDOUT, text, strlen(text), 0);
}

static void test_outbox_batches(void)
{
    struct outbox o;
    struct outbox_batch b;
    outbox_init(&o, AGENT_OUTBOX_CAP);
    CHECK(outbox_empty(&o));
    /* started, two lines, exited, started, a line: a batch is cut where a
     * line follows an event, so every batch's lines precede its events. */
    push_event(&o, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0);
    push_line(&o, 0, "one");
    push_line(&o, 0, "two");
    push_event(&o, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0);
    push_event(&o, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 1);
    push_line(&o, 1, "three");

    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_events, 1);
    CHECK_EQ_INT(b.n_lines, 0);
    CHECK_EQ_INT(b.seq, 1);
    outbox_batch_free(&b);

    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_lines, 2);
    CHECK_EQ_INT(b.n_events, 2);
    CHECK_EQ_INT(b.seq, 2);
    /* The packed request has both lists and the batch number. */
    uint8_t *data;
    size_t len;
    REQUIRE(outbox_batch_pack(&b, "sess", &data, &len) == 0);
    Kolo__ReportRequest *r = kolo__report_request__unpack(NULL, len, data);
    REQUIRE(r != NULL);
    CHECK_EQ_STR(r->session, "sess");
    CHECK_EQ_INT(r->batch_seq, 2);
    CHECK_EQ_INT(r->n_lines, 2);
    CHECK_EQ_INT(r->n_events, 2);
    CHECK_EQ_INT(r->events[0]->kind, KOLO__WORKER_EVENT_KIND__WORKER_EXITED);
    CHECK_EQ_INT(r->events[1]->kind, KOLO__WORKER_EVENT_KIND__WORKER_STARTED);
    CHECK(r->lines[1]->text.len == 3 && memcmp(r->lines[1]->text.data, "two", 3) == 0);
    kolo__report_request__free_unpacked(r, NULL);
    free(data);
    outbox_batch_free(&b);

    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_lines, 1);
    CHECK_EQ_INT(b.n_events, 0);
    outbox_batch_free(&b);
    CHECK(outbox_empty(&o));
    outbox_free(&o);
}

static void test_outbox_limits(void)
{
    struct outbox o;
    struct outbox_batch b;
    char text[64];

    /* 2500 short lines: batches of at most AGENT_BATCH_LINES. */
    outbox_init(&o, AGENT_OUTBOX_CAP);
    for (int i = 0; i < 2500; i++) {
        snprintf(text, sizeof(text), "line %d", i);
        push_line(&o, 0, text);
    }
    CHECK(outbox_full_batch(&o));
    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_lines, AGENT_BATCH_LINES);
    outbox_batch_free(&b);
    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_lines, AGENT_BATCH_LINES);
    outbox_batch_free(&b);
    CHECK(!outbox_full_batch(&o));
    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_lines, 500);
    outbox_batch_free(&b);
    outbox_free(&o);

    /* Big lines: a batch stays under AGENT_BATCH_BYTES (but always holds
     * at least one line). */
    outbox_init(&o, AGENT_OUTBOX_CAP);
    char *big = malloc(100000);
    memset(big, 'b', 100000);
    for (int i = 0; i < 5; i++)
        outbox_push_line(&o, 1, 0, 0, 1, big, 100000, 0);
    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_lines, 2);
    outbox_batch_free(&b);
    outbox_free(&o);

    /* The cap drops the oldest lines, never events. */
    outbox_init(&o, 350000);
    push_event(&o, KOLO__WORKER_EVENT_KIND__WORKER_STARTED, 0);
    for (int i = 0; i < 10; i++) {
        big[0] = (char)('0' + i);
        outbox_push_line(&o, 1, 0, 0, 1, big, 100000, 0);
    }
    push_event(&o, KOLO__WORKER_EVENT_KIND__WORKER_EXITED, 0);
    CHECK_EQ_INT(o.dropped, 7);
    CHECK_EQ_INT(o.n_lines, 3);
    outbox_take(&o, &b);
    CHECK_EQ_INT(b.n_events, 1);
    outbox_batch_free(&b);
    outbox_take(&o, &b);
    REQUIRE(b.n_lines >= 1);
    CHECK_EQ_INT(b.head->data[0], '7'); /* lines 0..6 were dropped */
    outbox_batch_free(&b);
    int events = 0, lines = 0;
    while (!outbox_empty(&o)) {
        outbox_take(&o, &b);
        events += (int)b.n_events;
        lines += (int)b.n_lines;
        outbox_batch_free(&b);
    }
    CHECK_EQ_INT(events, 1);
    CHECK_EQ_INT(lines, 1);
    free(big);
    outbox_free(&o);
}

int main(void)
{
    test_splitter_basic();
    test_splitter_long_lines();
    test_splitter_real_size();
    test_outbox_batches();
    test_outbox_limits();
    TEST_DONE();
}
