/*
 * knobs.h - one table of settings per binary.
 *
 * A knob has a name ("listen"), a type, a default, a range and a help
 * line. The same table parses, in increasing priority: the default, a
 * config file (`name = value` lines, '#' comments; given by --config PATH
 * or KOLO_CONFIG), the environment (KOLO_<NAME>, upper case, '-' -> '_',
 * unless the knob names another variable or none), and command-line flags
 * (--name value, --name=value, and aliases such as -np). Boolean flags
 * take no value (--verbose) and accept --no-name. --help prints the table;
 * --dump-config prints every knob's effective value in config-file form,
 * so `kolo X --dump-config > f; kolo X --config f` is a no-op.
 *
 * Two kinds of knob are not settings: an action (--version) is a flag
 * only, and an ignored knob is accepted so that command lines written for
 * another tool (horovodrun) still parse; --help lists those apart with the
 * reason, and neither is dumped. A knob may also name a file in another
 * format (horovodrun's YAML): its loader runs right after the config file
 * and sets other knobs with knobs_set(), at the config file's priority.
 *
 * Parsing stops at the first argument that is not a flag, or after "--";
 * that index is returned so subcommands can take the rest as argv.
 */
#ifndef KOLO_COMMON_KNOBS_H
#define KOLO_COMMON_KNOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum knob_type {
    KNOB_STR,      /* char *  (heap copy, freed by knobs_free) */
    KNOB_INT,      /* int64_t */
    KNOB_BOOL,     /* bool */
    KNOB_DURATION, /* int64_t milliseconds; accepts 250ms, 5s, 2m, 1h, plain = ms */
    KNOB_SECONDS,  /* KNOB_DURATION, but a plain number is seconds (Horovod's timeouts) */
    KNOB_SIZE,     /* int64_t bytes; accepts 64, 4k, 16M, 1G (powers of 1024) */
};

/* Bits of knob.flags. */
enum {
    KNOB_ACTION = 1 << 0,  /* a request such as --version: flag only, never dumped */
    KNOB_IGNORED = 1 << 1, /* accepted and ignored; help holds the reason */
};

struct knob;
/* A loader reads the file a knob names and sets other knobs with
 * knobs_find() and knobs_set(); 0, or an error with a message in err. */
typedef int (*knob_loader)(struct knob *tab, size_t n, const char *path, char *err, size_t errlen);

struct knob {
    const char *name;  /* flag --name, config key name */
    const char *alias; /* other spellings separated by spaces, e.g. "-np --num-proc"; or NULL */
    const char *env;   /* NULL: KOLO_<NAME>; "" : no environment variable */
    enum knob_type type;
    const char *def;  /* default as text; NULL = unset (STR only) */
    int64_t min, max; /* range for INT/DURATION/SIZE; min > max means unbounded */
    const char *help;
    void *dst; /* char **, int64_t *, or bool * by type; NULL: parsed, not kept */
    /* set by knobs_parse: where the value came from */
    const char *source; /* "default", "config", "env", "flag" */
    /* optional, after source so that older tables still initialise in order */
    unsigned flags;     /* KNOB_ACTION, KNOB_IGNORED */
    knob_loader loader; /* KNOB_STR naming a file of further settings; one per table */
};

enum knobs_result {
    KNOBS_OK = 0,
    KNOBS_HELP = -1,   /* --help was given and printed */
    KNOBS_DUMPED = -2, /* --dump-config was given and printed */
    KNOBS_ERROR = -3,  /* err holds a message naming the knob */
};

/*
 * knobs_parse fills every knob's dst from the sources above. argv[0] is
 * skipped. On success *rest is the index of the first unparsed argument
 * (argc if none; the "--" itself is skipped). Help and dump output go to
 * out with usage as the first line.
 */
int knobs_parse(struct knob *tab, size_t n, int argc, char **argv, int *rest, const char *usage,
                FILE *out, char *err, size_t errlen);
void knobs_print_help(FILE *out, const char *usage, const struct knob *tab, size_t n);
void knobs_dump(FILE *out, const struct knob *tab, size_t n);
/* knobs_free releases the strings of KNOB_STR knobs. */
void knobs_free(struct knob *tab, size_t n);

/*
 * knobs_find returns the knob called name, or whose alias list holds
 * --name, for a loader to set; NULL if none (actions are never found).
 */
struct knob *knobs_find(struct knob *tab, size_t n, const char *name);

/*
 * knobs_set parses text as k's value with the config file's priority;
 * where names the place for error messages ("config-file f.yaml:3").
 * 0, or KOLO_EINVAL with a message naming the knob in err.
 */
int knobs_set(struct knob *k, const char *text, const char *where, char *err, size_t errlen);

/* knobs_given says whether k was set by anything but its default. */
bool knobs_given(const struct knob *k);

/* knobs_trim strips spaces, tabs (and a trailing CR) in place. */
char *knobs_trim(char *s);

/* knobs_read_text reads a settings file of at most max bytes into *text
 * (NUL-terminated, caller frees), refusing binary files; errors name the
 * file after label ("config", "config-file"). */
int knobs_read_text(const char *path, size_t max, const char *label, char **text, char *err,
                    size_t errlen);

/* Parsers shared with other code (HTTP params, job specs, libkolo's
 * settings). 0 on success. An integer is exactly a decimal number (no
 * blanks, no trailing text); a boolean is true/false, 1/0, yes/no, on/off
 * in any case. */
int knobs_parse_duration(const char *s, int64_t *ms);
int knobs_parse_size(const char *s, int64_t *bytes);
int knobs_parse_int(const char *s, int64_t *v);
int knobs_parse_bool(const char *s, bool *v);

#endif
