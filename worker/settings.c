/*
 * settings.c - see settings.h.
 */
#include "settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "knobs.h"

const struct setting_info settings_table[SET_COUNT] = {
#define SETTING_ROW_(id, env, alias, type, def, min, max, choices, help)                           \
    [SET_##id] = {env, alias, SETTING_##type, def, min, max, choices, help},
    LIBKOLO_SETTINGS(SETTING_ROW_)
#undef SETTING_ROW_
};

const char *settings_raw(enum setting s)
{
    const struct setting_info *k = &settings_table[s];
    const char *v = getenv(k->env);
    if ((!v || !v[0]) && k->alias)
        v = getenv(k->alias);
    return v && v[0] ? v : NULL;
}

bool settings_set(enum setting s)
{
    return settings_raw(s) != NULL;
}

const char *settings_str(enum setting s)
{
    const char *v = settings_raw(s);
    return v ? v : settings_table[s].def;
}

static bool word_in(const char *word, const char *list)
{
    size_t n = strlen(word);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, " ");
        if (len == n && strncmp(p, word, n) == 0)
            return true;
        p += len;
        p += strspn(p, " ");
    }
    return false;
}

/* Parses text as s's type: 0 with *out, or -1. */
static int parse(const struct setting_info *k, const char *text, int64_t *out)
{
    switch (k->type) {
    case SETTING_BOOL: {
        bool on;
        if (knobs_parse_bool(text, &on) != 0)
            return -1;
        *out = on;
        return 0;
    }
    case SETTING_INT:
        if (knobs_parse_int(text, out) != 0)
            return -1;
        return *out < k->min || *out > k->max ? -1 : 0;
    case SETTING_SIZE:
        if (knobs_parse_size(text, out) != 0)
            return -1;
        return *out < k->min || *out > k->max ? -1 : 0;
    case SETTING_CHOICE:
        return word_in(text, k->choices) ? 0 : -1;
    case SETTING_STR:
        return 0;
    }
    return -1;
}

int64_t settings_int(enum setting s, int64_t unset)
{
    const struct setting_info *k = &settings_table[s];
    const char *v = settings_raw(s);
    int64_t x;
    if (v && parse(k, v, &x) == 0)
        return x;
    if (k->def && parse(k, k->def, &x) == 0)
        return x;
    return unset;
}

int settings_check(char *err, size_t errlen)
{
    for (int s = 0; s < SET_COUNT; s++) {
        const struct setting_info *k = &settings_table[s];
        const char *v = settings_raw((enum setting)s);
        int64_t x;
        if (!v || parse(k, v, &x) == 0)
            continue;
        const char *name = getenv(k->env) && getenv(k->env)[0] ? k->env : k->alias;
        switch (k->type) {
        case SETTING_BOOL:
            return errf(err, errlen, KOLO_EINVAL, "%s=%s: want 0 or 1", name, v);
        case SETTING_CHOICE:
            return errf(err, errlen, KOLO_EINVAL, "%s=%s: want one of: %s", name, v, k->choices);
        default:
            return errf(err, errlen, KOLO_EINVAL,
                        "%s=%s: want %s from %lld to %lld", name, v,
                        k->type == SETTING_SIZE ? "a size in bytes (4k, 16M)" : "an integer",
                        (long long)k->min, (long long)k->max);
        }
    }
    return 0;
}
