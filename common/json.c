/*
 * json.c - a small JSON writer and a bounded recursive-descent parser.
 *
 * Writer. Each nesting level remembers whether a value has been written
 * at it, so callers never place commas themselves. jw_key() writes the
 * member name and clears that flag, so the value after it gets no comma.
 * Misuse the writer cannot express (nesting past 64) marks the buffer
 * failed, which the caller already checks once at the end.
 *
 * Parser. RFC 8259 strictly: no comments, no trailing commas, no leading
 * zeros, no raw control characters or invalid UTF-8 inside strings, no
 * bytes after the value but whitespace. Nesting is capped at 64 levels so
 * hostile input cannot exhaust the stack, and every error names the byte
 * offset where it was found. Duplicate member names are kept; json_get()
 * returns the last one, as Python's json module and JavaScript do, so
 * kolo reads a document the same way its clients do.
 *
 * A number node also keeps its source text in `str`, so json_as_int()
 * can return 64-bit ids exactly even where a double would round them.
 */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

#define JSON_MAX_DEPTH 64

/* ------------------------------------------------------------------ writer */

void jw_init(struct jw *w, struct buf *b)
{
    w->b = b;
    w->depth = 0;
    memset(w->need_comma, 0, sizeof w->need_comma);
}

/* jw_before_value writes the separator owed before a new value. */
static void jw_before_value(struct jw *w)
{
    if (w->need_comma[w->depth])
        buf_putc(w->b, ',');
    w->need_comma[w->depth] = true;
}

static void jw_open(struct jw *w, char c)
{
    jw_before_value(w);
    buf_putc(w->b, c);
    if (w->depth + 1 >= (int)(sizeof w->need_comma / sizeof w->need_comma[0])) {
        w->b->oom = true;
        return;
    }
    w->depth++;
    w->need_comma[w->depth] = false;
}

static void jw_close(struct jw *w, char c)
{
    buf_putc(w->b, c);
    if (w->depth > 0)
        w->depth--;
}

void jw_obj_begin(struct jw *w)
{
    jw_open(w, '{');
}

void jw_obj_end(struct jw *w)
{
    jw_close(w, '}');
}

void jw_arr_begin(struct jw *w)
{
    jw_open(w, '[');
}

void jw_arr_end(struct jw *w)
{
    jw_close(w, ']');
}

size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        min = 0x80;
        c &= 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        min = 0x800;
        c &= 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        min = 0x10000;
        c &= 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return len;
}

static void jw_escape(struct buf *b, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    buf_putc(b, '"');
    size_t run = 0; /* start of the pending run of bytes that need no escape */
    size_t i = 0;
    while (i < len) {
        unsigned char c = p[i];
        const char *esc = NULL;
        char uesc[7];
        size_t adv = 1;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20) {
                uesc[0] = '\\';
                uesc[1] = 'u';
                uesc[2] = '0';
                uesc[3] = '0';
                uesc[4] = hex[c >> 4];
                uesc[5] = hex[c & 15];
                uesc[6] = '\0';
                esc = uesc;
            } else if (c >= 0x80) {
                unsigned cp;
                adv = utf8_decode(p + i, len - i, &cp);
                if (adv == 0) {
                    esc = "\xef\xbf\xbd"; /* U+FFFD REPLACEMENT CHARACTER */
                    adv = 1;
                }
            }
        }
        if (esc) {
            buf_append(b, p + run, i - run);
            buf_puts(b, esc);
            i += adv;
            run = i;
        } else {
            i += adv;
        }
    }
    buf_append(b, p + run, len - run);
    buf_putc(b, '"');
}

void jw_key(struct jw *w, const char *key)
{
    jw_before_value(w);
    jw_escape(w->b, key ? key : "", key ? strlen(key) : 0);
    buf_putc(w->b, ':');
    /* The value that follows belongs to this member: no comma before it. */
    w->need_comma[w->depth] = false;
}

void jw_str(struct jw *w, const char *s)
{
    if (!s) {
        jw_null(w);
        return;
    }
    jw_strn(w, s, strlen(s));
}

void jw_strn(struct jw *w, const char *s, size_t len)
{
    jw_before_value(w);
    jw_escape(w->b, s ? s : "", s ? len : 0);
}

void jw_int(struct jw *w, int64_t v)
{
    jw_before_value(w);
    buf_printf(w->b, "%lld", (long long)v);
}

void jw_uint(struct jw *w, uint64_t v)
{
    jw_before_value(w);
    buf_printf(w->b, "%llu", (unsigned long long)v);
}

void jw_double(struct jw *w, double v)
{
    if (!isfinite(v)) {
        jw_null(w);
        return;
    }
    jw_before_value(w);
    /* The shortest of %.15g and %.17g that reads back as the same double:
     * 0.1 stays "0.1", and nothing is ever lost. */
    char text[32];
    snprintf(text, sizeof text, "%.15g", v);
    if (strtod(text, NULL) != v)
        snprintf(text, sizeof text, "%.17g", v);
    buf_puts(w->b, text);
}

void jw_bool(struct jw *w, bool v)
{
    jw_before_value(w);
    buf_puts(w->b, v ? "true" : "false");
}

void jw_null(struct jw *w)
{
    jw_before_value(w);
    buf_puts(w->b, "null");
}

void jw_kstr(struct jw *w, const char *key, const char *s)
{
    jw_key(w, key);
    jw_str(w, s);
}

void jw_kint(struct jw *w, const char *key, int64_t v)
{
    jw_key(w, key);
    jw_int(w, v);
}

void jw_kuint(struct jw *w, const char *key, uint64_t v)
{
    jw_key(w, key);
    jw_uint(w, v);
}

void jw_kdouble(struct jw *w, const char *key, double v)
{
    jw_key(w, key);
    jw_double(w, v);
}

void jw_kbool(struct jw *w, const char *key, bool v)
{
    jw_key(w, key);
    jw_bool(w, v);
}

/* ------------------------------------------------------------------ parser */

struct json_parser {
    const unsigned char *text;
    size_t len;
    size_t pos;
    int rc; /* first error, 0 while none */
    char *err;
    size_t errlen;
};

static int json_fail(struct json_parser *p, int rc, size_t at, const char *what)
{
    if (!p->rc) {
        p->rc = rc;
        if (p->err && p->errlen)
            snprintf(p->err, p->errlen, "%s at byte %zu", what, at);
    }
    return rc;
}

static void json_skip_ws(struct json_parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static struct json *json_new(struct json_parser *p, enum json_type type)
{
    struct json *v = calloc(1, sizeof *v);
    if (!v)
        json_fail(p, KOLO_ENOMEM, p->pos, "out of memory");
    else
        v->type = type;
    return v;
}

static int json_parse_value(struct json_parser *p, struct json **out, int depth);

static int json_literal(struct json_parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n) != 0)
        return json_fail(p, KOLO_EPROTO, p->pos, "invalid literal");
    p->pos += n;
    return 0;
}

static int json_number(struct json_parser *p, struct json *v)
{
    size_t start = p->pos;
    const unsigned char *t = p->text;
    size_t i = p->pos;
    /* Check the RFC 8259 grammar first; strtod alone accepts far more
     * ("0x10", "inf", " 1", "01"). */
    if (i < p->len && t[i] == '-')
        i++;
    if (i >= p->len || t[i] < '0' || t[i] > '9')
        return json_fail(p, KOLO_EPROTO, i, "invalid number");
    if (t[i] == '0') {
        i++;
        if (i < p->len && t[i] >= '0' && t[i] <= '9')
            return json_fail(p, KOLO_EPROTO, start, "number with a leading zero");
    } else {
        while (i < p->len && t[i] >= '0' && t[i] <= '9')
            i++;
    }
    if (i < p->len && t[i] == '.') {
        i++;
        if (i >= p->len || t[i] < '0' || t[i] > '9')
            return json_fail(p, KOLO_EPROTO, i, "invalid number: digit expected after '.'");
        while (i < p->len && t[i] >= '0' && t[i] <= '9')
            i++;
    }
    if (i < p->len && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        if (i < p->len && (t[i] == '+' || t[i] == '-'))
            i++;
        if (i >= p->len || t[i] < '0' || t[i] > '9')
            return json_fail(p, KOLO_EPROTO, i, "invalid number: digit expected in exponent");
        while (i < p->len && t[i] >= '0' && t[i] <= '9')
            i++;
    }
    size_t n = i - start;
    /* The input need not be NUL-terminated, so strtod gets its own copy. */
    v->str = malloc(n + 1);
    if (!v->str)
        return json_fail(p, KOLO_ENOMEM, start, "out of memory");
    memcpy(v->str, t + start, n);
    v->str[n] = '\0';
    v->str_len = n;
    errno = 0;
    v->num = strtod(v->str, NULL);
    if (errno == ERANGE && isinf(v->num))
        return json_fail(p, KOLO_EPROTO, start, "number out of range");
    p->pos = i;
    return 0;
}

static int json_hex4(struct json_parser *p, size_t at, unsigned *out)
{
    if (p->len - at < 4)
        return json_fail(p, KOLO_EPROTO, at, "truncated \\u escape");
    unsigned v = 0;
    for (size_t i = 0; i < 4; i++) {
        unsigned char c = p->text[at + i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return json_fail(p, KOLO_EPROTO, at + i, "invalid hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static void utf8_put(struct buf *b, unsigned cp)
{
    char out[4];
    size_t n;
    if (cp < 0x80) {
        out[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        out[0] = (char)(0xf0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    buf_append(b, out, n);
}

/* json_string parses a string starting at the opening quote into a fresh
 * NUL-terminated allocation (*out, *out_len). */
static int json_string(struct json_parser *p, char **out, size_t *out_len)
{
    size_t start = p->pos;
    const unsigned char *t = p->text;
    p->pos++; /* the opening quote */
    struct buf b;
    buf_init(&b);
    size_t run = p->pos;
    for (;;) {
        if (p->pos >= p->len) {
            buf_free(&b);
            return json_fail(p, KOLO_EPROTO, start, "unterminated string");
        }
        unsigned char c = t[p->pos];
        if (c == '"') {
            buf_append(&b, t + run, p->pos - run);
            p->pos++;
            break;
        }
        if (c < 0x20) {
            buf_free(&b);
            return json_fail(p, KOLO_EPROTO, p->pos, "control character in string");
        }
        if (c >= 0x80) {
            unsigned cp;
            size_t n = utf8_decode(t + p->pos, p->len - p->pos, &cp);
            if (n == 0) {
                buf_free(&b);
                return json_fail(p, KOLO_EPROTO, p->pos, "invalid UTF-8 in string");
            }
            p->pos += n;
            continue;
        }
        if (c != '\\') {
            p->pos++;
            continue;
        }
        buf_append(&b, t + run, p->pos - run);
        size_t esc = p->pos;
        if (p->pos + 1 >= p->len) {
            buf_free(&b);
            return json_fail(p, KOLO_EPROTO, start, "unterminated string");
        }
        char e = (char)t[p->pos + 1];
        p->pos += 2;
        switch (e) {
        case '"':
            buf_putc(&b, '"');
            break;
        case '\\':
            buf_putc(&b, '\\');
            break;
        case '/':
            buf_putc(&b, '/');
            break;
        case 'b':
            buf_putc(&b, '\b');
            break;
        case 'f':
            buf_putc(&b, '\f');
            break;
        case 'n':
            buf_putc(&b, '\n');
            break;
        case 'r':
            buf_putc(&b, '\r');
            break;
        case 't':
            buf_putc(&b, '\t');
            break;
        case 'u': {
            unsigned cp;
            if (json_hex4(p, p->pos, &cp)) {
                buf_free(&b);
                return p->rc;
            }
            p->pos += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                buf_free(&b);
                return json_fail(p, KOLO_EPROTO, esc, "unpaired low surrogate in \\u escape");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                /* A high surrogate must be followed by an escaped low one;
                 * together they name one code point past U+FFFF. */
                unsigned lo;
                if (p->len - p->pos < 6 || t[p->pos] != '\\' || t[p->pos + 1] != 'u') {
                    buf_free(&b);
                    return json_fail(p, KOLO_EPROTO, esc, "unpaired high surrogate in \\u escape");
                }
                if (json_hex4(p, p->pos + 2, &lo)) {
                    buf_free(&b);
                    return p->rc;
                }
                if (lo < 0xdc00 || lo > 0xdfff) {
                    buf_free(&b);
                    return json_fail(p, KOLO_EPROTO, esc, "unpaired high surrogate in \\u escape");
                }
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            utf8_put(&b, cp);
            break;
        }
        default:
            buf_free(&b);
            return json_fail(p, KOLO_EPROTO, esc, "invalid escape in string");
        }
        run = p->pos;
    }
    if (b.oom) {
        buf_free(&b);
        return json_fail(p, KOLO_ENOMEM, start, "out of memory");
    }
    *out = buf_steal(&b, out_len);
    if (!*out)
        return json_fail(p, KOLO_ENOMEM, start, "out of memory");
    return 0;
}

static int json_array(struct json_parser *p, struct json *v, int depth)
{
    struct json **tail = &v->child;
    p->pos++; /* '[' */
    json_skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == ']') {
        p->pos++;
        return 0;
    }
    for (;;) {
        struct json *item = NULL;
        int rc = json_parse_value(p, &item, depth);
        if (item) {
            *tail = item;
            tail = &item->next;
            v->count++;
        }
        if (rc)
            return rc;
        json_skip_ws(p);
        if (p->pos >= p->len)
            return json_fail(p, KOLO_EPROTO, p->pos, "unexpected end of input in array");
        unsigned char c = p->text[p->pos];
        if (c == ']') {
            p->pos++;
            return 0;
        }
        if (c != ',')
            return json_fail(p, KOLO_EPROTO, p->pos, "expected ',' or ']' in array");
        p->pos++;
    }
}

static int json_object(struct json_parser *p, struct json *v, int depth)
{
    struct json **tail = &v->child;
    p->pos++; /* '{' */
    json_skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == '}') {
        p->pos++;
        return 0;
    }
    for (;;) {
        json_skip_ws(p);
        if (p->pos >= p->len)
            return json_fail(p, KOLO_EPROTO, p->pos, "unexpected end of input in object");
        if (p->text[p->pos] != '"')
            return json_fail(p, KOLO_EPROTO, p->pos, "expected a member name string");
        char *key = NULL;
        size_t key_len;
        int rc = json_string(p, &key, &key_len);
        if (rc)
            return rc;
        json_skip_ws(p);
        if (p->pos >= p->len || p->text[p->pos] != ':') {
            free(key);
            return json_fail(p, KOLO_EPROTO, p->pos, "expected ':' after member name");
        }
        p->pos++;
        struct json *member = NULL;
        rc = json_parse_value(p, &member, depth);
        if (member) {
            member->key = key;
            *tail = member;
            tail = &member->next;
            v->count++;
        } else {
            free(key);
        }
        if (rc)
            return rc;
        json_skip_ws(p);
        if (p->pos >= p->len)
            return json_fail(p, KOLO_EPROTO, p->pos, "unexpected end of input in object");
        unsigned char c = p->text[p->pos];
        if (c == '}') {
            p->pos++;
            return 0;
        }
        if (c != ',')
            return json_fail(p, KOLO_EPROTO, p->pos, "expected ',' or '}' in object");
        p->pos++;
    }
}

/* json_parse_value parses one value at depth (the number of arrays and
 * objects around it). Whatever node it allocated is returned in *out even
 * on error, so the caller links it into the tree and one json_free()
 * releases everything. */
static int json_parse_value(struct json_parser *p, struct json **out, int depth)
{
    *out = NULL;
    json_skip_ws(p);
    if (p->pos >= p->len)
        return json_fail(p, KOLO_EPROTO, p->pos, "unexpected end of input");
    unsigned char c = p->text[p->pos];
    struct json *v;
    switch (c) {
    case '{':
    case '[':
        if (depth >= JSON_MAX_DEPTH)
            return json_fail(p, KOLO_EPROTO, p->pos, "nesting deeper than 64 levels");
        v = json_new(p, c == '{' ? JSON_OBJECT : JSON_ARRAY);
        if (!v)
            return p->rc;
        *out = v;
        return c == '{' ? json_object(p, v, depth + 1) : json_array(p, v, depth + 1);
    case '"':
        v = json_new(p, JSON_STRING);
        if (!v)
            return p->rc;
        *out = v;
        return json_string(p, &v->str, &v->str_len);
    case 't':
    case 'f':
        v = json_new(p, JSON_BOOL);
        if (!v)
            return p->rc;
        *out = v;
        v->b = c == 't';
        return json_literal(p, c == 't' ? "true" : "false");
    case 'n':
        v = json_new(p, JSON_NULL);
        if (!v)
            return p->rc;
        *out = v;
        return json_literal(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            v = json_new(p, JSON_NUMBER);
            if (!v)
                return p->rc;
            *out = v;
            return json_number(p, v);
        }
        if (c >= 0x20 && c < 0x7f) {
            char what[40];
            snprintf(what, sizeof what, "unexpected character '%c'", c);
            return json_fail(p, KOLO_EPROTO, p->pos, what);
        }
        return json_fail(p, KOLO_EPROTO, p->pos, "unexpected byte");
    }
}

int json_parse(const char *text, size_t len, struct json **out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out || (!text && len > 0)) {
        if (err && errlen)
            snprintf(err, errlen, "json_parse: invalid arguments");
        return KOLO_EINVAL;
    }
    *out = NULL;
    struct json_parser p = {(const unsigned char *)(text ? text : ""), len, 0, 0, err, errlen};
    struct json *root = NULL;
    int rc = json_parse_value(&p, &root, 0);
    if (!rc) {
        json_skip_ws(&p);
        if (p.pos < p.len)
            rc = json_fail(&p, KOLO_EPROTO, p.pos, "unexpected data after the JSON value");
    }
    if (rc) {
        json_free(root);
        return rc;
    }
    *out = root;
    return 0;
}

void json_free(struct json *v)
{
    /* Siblings iteratively, children recursively: recursion depth is
     * bounded by the nesting limit, not by the length of an array. */
    while (v) {
        struct json *next = v->next;
        json_free(v->child);
        free(v->str);
        free(v->key);
        free(v);
        v = next;
    }
}

const struct json *json_get(const struct json *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT || !key)
        return NULL;
    const struct json *found = NULL;
    for (const struct json *m = obj->child; m; m = m->next)
        if (m->key && strcmp(m->key, key) == 0)
            found = m;
    return found;
}

void json_kv_free(char **kv, int n)
{
    for (int i = 0; kv && i < n; i++)
        free(kv[i]);
    free(kv);
}

int json_strings_kv(const struct json *obj, char ***out, int *n, const char **bad)
{
    *out = NULL;
    *n = 0;
    *bad = NULL;
    if (!obj || obj->type != JSON_OBJECT)
        return KOLO_EINVAL;
    char **v = calloc(obj->count + 1, sizeof *v);
    if (!v)
        return KOLO_ENOMEM;
    int k = 0;
    for (const struct json *e = obj->child; e; e = e->next) {
        size_t len = strlen(e->key) + (e->type == JSON_STRING ? strlen(e->str) : 0) + 2;
        int rc = e->type != JSON_STRING ? KOLO_EINVAL : !(v[k] = malloc(len)) ? KOLO_ENOMEM : 0;
        if (rc) {
            *bad = rc == KOLO_EINVAL ? e->key : NULL;
            json_kv_free(v, k);
            return rc;
        }
        snprintf(v[k++], len, "%s=%s", e->key, e->str);
    }
    *out = v;
    *n = k;
    return 0;
}

const struct json *json_at(const struct json *arr, size_t i)
{
    if (!arr || arr->type != JSON_ARRAY || i >= arr->count)
        return NULL;
    const struct json *e = arr->child;
    while (e && i-- > 0)
        e = e->next;
    return e;
}

bool json_as_int(const struct json *v, int64_t *out)
{
    if (!v || v->type != JSON_NUMBER)
        return false;
    /* A plain integer literal is converted from its text, exactly; a
     * double would round anything past 2^53. */
    if (v->str && !strpbrk(v->str, ".eE")) {
        errno = 0;
        char *end;
        long long n = strtoll(v->str, &end, 10);
        if (errno == ERANGE || *end != '\0')
            return false;
        if (out)
            *out = (int64_t)n;
        return true;
    }
    /* "1e3" and "2.0" are integers too, when the double is whole and in
     * range. 2^63 is exactly representable, so the bounds are exact, and
     * inside them the cast is defined and truncates any fraction. */
    double d = v->num;
    if (!isfinite(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return false;
    int64_t n = (int64_t)d;
    if ((double)n != d)
        return false;
    if (out)
        *out = n;
    return true;
}

void jw_json(struct jw *w, const struct json *v)
{
    int64_t i;
    switch (v->type) {
    case JSON_NULL:
        jw_null(w);
        break;
    case JSON_BOOL:
        jw_bool(w, v->b);
        break;
    case JSON_NUMBER:
        if (json_as_int(v, &i))
            jw_int(w, i);
        else
            jw_double(w, v->num);
        break;
    case JSON_STRING:
        jw_strn(w, v->str, v->str_len);
        break;
    case JSON_ARRAY:
        jw_arr_begin(w);
        for (const struct json *e = v->child; e; e = e->next)
            jw_json(w, e);
        jw_arr_end(w);
        break;
    case JSON_OBJECT:
        jw_obj_begin(w);
        for (const struct json *e = v->child; e; e = e->next) {
            jw_key(w, e->key);
            jw_json(w, e);
        }
        jw_obj_end(w);
        break;
    }
}

bool jw_json_text(struct jw *w, const char *text)
{
    struct json *v = NULL;
    char err[64];
    if (!text || json_parse(text, strlen(text), &v, err, sizeof err) != 0)
        return false;
    jw_json(w, v);
    json_free(v);
    return true;
}

bool json_object_ok(const char *text, size_t max, const char *field, char *why, size_t whylen)
{
    size_t len = strlen(text);
    if (len == 0)
        return true;
    if (len > max) {
        snprintf(why, whylen, "%s of %zu bytes exceeds %zu", field, len, max);
        return false;
    }
    struct json *root = NULL;
    char err[200];
    if (json_parse(text, len, &root, err, sizeof err) != 0) {
        snprintf(why, whylen, "%s is not JSON: %s", field, err);
        return false;
    }
    bool ok = root->type == JSON_OBJECT;
    json_free(root);
    if (!ok)
        snprintf(why, whylen, "%s must be a JSON object", field);
    return ok;
}
