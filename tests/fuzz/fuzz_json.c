/*
 * fuzz_json.c - libFuzzer harness for the JSON reader (common/json.c),
 * which parses REST submissions and epoch metrics from the network. What
 * parses, written back (jw_json), must parse again to the same text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "json.h"

static void write_back(const struct json *v, struct buf *b)
{
    struct jw w;
    buf_init(b);
    jw_init(&w, b);
    jw_json(&w, v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct json *v = NULL;
    char err[256];
    if (json_parse((const char *)data, size, &v, err, sizeof err) != 0)
        return 0;
    struct buf once, twice;
    write_back(v, &once);
    json_free(v);
    struct json *again = NULL;
    if (json_parse((const char *)once.data, once.len, &again, err, sizeof err) != 0)
        abort(); /* our own output must parse */
    write_back(again, &twice);
    json_free(again);
    if (once.len != twice.len || memcmp(once.data, twice.data, once.len) != 0)
        abort(); /* and be stable */
    buf_free(&once);
    buf_free(&twice);
    /* metrics fields arrive as protobuf strings: NUL-terminated */
    char *text = malloc(size + 1);
    if (text) {
        memcpy(text, data, size);
        text[size] = '\0';
        (void)json_object_ok(text, 4096, "f", err, sizeof err);
        free(text);
    }
    return 0;
}
