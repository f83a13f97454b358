/*
 * test_json.c - the writer (commas, escaping, invalid UTF-8, numbers) and
 * the parser (valid and invalid documents, escapes, depth, round trips).
 */
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "errors.h"
#include "json.h"
#include "test.h"

static struct json *parse_ok(const char *text, int line)
{
    struct json *v = NULL;
    char err[128];
    int rc = json_parse(text, strlen(text), &v, err, sizeof err);
    if (rc != 0 || !v) {
        fprintf(stderr, "line %d: parse of '%s' failed: %s\n", line, text, err);
        test_failures++;
        return NULL;
    }
    return v;
}

/* parse_bad checks that text is rejected with an error mentioning want
 * (if given) and a byte offset. */
static void parse_bad(const char *text, size_t len, const char *want, int line)
{
    struct json *v = (struct json *)1;
    char err[128] = "";
    int rc = json_parse(text, len, &v, err, sizeof err);
    if (rc == 0 || v != NULL) {
        fprintf(stderr, "line %d: '%.*s' was accepted\n", line, (int)len, text);
        test_failures++;
        json_free(rc == 0 ? v : NULL);
        return;
    }
    if (rc != KOLO_EPROTO || !strstr(err, "at byte ") || (want && !strstr(err, want))) {
        fprintf(stderr, "line %d: '%.*s': rc %d, err '%s', want '%s'\n", line, (int)len, text, rc,
                err, want ? want : "");
        test_failures++;
    }
}

#define OK(text)        parse_ok(text, __LINE__)
#define BAD(text, want) parse_bad(text, strlen(text), want, __LINE__)

static void test_writer(void)
{
    struct buf b;
    struct jw w;
    buf_init(&b);
    jw_init(&w, &b);
    jw_obj_begin(&w);
    jw_kstr(&w, "name", "kolo");
    jw_kint(&w, "neg", -42);
    jw_kuint(&w, "big", UINT64_MAX);
    jw_kdouble(&w, "pi", 0.1);
    jw_kbool(&w, "yes", true);
    jw_key(&w, "nothing");
    jw_null(&w);
    jw_kstr(&w, "nullstr", NULL);
    jw_kdouble(&w, "inf", 1.0 / 0.0);
    jw_key(&w, "list");
    jw_arr_begin(&w);
    jw_int(&w, 1);
    jw_arr_begin(&w);
    jw_arr_end(&w);
    jw_obj_begin(&w);
    jw_obj_end(&w);
    jw_str(&w, "");
    jw_bool(&w, false);
    jw_arr_end(&w);
    jw_obj_end(&w);
    CHECK(!b.oom);
    CHECK_EQ_STR(buf_cstr(&b), "{\"name\":\"kolo\",\"neg\":-42,\"big\":18446744073709551615,"
                               "\"pi\":0.1,\"yes\":true,\"nothing\":null,\"nullstr\":null,"
                               "\"inf\":null,\"list\":[1,[],{},\"\",false]}");

    /* Escaping: quotes, backslash, controls, NUL, and UTF-8 kept as is. */
    buf_reset(&b);
    jw_init(&w, &b);
    static const char raw[] = "a\"b\\c\n\t\r\b\f\x01\x1f\0z \xc3\xa9 \xf0\x9f\x98\x80 /";
    jw_strn(&w, raw, sizeof raw - 1);
    CHECK_EQ_STR(buf_cstr(&b), "\"a\\\"b\\\\c\\n\\t\\r\\b\\f\\u0001\\u001f\\u0000z "
                               "\xc3\xa9 \xf0\x9f\x98\x80 /\"");

    /* Invalid UTF-8 becomes U+FFFD: a lone continuation byte, a truncated
     * sequence, an overlong '/', an encoded surrogate, and 0xff. */
    buf_reset(&b);
    jw_init(&w, &b);
    jw_arr_begin(&w);
    jw_str(&w, "x\x80y");
    jw_str(&w, "\xe2\x82");
    jw_str(&w, "\xc0\xaf");
    jw_str(&w, "\xed\xa0\x80");
    jw_str(&w, "\xff");
    jw_arr_end(&w);
    CHECK_EQ_STR(buf_cstr(&b),
                 "[\"x\xef\xbf\xbdy\",\"\xef\xbf\xbd\xef\xbf\xbd\","
                 "\"\xef\xbf\xbd\xef\xbf\xbd\",\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\","
                 "\"\xef\xbf\xbd\"]");
    /* ...and the result is always valid JSON. */
    struct json *v = OK(buf_cstr(&b));
    json_free(v);

    /* Doubles read back exactly. */
    buf_reset(&b);
    jw_init(&w, &b);
    double vals[] = {0.0, -0.5, 1e300, 1.0 / 3.0, 123456789.123456789, 5e-324};
    jw_arr_begin(&w);
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        jw_double(&w, vals[i]);
    jw_arr_end(&w);
    v = OK(buf_cstr(&b));
    if (v) {
        CHECK_EQ_INT(v->count, sizeof vals / sizeof vals[0]);
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
            CHECK(json_at(v, i) && json_at(v, i)->num == vals[i]);
    }
    json_free(v);

    /* Nesting past 64 marks the buffer failed instead of writing garbage
     * silently. */
    buf_reset(&b);
    jw_init(&w, &b);
    for (int i = 0; i < 64; i++)
        jw_arr_begin(&w);
    CHECK(!b.oom);
    jw_arr_begin(&w);
    CHECK(b.oom);
    buf_free(&b);
}

static void test_parse_valid(void)
{
    struct json *v = OK(" {\"a\": [1, -2.5e3, true, false, null, \"s\"], \"b\": {\"c\": {}},"
                        " \"e\": [] } \r\n\t");
    REQUIRE(v);
    CHECK_EQ_INT(v->type, JSON_OBJECT);
    CHECK_EQ_INT(v->count, 3);
    const struct json *a = json_get(v, "a");
    REQUIRE(a && a->type == JSON_ARRAY);
    CHECK_EQ_INT(a->count, 6);
    CHECK(json_at(a, 0)->type == JSON_NUMBER && json_at(a, 0)->num == 1);
    CHECK(json_at(a, 1)->num == -2500);
    CHECK(json_at(a, 2)->type == JSON_BOOL && json_at(a, 2)->b);
    CHECK(json_at(a, 3)->type == JSON_BOOL && !json_at(a, 3)->b);
    CHECK(json_at(a, 4)->type == JSON_NULL);
    CHECK(json_at(a, 5)->type == JSON_STRING);
    CHECK_EQ_STR(json_at(a, 5)->str, "s");
    CHECK(json_at(a, 6) == NULL);
    CHECK(json_get(json_get(v, "b"), "c")->type == JSON_OBJECT);
    CHECK(json_get(v, "e")->count == 0);
    CHECK(json_get(v, "missing") == NULL);
    CHECK(json_get(a, "a") == NULL); /* not an object */
    CHECK(json_at(v, 0) == NULL);    /* not an array */
    CHECK_EQ_STR(json_get(v, "a")->key, "a");
    json_free(v);

    /* Scalars at the top level. */
    v = OK("42");
    CHECK(v && v->type == JSON_NUMBER && v->num == 42);
    json_free(v);
    v = OK("\"top\"");
    CHECK(v && v->type == JSON_STRING && strcmp(v->str, "top") == 0);
    json_free(v);
    v = OK("null");
    CHECK(v && v->type == JSON_NULL);
    json_free(v);

    /* Numbers, and which of them are exact integers. */
    int64_t n;
    v = OK("[0, -0, 9007199254740993, 9223372036854775807, -9223372036854775808,"
           " 9223372036854775808, 1e3, 2.0, 2.5, 1E+2, 0.5e-1, 1e-400]");
    REQUIRE(v);
    CHECK(json_as_int(json_at(v, 0), &n) && n == 0);
    CHECK(json_as_int(json_at(v, 1), &n) && n == 0);
    CHECK(json_as_int(json_at(v, 2), &n) && n == 9007199254740993LL); /* past 2^53, exact */
    CHECK(json_as_int(json_at(v, 3), &n) && n == INT64_MAX);
    CHECK(json_as_int(json_at(v, 4), &n) && n == INT64_MIN);
    CHECK(!json_as_int(json_at(v, 5), &n));
    CHECK(json_as_int(json_at(v, 6), &n) && n == 1000);
    CHECK(json_as_int(json_at(v, 7), &n) && n == 2);
    CHECK(!json_as_int(json_at(v, 8), &n));
    CHECK(json_as_int(json_at(v, 9), &n) && n == 100);
    CHECK(json_at(v, 10)->num == 0.05);
    CHECK(json_at(v, 11)->num == 0.0); /* underflow is fine */
    CHECK(!json_as_int(json_get(v, "x"), &n));
    json_free(v);
    v = OK("\"7\"");
    CHECK(!json_as_int(v, &n)); /* a string is not a number */
    json_free(v);

    /* Escapes, including surrogate pairs and an embedded NUL. */
    v = OK("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20AC\\ud83d\\ude00\\u0000end\"");
    REQUIRE(v);
    const char want[] = "\"\\/\b\f\n\r\tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0end";
    CHECK_EQ_INT(v->str_len, sizeof want - 1);
    CHECK(memcmp(v->str, want, sizeof want) == 0);
    json_free(v);
    /* Raw UTF-8 passes through. */
    v = OK("{\"k\xc3\xa9y\": \"\xf0\x9f\x98\x80\"}");
    CHECK(v && json_get(v, "k\xc3\xa9y") &&
          strcmp(json_get(v, "k\xc3\xa9y")->str, "\xf0\x9f\x98\x80") == 0);
    json_free(v);

    /* Duplicate names: the last one wins, as in Python and JavaScript. */
    v = OK("{\"a\":1,\"a\":2}");
    CHECK(v && v->count == 2 && json_get(v, "a")->num == 2);
    json_free(v);

    /* Input need not be NUL-terminated. */
    struct json *w = NULL;
    CHECK_EQ_INT(json_parse("[1,2]xyz", 5, &w, NULL, 0), 0);
    CHECK(w && w->count == 2);
    json_free(w);
}

static void test_parse_invalid(void)
{
    BAD("", "end of input");
    BAD("   ", "end of input");
    BAD("{", "end of input");
    BAD("[1,", "end of input");
    BAD("[1 2]", "expected ','");
    BAD("[1,]", "unexpected character ']'");
    BAD("{\"a\":1,}", "member name");
    BAD("{\"a\" 1}", "expected ':'");
    BAD("{a:1}", "member name");
    BAD("{1:1}", "member name");
    BAD("[1]]", "after the JSON value");
    BAD("{} {}", "after the JSON value");
    BAD("nul", "invalid literal");
    BAD("True", "unexpected character");
    BAD("01", "leading zero");
    BAD("-01", "leading zero");
    BAD("00", "leading zero");
    BAD("1.", "digit expected");
    BAD(".5", "unexpected character '.'");
    BAD("-", "invalid number");
    BAD("+1", "unexpected character '+'");
    BAD("1e", "exponent");
    BAD("1e+", "exponent");
    BAD("0x10", "after the JSON value");
    BAD("1e400", "out of range");
    BAD("NaN", "unexpected character");
    BAD("Infinity", "unexpected character");
    BAD("\"abc", "unterminated string");
    BAD("\"abc\\", "unterminated string");
    BAD("\"a\nb\"", "control character");
    BAD("\"a\tb\"", "control character");
    BAD("\"\\x\"", "invalid escape");
    BAD("\"\\u12\"", "\\u escape");
    BAD("\"\\u12x4\"", "hex digit");
    BAD("\"\\u12", "\\u escape");
    BAD("\"\\uzzzz\"", "hex digit");
    BAD("\"\\ud83d\"", "high surrogate");
    BAD("\"\\ud83dx\"", "high surrogate");
    BAD("\"\\ud83d\\u0041\"", "high surrogate");
    BAD("\"\\ude00\"", "low surrogate");
    BAD("\"\xff\"", "invalid UTF-8");
    BAD("\"\xc0\xaf\"", "invalid UTF-8");
    BAD("\"\xed\xa0\x80\"", "invalid UTF-8");
    BAD("\"\xe2\x82\"", "invalid UTF-8");
    BAD("\xef\xbb\xbf{}", "unexpected byte");
    BAD("[1] // comment", "after the JSON value");
    BAD("{\"a\":1 /* x */}", "expected ','");
    BAD("'single'", "unexpected character");
    parse_bad("[1,\0 2]", 7, "unexpected byte", __LINE__);
    parse_bad("1\0", 2, "after the JSON value", __LINE__);

    /* Offsets point at the problem. */
    struct json *v = NULL;
    char err[128];
    CHECK_EQ_INT(json_parse("[1, 2, x]", 9, &v, err, sizeof err), KOLO_EPROTO);
    CHECK(strstr(err, "at byte 7") != NULL);
    CHECK(v == NULL);
    CHECK_EQ_INT(json_parse(NULL, 0, NULL, err, sizeof err), KOLO_EINVAL);
}

static char *nested(int depth, char open, char close)
{
    char *s = malloc((size_t)depth * 2 + 1);
    REQUIRE(s);
    memset(s, open, (size_t)depth);
    memset(s + depth, close, (size_t)depth);
    s[depth * 2] = '\0';
    return s;
}

static void test_depth(void)
{
    char *s = nested(64, '[', ']');
    struct json *v = OK(s);
    CHECK(v != NULL);
    json_free(v);
    free(s);

    s = nested(65, '[', ']');
    BAD(s, "nesting deeper than 64");
    free(s);

    /* Objects count too, and hostile depth fails fast without recursion
     * to the bottom. */
    struct buf b;
    buf_init(&b);
    for (int i = 0; i < 65; i++)
        buf_puts(&b, "{\"a\":");
    buf_puts(&b, "1");
    for (int i = 0; i < 65; i++)
        buf_puts(&b, "}");
    BAD(buf_cstr(&b), "nesting");
    buf_free(&b);
    s = nested(1000000, '[', ']');
    BAD(s, "nesting");
    free(s);
}

static void test_round_trip(void)
{
    /* Write a document, parse it, write it again: byte-identical. */
    struct buf one, two;
    buf_init(&one);
    buf_init(&two);
    struct jw w;
    jw_init(&w, &one);
    jw_obj_begin(&w);
    jw_kstr(&w, "esc", "q\"b\\n\n\x01\xc3\xa9\xf0\x9f\x98\x80");
    jw_kint(&w, "i", -9223372036854775807LL - 1);
    jw_kdouble(&w, "d", 2.5e-8);
    jw_key(&w, "arr");
    jw_arr_begin(&w);
    for (int i = 0; i < 5; i++) {
        jw_obj_begin(&w);
        jw_kint(&w, "i", i);
        jw_kbool(&w, "odd", i % 2);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    REQUIRE(!one.oom);

    struct json *v = OK(buf_cstr(&one));
    REQUIRE(v);
    /* Re-emit from the tree. */
    jw_init(&w, &two);
    jw_obj_begin(&w);
    const struct json *m = json_get(v, "esc");
    jw_key(&w, m->key);
    jw_strn(&w, m->str, m->str_len);
    int64_t n;
    CHECK(json_as_int(json_get(v, "i"), &n));
    jw_kint(&w, "i", n);
    jw_kdouble(&w, "d", json_get(v, "d")->num);
    jw_key(&w, "arr");
    jw_arr_begin(&w);
    for (const struct json *e = json_get(v, "arr")->child; e; e = e->next) {
        jw_obj_begin(&w);
        CHECK(json_as_int(json_get(e, "i"), &n));
        jw_kint(&w, "i", n);
        jw_kbool(&w, "odd", json_get(e, "odd")->b);
        jw_obj_end(&w);
    }
    jw_arr_end(&w);
    jw_obj_end(&w);
    CHECK_EQ_STR(buf_cstr(&two), buf_cstr(&one));
    json_free(v);
    buf_free(&one);
    buf_free(&two);
}

static void test_object_ok(void)
{
    char why[256] = "";
    CHECK(json_object_ok("", 10, "meta", why, sizeof why));
    CHECK(json_object_ok("{\"a\":1}", 10, "meta", why, sizeof why));
    CHECK(!json_object_ok("{\"a\":12345678}", 10, "meta", why, sizeof why));
    CHECK(strstr(why, "meta of 14 bytes exceeds 10") != NULL);
    CHECK(!json_object_ok("[1]", 10, "meta", why, sizeof why));
    CHECK(strstr(why, "meta must be a JSON object") != NULL);
    CHECK(!json_object_ok("{nope", 10, "meta", why, sizeof why));
    CHECK(strstr(why, "meta is not JSON") != NULL);
}

/* json_strings_kv: an object of strings to "key=value"; anything else named. */
static void test_strings_kv(void)
{
    struct json *v = NULL;
    char err[64], **kv = NULL;
    const char *bad = NULL;
    int n = -1;
    const char *ok = "{\"a\":\"1\",\"b c\":\"x=y\",\"e\":\"\"}";
    REQUIRE(json_parse(ok, strlen(ok), &v, err, sizeof err) == 0);
    CHECK_EQ_INT(json_strings_kv(v, &kv, &n, &bad), 0);
    REQUIRE(n == 3);
    CHECK_EQ_STR(kv[0], "a=1");
    CHECK_EQ_STR(kv[1], "b c=x=y");
    CHECK_EQ_STR(kv[2], "e=");
    CHECK(kv[3] == NULL);
    json_kv_free(kv, n);
    json_free(v);
    const char *num = "{\"a\":\"1\",\"b\":2}";
    REQUIRE(json_parse(num, strlen(num), &v, err, sizeof err) == 0);
    CHECK_EQ_INT(json_strings_kv(v, &kv, &n, &bad), KOLO_EINVAL);
    CHECK_EQ_STR(bad, "b");
    CHECK(kv == NULL && n == 0);
    json_free(v);
    REQUIRE(json_parse("[\"a\"]", 5, &v, err, sizeof err) == 0);
    CHECK_EQ_INT(json_strings_kv(v, &kv, &n, &bad), KOLO_EINVAL);
    CHECK(bad == NULL);
    json_free(v);
    REQUIRE(json_parse("{}", 2, &v, err, sizeof err) == 0);
    CHECK_EQ_INT(json_strings_kv(v, &kv, &n, &bad), 0);
    CHECK(n == 0 && kv && kv[0] == NULL);
    json_kv_free(kv, n);
    json_free(v);
}

int main(void)
{
    test_strings_kv();
    test_object_ok();
    test_writer();
    test_parse_valid();
    test_parse_invalid();
    test_depth();
    test_round_trip();
    TEST_DONE();
}
