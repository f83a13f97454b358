/*
 * json.h - a small JSON writer and a bounded DOM parser.
 *
 * Writer: appends to a struct buf and inserts commas itself; strings are
 * escaped (control characters, quotes, backslash; invalid UTF-8 bytes are
 * replaced by U+FFFD so output is always valid JSON).
 *
 * Parser: RFC 8259, whole input in memory, depth limited (64) and size
 * limited by the caller; errors name the byte offset. The tree is owned
 * by the returned root and freed with json_free.
 */
#ifndef KOLO_COMMON_JSON_H
#define KOLO_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* ---- writer ---- */

struct jw {
    struct buf *b;
    int depth;
    bool need_comma[65];
};

void jw_init(struct jw *w, struct buf *b);
void jw_obj_begin(struct jw *w);
void jw_obj_end(struct jw *w);
void jw_arr_begin(struct jw *w);
void jw_arr_end(struct jw *w);
void jw_key(struct jw *w, const char *key); /* inside an object, before a value */
void jw_str(struct jw *w, const char *s);   /* NULL writes null */
void jw_strn(struct jw *w, const char *s, size_t len);
void jw_int(struct jw *w, int64_t v);
void jw_uint(struct jw *w, uint64_t v);
void jw_double(struct jw *w, double v); /* non-finite writes null */
void jw_bool(struct jw *w, bool v);
void jw_null(struct jw *w);
/* jw_json writes a parsed value again; jw_json_text parses text and
 * writes it, or writes nothing and returns false when text is not JSON. */
struct json;
void jw_json(struct jw *w, const struct json *v);
bool jw_json_text(struct jw *w, const char *text);
/* convenience: key + value */
void jw_kstr(struct jw *w, const char *key, const char *s);
void jw_kint(struct jw *w, const char *key, int64_t v);
void jw_kuint(struct jw *w, const char *key, uint64_t v);
void jw_kdouble(struct jw *w, const char *key, double v);
void jw_kbool(struct jw *w, const char *key, bool v);

/* ---- parser ---- */

enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json {
    enum json_type type;
    bool b;
    double num;
    char *str; /* JSON_STRING (NUL-terminated, may contain NUL via \u0000) */
    size_t str_len;
    char *key;          /* member name when this value is inside an object */
    struct json *child; /* first element/member */
    struct json *next;  /* next sibling */
    size_t count;       /* number of children */
};

/* utf8_decode reads one well-formed UTF-8 sequence at s (n bytes left,
 * at least 1). It returns its length and the code point, or 0 if the bytes
 * there are not valid UTF-8 (overlong forms, surrogates and values past
 * U+10FFFF count as invalid, per RFC 3629). */
size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp);
/* json_parse returns 0 and *out, or an error with a message in err. */
int json_parse(const char *text, size_t len, struct json **out, char *err, size_t errlen);
void json_free(struct json *v);
/* json_object_ok accepts "" or a JSON object of at most max bytes; else
 * false with a message naming `field` in why. */
bool json_object_ok(const char *text, size_t max, const char *field, char *why, size_t whylen);
/* json_get returns the member named key of an object, or NULL. */
const struct json *json_get(const struct json *obj, const char *key);
/* json_at returns element i of an array, or NULL. */
const struct json *json_at(const struct json *arr, size_t i);
/* json_as_int: true if v is a number with an exact int64 value. */
bool json_as_int(const struct json *v, int64_t *out);
/* json_strings_kv turns an object of strings into malloc'd "key=value"
 * entries (*out NULL-terminated, *n of them; free with json_kv_free):
 * 0, KOLO_EINVAL when obj is not an object or a value is not a string
 * (*bad is then that member's key, or NULL), or KOLO_ENOMEM. */
int json_strings_kv(const struct json *obj, char ***out, int *n, const char **bad);
void json_kv_free(char **kv, int n);

#endif
