/*
 * knobs.c - one table of settings per binary: flags, environment, config
 * file and defaults.
 *
 * DESIGN. Every source goes through one function, knob_set(), so a value
 * is parsed, range-checked and reported the same way wherever it came
 * from, and errors always name the knob and the source ("np: 0 is out of
 * range [1, 1024] (from env KOLO_NP)"). knobs_parse() walks the command
 * line twice: the first walk only recognises flags, which finds unknown
 * flags, --help, --dump-config and --config before anything is read; the
 * second walk, after the config file and the environment, applies the
 * flags, so the priorities fall out of the order of the steps:
 *
 *     default < config file < environment < command line.
 *
 * An environment variable set to the empty string counts as unset, since
 * `KOLO_X= cmd` is how shells spell "not for this command".
 *
 * A knob with a loader names a file in another format (horovodrun's
 * YAML). Its path is known before anything is applied: the first walk
 * keeps the loader knob's flag, else its variable or config file line
 * gives it. The loader runs right after the config file and goes through
 * knob_set() like everything else, so its settings rank with the config
 * file and error messages name its lines too.
 *
 * Config files hold `name = value` lines. A '#' starts a comment at the
 * start of a line or after whitespace in an unquoted value. A value may be
 * double-quoted (with \", \\, \n, \r and \t escapes) to keep spaces, '#'
 * or an empty string; --dump-config quotes exactly when that is needed, so
 * its output reads back to the same settings.
 */
#include "knobs.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "errors.h"
#include "util.h"

/* A config file is a page of settings; anything larger is a wrong path. */
#define KNOBS_CONFIG_MAX (1u << 20)

static void knobs_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void knobs_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------ value parsers */

/* parse_digits reads a run of decimal digits into *v; the number of
 * digits read, or -1 on overflow. */
static int parse_digits(const char *s, int64_t *v, const char **end)
{
    int64_t acc = 0;
    int n = 0;
    while (*s >= '0' && *s <= '9') {
        int d = *s - '0';
        if (acc > (INT64_MAX - d) / 10)
            return -1;
        acc = acc * 10 + d;
        s++;
        n++;
    }
    *v = acc;
    *end = s;
    return n;
}

int knobs_parse_int(const char *s, int64_t *v)
{
    if (!s || !*s)
        return KOLO_EINVAL;
    /* strtoll would skip leading blanks and accept "12abc" up to the
     * letters; a setting must be exactly a number. */
    if (!(isdigit((unsigned char)s[0]) ||
          ((s[0] == '-' || s[0] == '+') && isdigit((unsigned char)s[1]))))
        return KOLO_EINVAL;
    errno = 0;
    char *end;
    long long n = strtoll(s, &end, 10);
    if (errno == ERANGE || *end != '\0')
        return KOLO_EINVAL;
    *v = (int64_t)n;
    return 0;
}

int knobs_parse_bool(const char *s, bool *v)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *v = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *v = false;
            return 0;
        }
    }
    return KOLO_EINVAL;
}

struct unit {
    const char *suffix;
    int64_t scale;
};

/* parse_scaled reads "<digits><suffix>" where suffix is one of units
 * (compared without case when nocase). */
static int parse_scaled(const char *s, int64_t *out, const struct unit *units, size_t nunits,
                        bool nocase)
{
    if (!s)
        return KOLO_EINVAL;
    int64_t v;
    const char *end;
    int digits = parse_digits(s, &v, &end);
    if (digits <= 0)
        return KOLO_EINVAL;
    for (size_t i = 0; i < nunits; i++) {
        bool same =
            nocase ? strcasecmp(end, units[i].suffix) == 0 : strcmp(end, units[i].suffix) == 0;
        if (!same)
            continue;
        if (v > INT64_MAX / units[i].scale)
            return KOLO_EINVAL;
        *out = v * units[i].scale;
        return 0;
    }
    return KOLO_EINVAL;
}

int knobs_parse_duration(const char *s, int64_t *ms)
{
    /* Case matters: "m" is minutes and "ms" milliseconds, and "M" would
     * be ambiguous, so only lower case is accepted. */
    static const struct unit units[] = {
        {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60 * 1000}, {"h", 60 * 60 * 1000},
    };
    int64_t v;
    if (parse_scaled(s, &v, units, sizeof units / sizeof units[0], false))
        return KOLO_EINVAL;
    *ms = v;
    return 0;
}

int knobs_parse_size(const char *s, int64_t *bytes)
{
    /* Powers of 1024 whatever the spelling: people write 16M, 16MB and
     * 16MiB and mean the same buffer. */
    static const struct unit units[] = {
        {"", 1},           {"b", 1},           {"k", 1ll << 10},
        {"kb", 1ll << 10}, {"kib", 1ll << 10}, {"m", 1ll << 20},
        {"mb", 1ll << 20}, {"mib", 1ll << 20}, {"g", 1ll << 30},
        {"gb", 1ll << 30}, {"gib", 1ll << 30}, {"t", 1ll << 40},
        {"tb", 1ll << 40}, {"tib", 1ll << 40},
    };
    int64_t v;
    if (parse_scaled(s, &v, units, sizeof units / sizeof units[0], true))
        return KOLO_EINVAL;
    *bytes = v;
    return 0;
}

/* parse_seconds reads a KNOB_SECONDS value: a plain number of seconds,
 * as Horovod's timeouts are written, or a duration with a unit. */
static int parse_seconds(const char *s, int64_t *ms)
{
    int64_t v;
    const char *end;
    int digits = s ? parse_digits(s, &v, &end) : 0;
    if (digits > 0 && *end == '\0') {
        if (v > INT64_MAX / 1000)
            return KOLO_EINVAL;
        *ms = v * 1000;
        return 0;
    }
    return knobs_parse_duration(s, ms);
}

/* format_duration writes ms in the largest unit that holds it exactly, in
 * a form knobs_parse_duration reads back. */
static void format_duration(char *out, size_t size, int64_t ms)
{
    if (ms != 0 && ms % (60 * 60 * 1000) == 0)
        snprintf(out, size, "%lldh", (long long)(ms / (60 * 60 * 1000)));
    else if (ms != 0 && ms % (60 * 1000) == 0)
        snprintf(out, size, "%lldm", (long long)(ms / (60 * 1000)));
    else if (ms != 0 && ms % 1000 == 0)
        snprintf(out, size, "%llds", (long long)(ms / 1000));
    else if (ms != 0)
        snprintf(out, size, "%lldms", (long long)ms);
    else
        snprintf(out, size, "0");
}

static void format_size(char *out, size_t size, int64_t bytes)
{
    static const struct {
        char suffix;
        int shift;
    } units[] = {{'T', 40}, {'G', 30}, {'M', 20}, {'k', 10}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        int64_t scale = (int64_t)1 << units[i].shift;
        if (bytes != 0 && bytes % scale == 0) {
            snprintf(out, size, "%lld%c", (long long)(bytes / scale), units[i].suffix);
            return;
        }
    }
    snprintf(out, size, "%lld", (long long)bytes);
}

/* format_number writes v the way a knob of this type is written. */
static void format_number(char *out, size_t size, enum knob_type type, int64_t v)
{
    if (type == KNOB_DURATION || type == KNOB_SECONDS)
        format_duration(out, size, v);
    else if (type == KNOB_SIZE)
        format_size(out, size, v);
    else
        snprintf(out, size, "%lld", (long long)v);
}

/* ------------------------------------------------------------ setting one */

static bool knob_has_range(const struct knob *k)
{
    return (k->type == KNOB_INT || k->type == KNOB_DURATION || k->type == KNOB_SECONDS ||
            k->type == KNOB_SIZE) &&
           k->min <= k->max;
}

/* knob_set parses text as k's value and stores it. source is recorded in
 * k->source; where says, for error messages, exactly where text came from
 * ("flag -np", "env KOLO_NP", "config /etc/kolo.conf:3"). */
static int knob_set(struct knob *k, const char *text, const char *source, const char *where,
                    char *err, size_t errlen)
{
    int64_t v = 0;
    bool b = false;
    switch (k->type) {
    case KNOB_STR: {
        char *copy = strdup(text);
        if (!copy) {
            knobs_err(err, errlen, "%s: out of memory (from %s)", k->name, where);
            return KOLO_ENOMEM;
        }
        if (k->dst) {
            free(*(char **)k->dst);
            *(char **)k->dst = copy;
        } else {
            free(copy);
        }
        k->source = source;
        return 0;
    }
    case KNOB_BOOL:
        if (knobs_parse_bool(text, &b)) {
            knobs_err(err, errlen, "%s: '%s' is not a boolean (want true or false) (from %s)",
                      k->name, text, where);
            return KOLO_EINVAL;
        }
        if (k->dst)
            *(bool *)k->dst = b;
        k->source = source;
        return 0;
    case KNOB_INT:
        if (knobs_parse_int(text, &v)) {
            knobs_err(err, errlen, "%s: '%s' is not an integer (from %s)", k->name, text, where);
            return KOLO_EINVAL;
        }
        break;
    case KNOB_DURATION:
        if (knobs_parse_duration(text, &v)) {
            knobs_err(err, errlen,
                      "%s: '%s' is not a duration (want e.g. 250ms, 5s, 2m, 1h, or plain "
                      "milliseconds) (from %s)",
                      k->name, text, where);
            return KOLO_EINVAL;
        }
        break;
    case KNOB_SECONDS:
        if (parse_seconds(text, &v)) {
            knobs_err(err, errlen,
                      "%s: '%s' is not a duration (want seconds, or e.g. 250ms, 5s, 2m, 1h) "
                      "(from %s)",
                      k->name, text, where);
            return KOLO_EINVAL;
        }
        break;
    case KNOB_SIZE:
        if (knobs_parse_size(text, &v)) {
            knobs_err(err, errlen,
                      "%s: '%s' is not a size (want e.g. 65536, 64k, 16M, 1G) (from %s)", k->name,
                      text, where);
            return KOLO_EINVAL;
        }
        break;
    default:
        knobs_err(err, errlen, "%s: unknown knob type %d", k->name, (int)k->type);
        return KOLO_EINTERNAL;
    }
    if (knob_has_range(k) && (v < k->min || v > k->max)) {
        char lo[32], hi[32];
        format_number(lo, sizeof lo, k->type, k->min);
        format_number(hi, sizeof hi, k->type, k->max);
        knobs_err(err, errlen, "%s: %s is out of range [%s, %s] (from %s)", k->name, text, lo, hi,
                  where);
        return KOLO_EINVAL;
    }
    if (k->dst)
        *(int64_t *)k->dst = v;
    k->source = source;
    return 0;
}

/* knob_env_name writes the environment variable for k into out, or returns
 * false when the knob has none. */
static bool knob_env_name(const struct knob *k, char *out, size_t size)
{
    if (k->flags & (KNOB_ACTION | KNOB_IGNORED))
        return false;
    if (k->env) {
        if (!*k->env)
            return false;
        str_copy(out, k->env, size);
        return true;
    }
    size_t n = 0;
    const char *prefix = "KOLO_";
    for (const char *p = prefix; *p && n + 1 < size; p++)
        out[n++] = *p;
    for (const char *p = k->name; *p && n + 1 < size; p++)
        out[n++] = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
    out[n] = '\0';
    return true;
}

/* ------------------------------------------------------------ config file */

/* config_unquote decodes a double-quoted value in place, starting at the
 * opening quote. It returns a pointer to what follows the closing quote,
 * or NULL if the quote is never closed or an escape is unknown. */
static char *config_unquote(char *s, char **value)
{
    char *in = s + 1, *out = s + 1;
    *value = out;
    while (*in && *in != '"') {
        if (*in != '\\') {
            *out++ = *in++;
            continue;
        }
        in++;
        switch (*in) {
        case '"':
            *out++ = '"';
            break;
        case '\\':
            *out++ = '\\';
            break;
        case 'n':
            *out++ = '\n';
            break;
        case 'r':
            *out++ = '\r';
            break;
        case 't':
            *out++ = '\t';
            break;
        default:
            return NULL;
        }
        in++;
    }
    if (*in != '"')
        return NULL;
    *out = '\0';
    return in + 1;
}

char *knobs_trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

static struct knob *knob_find(struct knob *tab, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(tab[i].name) == len && strncmp(tab[i].name, name, len) == 0)
            return &tab[i];
    return NULL;
}

/* alias_matches says whether k's alias list holds the spelling s[0..len). */
static bool alias_matches(const struct knob *k, const char *s, size_t len)
{
    for (const char *a = k->alias; a && *a;) {
        size_t alen = strcspn(a, " ");
        if (alen == len && strncmp(a, s, len) == 0)
            return true;
        a += alen;
        while (*a == ' ')
            a++;
    }
    return false;
}

struct knob *knobs_find(struct knob *tab, size_t n, const char *name)
{
    size_t len = strlen(name);
    char flag[128];
    snprintf(flag, sizeof flag, "--%s", name);
    for (size_t i = 0; i < n; i++) {
        if (tab[i].flags & KNOB_ACTION)
            continue;
        if (strcmp(tab[i].name, name) == 0 ||
            (len + 2 < sizeof flag && alias_matches(&tab[i], flag, len + 2)))
            return &tab[i];
    }
    return NULL;
}

int knobs_set(struct knob *k, const char *text, const char *where, char *err, size_t errlen)
{
    return knob_set(k, text, "config", where, err, errlen);
}

bool knobs_given(const struct knob *k)
{
    return k->source && strcmp(k->source, "default") != 0;
}

int knobs_read_text(const char *path, size_t max, const char *label, char **text, char *err,
                    size_t errlen)
{
    size_t len;
    int rc = read_file_all(path, text, &len, max);
    if (rc) {
        knobs_err(err, errlen, "%s %s: %s", label, path,
                  rc == KOLO_ENOTFOUND ? "no such file" : abi_strerror(rc));
        return rc;
    }
    if (memchr(*text, '\0', len)) {
        knobs_err(err, errlen, "%s %s: not a text file", label, path);
        free(*text);
        *text = NULL;
        return KOLO_EINVAL;
    }
    return 0;
}

static int knobs_load_config(struct knob *tab, size_t n, const char *path, char *err, size_t errlen)
{
    char *text;
    int rc = knobs_read_text(path, KNOBS_CONFIG_MAX, "config", &text, err, errlen);
    if (rc)
        return rc;
    char *line = text;
    for (int lineno = 1; line && *line; lineno++) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *next = nl ? nl + 1 : NULL;
        char *s = knobs_trim(line);
        line = next;
        if (*s == '\0' || *s == '#')
            continue;

        char where[64 + 4096];
        snprintf(where, sizeof where, "config %s:%d", path, lineno);
        char *eq = strchr(s, '=');
        if (!eq) {
            knobs_err(err, errlen, "%s: expected 'name = value'", where);
            rc = KOLO_EINVAL;
            break;
        }
        *eq = '\0';
        char *name = knobs_trim(s);
        char *value = knobs_trim(eq + 1);
        if (*value == '"') {
            char *after = config_unquote(value, &value);
            if (!after) {
                knobs_err(err, errlen, "%s: unterminated or invalid quoted value", where);
                rc = KOLO_EINVAL;
                break;
            }
            after = knobs_trim(after);
            if (*after && *after != '#') {
                knobs_err(err, errlen, "%s: unexpected text after quoted value", where);
                rc = KOLO_EINVAL;
                break;
            }
        } else {
            /* A '#' after whitespace starts a comment; one inside a word
             * (a URL fragment, say) does not. */
            for (char *c = value; *c; c++)
                if (*c == '#' && c > value && (c[-1] == ' ' || c[-1] == '\t')) {
                    *c = '\0';
                    break;
                }
            value = knobs_trim(value);
        }
        struct knob *k = knob_find(tab, n, name, strlen(name));
        if (!k || (k->flags & KNOB_ACTION)) {
            knobs_err(err, errlen, "%s: unknown knob '%s'", where, name);
            rc = KOLO_EINVAL;
            break;
        }
        rc = knob_set(k, value, "config", where, err, errlen);
        if (rc)
            break;
    }
    free(text);
    return rc;
}

/* ------------------------------------------------------------ command line */

/* edit_distance is the Levenshtein distance of a[0..la) and b[0..lb),
 * for names of at most 63 characters (longer ones count as far). */
static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb)
{
    size_t row[64];
    if (la >= 64 || lb >= 64)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

struct near {
    char spelling[128];
    size_t score; /* lower is nearer; SIZE_MAX: none yet */
};

/* near_consider weighs one spelling (with its dashes) against the unknown
 * flag: the edit distance of the names without dashes, where a spelling
 * the flag begins or is the beginning of wins ties, then flags that do
 * something over ignored ones. */
static void near_consider(struct near *best, const char *flag, size_t flen, const char *spelling,
                          size_t slen, bool ignored)
{
    const char *a = flag + strspn(flag, "-"), *b = spelling + strspn(spelling, "-");
    size_t la = flen - (size_t)(a - flag), lb = slen - (size_t)(b - spelling);
    size_t d = edit_distance(a, la, b, lb);
    size_t shorter = la < lb ? la : lb;
    /* one edit per three letters, or an abbreviation of three letters or
     * more ("--verb"), never all of the spelling changed: "-x" and "-q"
     * are near nothing, "-n" is near "-np" */
    bool prefix = shorter > 0 && strncmp(a, b, shorter) == 0;
    if (d == SIZE_MAX || d >= lb || shorter == 0 ||
        (d > 1 + shorter / 3 && !(prefix && shorter >= 3)))
        return;
    /* ties: the spelling with as many dashes as the user typed (-n: -np) */
    bool same_dashes = strspn(flag, "-") == strspn(spelling, "-");
    size_t score = d * 8 + (prefix ? 0 : 4) + (ignored ? 2 : 0) + (same_dashes ? 0 : 1);
    if (score < best->score && slen < sizeof best->spelling) {
        best->score = score;
        snprintf(best->spelling, sizeof best->spelling, "%.*s", (int)slen, spelling);
    }
}

/* unknown_flag writes the error of an unknown flag, naming the nearest
 * spelling the table (and the built-in flags) has, if one is near. */
static void unknown_flag(const struct knob *tab, size_t n, const char *flag, size_t flen, char *err,
                         size_t errlen)
{
    static const char *const builtin[] = {"--help", "--config", "--dump-config"};
    struct near best = {.score = SIZE_MAX};
    char name[128];
    for (size_t i = 0; i < n; i++) {
        bool ignored = (tab[i].flags & KNOB_IGNORED) != 0;
        snprintf(name, sizeof name, "--%s", tab[i].name);
        near_consider(&best, flag, flen, name, strlen(name), ignored);
        for (const char *a = tab[i].alias; a && *a;) {
            size_t alen = strcspn(a, " ");
            near_consider(&best, flag, flen, a, alen, ignored);
            a += alen;
            a += strspn(a, " ");
        }
    }
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        near_consider(&best, flag, flen, builtin[i], strlen(builtin[i]), false);
    if (best.score != SIZE_MAX)
        knobs_err(err, errlen, "unknown flag %.*s (did you mean %s?)", (int)flen, flag,
                  best.spelling);
    else
        knobs_err(err, errlen, "unknown flag %.*s", (int)flen, flag);
}

struct argv_scan {
    bool help;
    bool dump;
    const char *config; /* --config PATH, last one wins */
    struct knob *load;  /* the loader knob given as a flag, and its path */
    const char *load_path;
    int rest; /* index of the first argument not parsed */
};

/* knobs_scan_argv walks the flags. With apply false it only recognises
 * them (and the built-ins); with apply true it stores their values. */
static int knobs_scan_argv(struct knob *tab, size_t n, int argc, char **argv, bool apply,
                           struct argv_scan *scan, char *err, size_t errlen)
{
    memset(scan, 0, sizeof *scan);
    int i;
    for (i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        /* "-" alone is a conventional name for stdin, not a flag. */
        if (arg[0] != '-' || arg[1] == '\0')
            break;

        const char *eq = strchr(arg, '=');
        size_t flag_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const char *inline_value = eq ? eq + 1 : NULL;
        char where[160];
        snprintf(where, sizeof where, "flag %.*s", (int)flag_len, arg);

        if (flag_len == 6 && strncmp(arg, "--help", 6) == 0) {
            scan->help = true;
            i++;
            break;
        }
        if (flag_len == 13 && strncmp(arg, "--dump-config", 13) == 0) {
            scan->dump = true;
            continue;
        }
        if (flag_len == 8 && strncmp(arg, "--config", 8) == 0) {
            const char *path = inline_value;
            if (!path)
                path = i + 1 < argc ? argv[++i] : NULL;
            if (!path || !*path) {
                knobs_err(err, errlen, "flag --config needs a file name");
                return KOLO_EINVAL;
            }
            scan->config = path;
            continue;
        }

        /* A table entry: --name, a short alias, or --no-name for booleans. */
        struct knob *k = NULL;
        bool negated = false;
        if (arg[1] == '-')
            k = knob_find(tab, n, arg + 2, flag_len - 2);
        for (size_t j = 0; !k && j < n; j++)
            if (alias_matches(&tab[j], arg, flag_len))
                k = &tab[j];
        if (!k && flag_len > 5 && strncmp(arg, "--no-", 5) == 0) {
            k = knob_find(tab, n, arg + 5, flag_len - 5);
            if (k && k->type != KNOB_BOOL) {
                knobs_err(err, errlen, "flag %.*s: %s is not a boolean", (int)flag_len, arg,
                          k->name);
                return KOLO_EINVAL;
            }
            negated = k != NULL;
        }
        if (!k && flag_len == 2 && strncmp(arg, "-h", 2) == 0) {
            scan->help = true;
            i++;
            break;
        }
        if (!k) {
            unknown_flag(tab, n, arg, flag_len, err, errlen);
            return KOLO_EINVAL;
        }

        const char *value;
        if (k->type == KNOB_BOOL) {
            /* Booleans take no separate value, so "--verbose file" leaves
             * "file" as the first argument; "--verbose=false" is allowed. */
            if (negated && inline_value) {
                knobs_err(err, errlen, "flag %.*s takes no value", (int)flag_len, arg);
                return KOLO_EINVAL;
            }
            value = negated ? "false" : inline_value ? inline_value : "true";
        } else if (inline_value) {
            value = inline_value;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            knobs_err(err, errlen, "flag %.*s needs a value", (int)flag_len, arg);
            return KOLO_EINVAL;
        }
        if (k->loader) {
            scan->load = k;
            scan->load_path = value;
        }
        if (apply) {
            int rc = knob_set(k, value, "flag", where, err, errlen);
            if (rc)
                return rc;
        }
    }
    scan->rest = i < argc ? i : argc;
    return 0;
}

/* ------------------------------------------------------------ entry points */

/* knobs_run_loader finds the path of the table's loader knob (flag, then
 * its environment variable, then the config file) and runs the loader. */
static int knobs_run_loader(struct knob *tab, size_t n, const struct argv_scan *scan, char *err,
                            size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        struct knob *k = &tab[i];
        if (!k->loader || k->type != KNOB_STR)
            continue;
        const char *path = scan->load == k ? scan->load_path : NULL;
        char name[128];
        if (!path && knob_env_name(k, name, sizeof name)) {
            path = getenv(name);
            if (path && !*path)
                path = NULL;
        }
        if (!path && k->dst)
            path = *(char **)k->dst;
        if (path && *path)
            return k->loader(tab, n, path, err, errlen);
    }
    return 0;
}

int knobs_parse(struct knob *tab, size_t n, int argc, char **argv, int *rest, const char *usage,
                FILE *out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!out)
        out = stdout;

    /* Every string knob starts NULL before anything can fail, so that
     * knobs_free() is safe after an error. */
    for (size_t i = 0; i < n; i++)
        if (tab[i].type == KNOB_STR && tab[i].dst)
            *(char **)tab[i].dst = NULL;
    for (size_t i = 0; i < n; i++) {
        struct knob *k = &tab[i];
        k->source = "default";
        if (k->def) {
            if (knob_set(k, k->def, "default", "default", err, errlen))
                return KNOBS_ERROR;
        } else if (k->type == KNOB_BOOL && k->dst) {
            *(bool *)k->dst = false;
        } else if (k->type != KNOB_STR && k->dst) {
            *(int64_t *)k->dst = 0;
        }
    }

    struct argv_scan scan;
    if (knobs_scan_argv(tab, n, argc, argv, false, &scan, err, errlen))
        return KNOBS_ERROR;
    if (rest)
        *rest = scan.rest;
    if (scan.help) {
        knobs_print_help(out, usage, tab, n);
        return KNOBS_HELP;
    }

    const char *config = scan.config;
    if (!config) {
        config = getenv("KOLO_CONFIG");
        if (config && !*config)
            config = NULL;
    }
    if (config && knobs_load_config(tab, n, config, err, errlen))
        return KNOBS_ERROR;
    if (knobs_run_loader(tab, n, &scan, err, errlen))
        return KNOBS_ERROR;

    for (size_t i = 0; i < n; i++) {
        char name[128], where[160];
        if (!knob_env_name(&tab[i], name, sizeof name))
            continue;
        const char *value = getenv(name);
        if (!value || !*value)
            continue;
        snprintf(where, sizeof where, "env %s", name);
        if (knob_set(&tab[i], value, "env", where, err, errlen))
            return KNOBS_ERROR;
    }

    if (knobs_scan_argv(tab, n, argc, argv, true, &scan, err, errlen))
        return KNOBS_ERROR;

    if (scan.dump) {
        /* The usage line becomes a comment so the dump stays a valid
         * config file. */
        if (usage && *usage) {
            const char *p = usage;
            while (*p) {
                size_t len = strcspn(p, "\n");
                fprintf(out, "# %.*s\n", (int)len, p);
                p += len;
                if (*p == '\n')
                    p++;
            }
        }
        knobs_dump(out, tab, n);
        return KNOBS_DUMPED;
    }
    return KNOBS_OK;
}

static const char *knob_metavar(enum knob_type type)
{
    switch (type) {
    case KNOB_STR:
        return " <str>";
    case KNOB_INT:
        return " <int>";
    case KNOB_DURATION:
        return " <duration>";
    case KNOB_SECONDS:
        return " <seconds>";
    case KNOB_SIZE:
        return " <size>";
    default:
        return "";
    }
}

/* help_line prints one entry: the flag column padded to a fixed width
 * (the description starts on the next line if the flags are too wide),
 * then the description wrapped to fit 80 columns. */
static void help_line(FILE *out, const char *flags, const char *text)
{
    const int width = 30, columns = 80;
    int len = (int)strlen(flags);
    if (len < width - 1)
        fprintf(out, "  %-*s", width - 2, flags);
    else
        fprintf(out, "  %s\n%*s", flags, width, "");
    int col = width;
    bool first = true;
    for (const char *p = text; *p;) {
        while (*p == ' ')
            p++;
        int word = (int)strcspn(p, " ");
        if (word == 0)
            break;
        if (!first && col + 1 + word > columns) {
            fprintf(out, "\n%*s", width, "");
            col = width;
            first = true;
        }
        fprintf(out, "%s%.*s", first ? "" : " ", word, p);
        col += word + (first ? 0 : 1);
        first = false;
        p += word;
    }
    fputc('\n', out);
}

/* knob_flags writes a knob's spellings for --help: its aliases, then
 * --name, then the value it takes. */
static void knob_flags(char *out, size_t size, const struct knob *k, const char *metavar)
{
    size_t len = 0;
    out[0] = '\0';
    for (const char *a = k->alias; a && *a && len < size;) {
        size_t alen = strcspn(a, " ");
        len += (size_t)snprintf(out + len, size - len, "%.*s, ", (int)alen, a);
        a += alen;
        while (*a == ' ')
            a++;
    }
    if (len < size)
        snprintf(out + len, size - len, "--%s%s", k->name, metavar);
}

void knobs_print_help(FILE *out, const char *usage, const struct knob *tab, size_t n)
{
    if (usage && *usage)
        fprintf(out, "%s\n\n", usage);
    fprintf(out, "Options (a flag beats its environment variable, which beats the config "
                 "file,\nwhich beats the default):\n");
    bool ignored = false;
    for (size_t i = 0; i < n; i++) {
        const struct knob *k = &tab[i];
        char flags[256];
        if (k->flags & KNOB_IGNORED) {
            ignored = true;
            continue;
        }
        knob_flags(flags, sizeof flags, k, k->type == KNOB_BOOL ? "" : knob_metavar(k->type));
        if (k->flags & KNOB_ACTION) {
            help_line(out, flags, k->help ? k->help : "");
            continue;
        }

        /* Description, then what the user needs to set it elsewhere, in
         * parentheses: default, range, variable, whichever there are. */
        char text[1024];
        int len = snprintf(text, sizeof text, "%s", k->help ? k->help : "");
        const char *sep = " (";
        if (k->type == KNOB_BOOL) {
            bool on = false;
            if (k->def)
                knobs_parse_bool(k->def, &on);
            len +=
                snprintf(text + len, sizeof text - (size_t)len, "%sdefault %s, --no-%s sets false",
                         sep, on ? "true" : "false", k->name);
            sep = ", ";
        } else if (k->def) {
            len += snprintf(text + len, sizeof text - (size_t)len, "%sdefault %s", sep,
                            *k->def ? k->def : "\"\"");
            sep = ", ";
        }
        if (knob_has_range(k)) {
            char lo[32], hi[32];
            format_number(lo, sizeof lo, k->type, k->min);
            format_number(hi, sizeof hi, k->type, k->max);
            len += snprintf(text + len, sizeof text - (size_t)len, "%srange %s..%s", sep, lo, hi);
            sep = ", ";
        }
        char env[128];
        if (knob_env_name(k, env, sizeof env) && (size_t)len < sizeof text) {
            len += snprintf(text + len, sizeof text - (size_t)len, "%senv %s", sep, env);
            sep = ", ";
        }
        if (sep[0] == ',' && (size_t)len < sizeof text)
            snprintf(text + len, sizeof text - (size_t)len, ")");
        help_line(out, flags, text);
    }
    help_line(out, "--config <path>", "read settings from a config file (env KOLO_CONFIG)");
    help_line(out, "--dump-config", "print the effective settings as a config file and exit");
    help_line(out, "-h, --help", "print this help and exit");
    if (!ignored)
        return;
    fprintf(out, "\nAccepted for compatibility and ignored:\n");
    for (size_t i = 0; i < n; i++) {
        const struct knob *k = &tab[i];
        if (!(k->flags & KNOB_IGNORED))
            continue;
        char flags[256];
        knob_flags(flags, sizeof flags, k, k->type == KNOB_BOOL ? "" : " <value>");
        help_line(out, flags, k->help ? k->help : "");
    }
}

/* dump_string writes s as a config value, quoted only when reading it back
 * unquoted would change it. */
static void dump_string(FILE *out, const char *s)
{
    size_t len = strlen(s);
    bool quote = len == 0 || s[0] == ' ' || s[0] == '\t' || s[len - 1] == ' ' ||
                 s[len - 1] == '\t' || s[0] == '"';
    for (const char *p = s; *p && !quote; p++)
        if (*p == '#' || *p == '\\' || *p == '\n' || *p == '\r')
            quote = true;
    if (!quote) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (const char *p = s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", out);
            break;
        case '\\':
            fputs("\\\\", out);
            break;
        case '\n':
            fputs("\\n", out);
            break;
        case '\r':
            fputs("\\r", out);
            break;
        case '\t':
            fputs("\\t", out);
            break;
        default:
            fputc(*p, out);
        }
    }
    fputc('"', out);
}

void knobs_dump(FILE *out, const struct knob *tab, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct knob *k = &tab[i];
        if (k->flags & (KNOB_ACTION | KNOB_IGNORED))
            continue;
        if (k->loader && k->dst) {
            /* Its settings are among the values below already; naming it
             * again would apply them over the flags that beat them. */
            const char *path = *(char *const *)k->dst;
            fprintf(out, "# %s = ", k->name);
            if (path)
                dump_string(out, path);
            fputs(path ? " (applied: its settings are in this dump)\n" : "(unset)\n", out);
            continue;
        }
        if (k->help && *k->help)
            fprintf(out, "# %s%s%s%s\n", k->help, k->source ? " [" : "", k->source ? k->source : "",
                    k->source ? "]" : "");
        if (!k->dst) {
            fprintf(out, "# %s = (no storage)\n", k->name);
            continue;
        }
        if (k->type != KNOB_STR && !k->def && !knobs_given(k)) {
            /* A number or switch without a default that nothing set: as
             * for strings, reading the dump back must leave it unset. */
            fprintf(out, "# %s = (unset)\n", k->name);
            continue;
        }
        char num[32];
        switch (k->type) {
        case KNOB_STR: {
            const char *s = *(char *const *)k->dst;
            if (!s) {
                /* Commented out, so reading the dump back leaves it unset. */
                fprintf(out, "# %s = (unset)\n", k->name);
                continue;
            }
            fprintf(out, "%s = ", k->name);
            dump_string(out, s);
            fputc('\n', out);
            break;
        }
        case KNOB_BOOL:
            fprintf(out, "%s = %s\n", k->name, *(const bool *)k->dst ? "true" : "false");
            break;
        default:
            format_number(num, sizeof num, k->type, *(const int64_t *)k->dst);
            fprintf(out, "%s = %s\n", k->name, num);
            break;
        }
    }
}

void knobs_free(struct knob *tab, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (tab[i].type == KNOB_STR && tab[i].dst) {
            free(*(char **)tab[i].dst);
            *(char **)tab[i].dst = NULL;
        }
    }
}
