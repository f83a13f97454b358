/*
 * test_knobs.c - the knob table: every source and their priority, value
 * syntax, range errors, flag forms, --help and a --dump-config round trip.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "knobs.h"
#include "test.h"

/* The settings of an imaginary daemon. */
struct settings {
    char *listen;
    char *state;
    int64_t np;
    int64_t lease_ms;
    int64_t buf_bytes;
    bool verbose;
    bool color;
    int64_t quiet_level;
};

static struct settings cfg;

#define NKNOBS 8

static void make_table(struct knob *tab)
{
    struct knob t[NKNOBS] = {
        {"listen", NULL, NULL, KNOB_STR, "tcp://127.0.0.1:7070", 0, -1, "RPC listen address",
         &cfg.listen},
        {"state-dir", NULL, NULL, KNOB_STR, NULL, 0, -1, "where state lives", &cfg.state},
        {"num-proc", "-np", NULL, KNOB_INT, "1", 1, 1024, "number of processes", &cfg.np},
        {"lease", NULL, NULL, KNOB_DURATION, "5s", 100, 3600000, "lease length", &cfg.lease_ms},
        {"fusion-buffer", NULL, "FUSION_BYTES", KNOB_SIZE, "64M", 0, -1, "fusion buffer size",
         &cfg.buf_bytes},
        {"verbose", "-v", NULL, KNOB_BOOL, "false", 0, -1, "log more", &cfg.verbose},
        {"color", NULL, "", KNOB_BOOL, "true", 0, -1, "colored output", &cfg.color},
        {"quiet-level", NULL, NULL, KNOB_INT, "-3", -10, 10, "how quiet", &cfg.quiet_level},
    };
    memcpy(tab, t, sizeof t);
}

static void clear_env(void)
{
    unsetenv("KOLO_LISTEN");
    unsetenv("KOLO_STATE_DIR");
    unsetenv("KOLO_NUM_PROC");
    unsetenv("KOLO_LEASE");
    unsetenv("FUSION_BYTES");
    unsetenv("KOLO_FUSION_BUFFER");
    unsetenv("KOLO_VERBOSE");
    unsetenv("KOLO_COLOR");
    unsetenv("KOLO_CONFIG");
}

static struct knob tab[NKNOBS];
static char err[512];
static int rest;

/* parse runs knobs_parse over a NULL-terminated argument list (argv[0]
 * is added), on a fresh table. */
static int parse_out(FILE *out, const char *first, ...)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = "prog";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    knobs_free(tab, NKNOBS);
    make_table(tab);
    err[0] = '\0';
    rest = -1;
    return knobs_parse(tab, NKNOBS, argc, argv, &rest, "usage: prog [options] cmd", out, err,
                       sizeof err);
}

#define parse(...) parse_out(stdout, __VA_ARGS__, (const char *)NULL)

static struct knob *find(const char *name)
{
    for (int i = 0; i < NKNOBS; i++)
        if (strcmp(tab[i].name, name) == 0)
            return &tab[i];
    return NULL;
}

static char tmpdir[] = "/tmp/kolo-test-knobs-XXXXXX";

static void write_config(const char *name, const char *text, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

static void test_value_parsers(void)
{
    int64_t v;
    CHECK(knobs_parse_duration("250ms", &v) == 0 && v == 250);
    CHECK(knobs_parse_duration("5s", &v) == 0 && v == 5000);
    CHECK(knobs_parse_duration("2m", &v) == 0 && v == 120000);
    CHECK(knobs_parse_duration("1h", &v) == 0 && v == 3600000);
    CHECK(knobs_parse_duration("1500", &v) == 0 && v == 1500);
    CHECK(knobs_parse_duration("0", &v) == 0 && v == 0);
    CHECK(knobs_parse_duration("", &v) != 0);
    CHECK(knobs_parse_duration("s", &v) != 0);
    CHECK(knobs_parse_duration("-5s", &v) != 0);
    CHECK(knobs_parse_duration("5 s", &v) != 0);
    CHECK(knobs_parse_duration("5x", &v) != 0);
    CHECK(knobs_parse_duration("1.5s", &v) != 0);
    CHECK(knobs_parse_duration("5S", &v) != 0);
    CHECK(knobs_parse_duration("99999999999999999999", &v) != 0);
    CHECK(knobs_parse_duration("9999999999999999h", &v) != 0); /* overflows int64 ms */

    CHECK(knobs_parse_size("64", &v) == 0 && v == 64);
    CHECK(knobs_parse_size("4k", &v) == 0 && v == 4096);
    CHECK(knobs_parse_size("4K", &v) == 0 && v == 4096);
    CHECK(knobs_parse_size("16M", &v) == 0 && v == 16 << 20);
    CHECK(knobs_parse_size("16MiB", &v) == 0 && v == 16 << 20);
    CHECK(knobs_parse_size("1G", &v) == 0 && v == 1 << 30);
    CHECK(knobs_parse_size("2t", &v) == 0 && v == 2ll << 40);
    CHECK(knobs_parse_size("", &v) != 0);
    CHECK(knobs_parse_size("k", &v) != 0);
    CHECK(knobs_parse_size("-1", &v) != 0);
    CHECK(knobs_parse_size("4q", &v) != 0);
    CHECK(knobs_parse_size("99999999999T", &v) != 0);
}

static void test_defaults_and_flags(void)
{
    CHECK_EQ_INT(parse(NULL), KNOBS_OK);
    CHECK_EQ_STR(err, "");
    CHECK_EQ_INT(rest, 1);
    CHECK_EQ_STR(cfg.listen, "tcp://127.0.0.1:7070");
    CHECK(cfg.state == NULL);
    CHECK_EQ_INT(cfg.np, 1);
    CHECK_EQ_INT(cfg.lease_ms, 5000);
    CHECK_EQ_INT(cfg.buf_bytes, 64 << 20);
    CHECK(!cfg.verbose);
    CHECK(cfg.color);
    CHECK_EQ_INT(cfg.quiet_level, -3);
    CHECK_EQ_STR(find("lease")->source, "default");

    /* Every flag form, and parsing stops at the first non-flag. */
    CHECK_EQ_INT(parse("--listen", "tcp://0.0.0.0:1", "-np", "8", "--lease=250ms", "-v",
                       "--no-color", "--fusion-buffer", "4k", "--quiet-level", "-5", "run",
                       "--listen", "x"),
                 KNOBS_OK);
    CHECK_EQ_STR(err, "");
    CHECK_EQ_INT(rest, 12);
    CHECK_EQ_STR(cfg.listen, "tcp://0.0.0.0:1");
    CHECK_EQ_INT(cfg.np, 8);
    CHECK_EQ_INT(cfg.lease_ms, 250);
    CHECK(cfg.verbose);
    CHECK(!cfg.color);
    CHECK_EQ_INT(cfg.buf_bytes, 4096);
    CHECK_EQ_INT(cfg.quiet_level, -5);
    CHECK_EQ_STR(find("num-proc")->source, "flag");
    CHECK_EQ_STR(find("state-dir")->source, "default");

    CHECK_EQ_INT(parse("--verbose=false", "-np=3", "--num-proc", "4", "--verbose", "--no-verbose"),
                 KNOBS_OK);
    CHECK(!cfg.verbose);
    CHECK_EQ_INT(cfg.np, 4); /* last one wins */
    CHECK_EQ_INT(rest, 7);

    /* "--" ends the flags and is skipped; "-" is an argument. */
    CHECK_EQ_INT(parse("-v", "--", "--listen", "x"), KNOBS_OK);
    CHECK_EQ_INT(rest, 3);
    CHECK_EQ_STR(cfg.listen, "tcp://127.0.0.1:7070");
    CHECK_EQ_INT(parse("-"), KNOBS_OK);
    CHECK_EQ_INT(rest, 1);
    CHECK_EQ_INT(parse("-v", "--"), KNOBS_OK);
    CHECK_EQ_INT(rest, 3);
    /* A boolean takes no separate value. */
    CHECK_EQ_INT(parse("--verbose", "false"), KNOBS_OK);
    CHECK(cfg.verbose);
    CHECK_EQ_INT(rest, 2);
    /* An empty string is a value. */
    CHECK_EQ_INT(parse("--state-dir="), KNOBS_OK);
    CHECK_EQ_STR(cfg.state, "");
}

static void test_errors(void)
{
    CHECK_EQ_INT(parse("--bogus"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag --bogus");
    CHECK_EQ_INT(parse("--bogus=3"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag --bogus");
    CHECK_EQ_INT(parse("-q"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag -q");
    CHECK_EQ_INT(parse("-listen", "x"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag -listen (did you mean --listen?)");
    /* the nearest spelling is suggested: a typo, an abbreviation, a
     * short flag missing a letter; nothing when nothing is near */
    CHECK_EQ_INT(parse("--lisen", "x"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag --lisen (did you mean --listen?)");
    CHECK_EQ_INT(parse("--verb"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag --verb (did you mean --verbose?)");
    CHECK_EQ_INT(parse("-n", "2"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag -n (did you mean -np?)");
    CHECK_EQ_INT(parse("--dump-confg"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag --dump-confg (did you mean --dump-config?)");
    CHECK_EQ_INT(parse("--zzzzzz"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag --zzzzzz");
    CHECK_EQ_INT(parse("--x", "--help"), KNOBS_ERROR);

    CHECK_EQ_INT(parse("--listen"), KNOBS_ERROR);
    CHECK(strstr(err, "--listen needs a value") != NULL);
    CHECK_EQ_INT(parse("--no-listen"), KNOBS_ERROR);
    CHECK(strstr(err, "not a boolean") != NULL);
    CHECK_EQ_INT(parse("--no-verbose=1"), KNOBS_ERROR);
    CHECK(strstr(err, "takes no value") != NULL);

    CHECK_EQ_INT(parse("-np", "0"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "num-proc: 0 is out of range [1, 1024] (from flag -np)");
    CHECK_EQ_INT(parse("--num-proc=2000"), KNOBS_ERROR);
    CHECK(strstr(err, "num-proc") && strstr(err, "out of range"));
    CHECK_EQ_INT(parse("-np", "abc"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "num-proc: 'abc' is not an integer (from flag -np)");
    CHECK_EQ_INT(parse("-np", "12abc"), KNOBS_ERROR);
    CHECK_EQ_INT(parse("-np", " 12"), KNOBS_ERROR);
    CHECK_EQ_INT(parse("--lease", "50ms"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "lease: 50ms is out of range [100ms, 1h] (from flag --lease)");
    CHECK_EQ_INT(parse("--lease", "soon"), KNOBS_ERROR);
    CHECK(strstr(err, "lease: 'soon' is not a duration") != NULL);
    CHECK_EQ_INT(parse("--fusion-buffer", "lots"), KNOBS_ERROR);
    CHECK(strstr(err, "fusion-buffer: 'lots' is not a size") != NULL);
    CHECK_EQ_INT(parse("--verbose=maybe"), KNOBS_ERROR);
    CHECK(strstr(err, "verbose: 'maybe' is not a boolean") != NULL);

    setenv("KOLO_NUM_PROC", "0", 1);
    CHECK_EQ_INT(parse(NULL), KNOBS_ERROR);
    CHECK_EQ_STR(err, "num-proc: 0 is out of range [1, 1024] (from env KOLO_NUM_PROC)");
    /* ...but a valid flag does not rescue an invalid environment: the
     * operator should hear about it. */
    CHECK_EQ_INT(parse("-np", "3"), KNOBS_ERROR);
    clear_env();
}

static void test_env_and_config(void)
{
    char path[256], path2[256];
    write_config("a.conf",
                 "# a comment\n"
                 "\n"
                 "  listen = tcp://10.0.0.1:9   # trailing comment\n"
                 "num-proc=16\r\n"
                 "lease = 2m\n"
                 "fusion-buffer = 1G\n"
                 "verbose = yes\n"
                 "state-dir = \"/var/lib/kolo state # not a comment\"\n",
                 path, sizeof path);

    /* Config file given by flag. */
    CHECK_EQ_INT(parse("--config", path), KNOBS_OK);
    CHECK_EQ_STR(err, "");
    CHECK_EQ_STR(cfg.listen, "tcp://10.0.0.1:9");
    CHECK_EQ_INT(cfg.np, 16);
    CHECK_EQ_INT(cfg.lease_ms, 120000);
    CHECK_EQ_INT(cfg.buf_bytes, 1 << 30);
    CHECK(cfg.verbose);
    CHECK_EQ_STR(cfg.state, "/var/lib/kolo state # not a comment");
    CHECK_EQ_STR(find("listen")->source, "config");
    CHECK_EQ_STR(find("quiet-level")->source, "default");

    /* ...or by KOLO_CONFIG; environment beats config, flags beat both. */
    setenv("KOLO_CONFIG", path, 1);
    setenv("KOLO_NUM_PROC", "32", 1);
    setenv("KOLO_LEASE", "", 1); /* empty counts as unset */
    setenv("FUSION_BYTES", "2M", 1);
    setenv("KOLO_FUSION_BUFFER", "junk", 1); /* this knob names another variable */
    setenv("KOLO_COLOR", "junk", 1);         /* this knob has no variable */
    CHECK_EQ_INT(parse("-np", "64"), KNOBS_OK);
    CHECK_EQ_STR(err, "");
    CHECK_EQ_INT(cfg.np, 64);
    CHECK_EQ_STR(find("num-proc")->source, "flag");
    CHECK_EQ_INT(cfg.lease_ms, 120000);
    CHECK_EQ_STR(find("lease")->source, "config");
    CHECK_EQ_INT(cfg.buf_bytes, 2 << 20);
    CHECK_EQ_STR(find("fusion-buffer")->source, "env");
    CHECK(cfg.color);
    CHECK_EQ_INT(parse(NULL), KNOBS_OK);
    CHECK_EQ_INT(cfg.np, 32);
    CHECK_EQ_STR(find("num-proc")->source, "env");

    /* --config beats KOLO_CONFIG. */
    write_config("b.conf", "num-proc = 2\n", path2, sizeof path2);
    unsetenv("KOLO_NUM_PROC");
    CHECK_EQ_INT(parse("--config=", "x"), KNOBS_ERROR);
    CHECK_EQ_INT(parse("--config", path2), KNOBS_OK);
    CHECK_EQ_INT(cfg.np, 2);
    CHECK_EQ_STR(cfg.listen, "tcp://127.0.0.1:7070");
    clear_env();

    /* Config errors name the file and line. */
    write_config("bad1.conf", "# ok\nnum-proc = 4\nbogus = 1\n", path, sizeof path);
    CHECK_EQ_INT(parse("--config", path), KNOBS_ERROR);
    CHECK(strstr(err, "bad1.conf:3: unknown knob 'bogus'") != NULL);
    write_config("bad2.conf", "num-proc 4\n", path, sizeof path);
    CHECK_EQ_INT(parse("--config", path), KNOBS_ERROR);
    CHECK(strstr(err, "bad2.conf:1: expected 'name = value'") != NULL);
    write_config("bad3.conf", "\n\nnum-proc = 9999\n", path, sizeof path);
    CHECK_EQ_INT(parse("--config", path), KNOBS_ERROR);
    CHECK(strstr(err, "num-proc: 9999 is out of range") != NULL);
    CHECK(strstr(err, "bad3.conf:3") != NULL);
    write_config("bad4.conf", "listen = \"unterminated\n", path, sizeof path);
    CHECK_EQ_INT(parse("--config", path), KNOBS_ERROR);
    CHECK(strstr(err, "bad4.conf:1") != NULL);
    snprintf(path, sizeof path, "%s/missing.conf", tmpdir);
    CHECK_EQ_INT(parse("--config", path), KNOBS_ERROR);
    CHECK(strstr(err, "missing.conf") != NULL);
    /* An unknown flag is reported before the config file is even read. */
    CHECK_EQ_INT(parse("--config", path, "--bogus"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "unknown flag --bogus");
}

/* ------------------------------------------------------------ extras */

/* A second imaginary program, shaped like kolo run: several spellings,
 * Horovod-style seconds, an action, an ignored flag and a loader. */
struct extras {
    int64_t np, timeout_ms;
    char *hosts, *settings;
    bool version, verbose;
};
static struct extras ex;
static int loader_calls;
static char loader_path[256];

#define NEXTRAS 7

/* extras_loader reads "name value" lines and sets knobs through the
 * public calls, as a foreign-format loader does. */
static int extras_loader(struct knob *t, size_t n, const char *path, char *err, size_t errlen)
{
    loader_calls++;
    snprintf(loader_path, sizeof loader_path, "%s", path);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "settings %s: cannot open", path);
        return 1;
    }
    char name[64], value[64];
    int rc = 0;
    while (rc == 0 && fscanf(f, "%63s %63s", name, value) == 2) {
        struct knob *k = knobs_find(t, n, name);
        if (!k) {
            snprintf(err, errlen, "settings %s: unknown '%s'", path, name);
            rc = 1;
        } else {
            rc = knobs_set(k, value, "settings file", err, errlen);
        }
    }
    fclose(f);
    return rc;
}

static struct knob xtab[NEXTRAS];

static int parse_extras(FILE *out, const char *first, ...)
{
    const struct knob t[NEXTRAS] = {
        {"np", "-np --num-proc", "", KNOB_INT, "1", 1, 64, "processes", &ex.np},
        {"hosts", "-H", "", KNOB_STR, NULL, 0, -1, "hosts", &ex.hosts},
        {"timeout", NULL, "X_TIMEOUT", KNOB_SECONDS, "30s", 0, 3600000, "give up after",
         &ex.timeout_ms},
        {"verbose", NULL, "", KNOB_BOOL, "false", 0, -1, "log more", &ex.verbose},
        {"settings", NULL, "", KNOB_STR, NULL, 0, -1, "settings file", &ex.settings,
         .loader = extras_loader},
        {"version", "-v", "", KNOB_BOOL, NULL, 0, -1, "print the version", &ex.version,
         .flags = KNOB_ACTION},
        {"ssh-port", "-p", "", KNOB_STR, NULL, 1, 0, "no SSH here", NULL, .flags = KNOB_IGNORED},
    };
    char *argv[32];
    int argc = 0;
    argv[argc++] = "prog";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    knobs_free(xtab, NEXTRAS);
    memcpy(xtab, t, sizeof t);
    err[0] = '\0';
    loader_calls = 0;
    return knobs_parse(xtab, NEXTRAS, argc, argv, &rest, "usage: prog", out, err, sizeof err);
}

#define parse_x(...) parse_extras(stdout, __VA_ARGS__, (const char *)NULL)

static struct knob *xfind(const char *name)
{
    for (int i = 0; i < NEXTRAS; i++)
        if (strcmp(xtab[i].name, name) == 0)
            return &xtab[i];
    return NULL;
}

static void test_extras(void)
{
    /* Every spelling in an alias list, and --name. */
    CHECK_EQ_INT(parse_x("-np", "2"), KNOBS_OK);
    CHECK_EQ_INT(ex.np, 2);
    CHECK_EQ_INT(parse_x("--num-proc=3"), KNOBS_OK);
    CHECK_EQ_INT(ex.np, 3);
    CHECK_EQ_INT(parse_x("--np", "4", "-H", "a:1"), KNOBS_OK);
    CHECK_EQ_INT(ex.np, 4);
    CHECK_EQ_STR(ex.hosts, "a:1");
    CHECK(knobs_given(xfind("hosts")));
    CHECK(!knobs_given(xfind("verbose")));
    CHECK_EQ_INT(parse_x("-num-proc", "4"), KNOBS_ERROR);
    CHECK_EQ_INT(parse_x("--num"), KNOBS_ERROR);

    /* KNOB_SECONDS: a plain number is seconds; units still work. */
    CHECK_EQ_INT(parse_x(NULL), KNOBS_OK);
    CHECK_EQ_INT(ex.timeout_ms, 30000);
    CHECK_EQ_INT(parse_x("--timeout", "45"), KNOBS_OK);
    CHECK_EQ_INT(ex.timeout_ms, 45000);
    CHECK_EQ_INT(parse_x("--timeout", "1500ms"), KNOBS_OK);
    CHECK_EQ_INT(ex.timeout_ms, 1500);
    CHECK_EQ_INT(parse_x("--timeout", "2m"), KNOBS_OK);
    CHECK_EQ_INT(ex.timeout_ms, 120000);
    setenv("X_TIMEOUT", "7", 1);
    CHECK_EQ_INT(parse_x(NULL), KNOBS_OK);
    CHECK_EQ_INT(ex.timeout_ms, 7000);
    unsetenv("X_TIMEOUT");
    CHECK_EQ_INT(parse_x("--timeout", "soon"), KNOBS_ERROR);
    CHECK(strstr(err, "timeout: 'soon' is not a duration (want seconds") != NULL);
    CHECK_EQ_INT(parse_x("--timeout", "3601"), KNOBS_ERROR);
    CHECK_EQ_STR(err, "timeout: 3601 is out of range [0, 1h] (from flag --timeout)");
    CHECK_EQ_INT(parse_x("--timeout", "99999999999999999"), KNOBS_ERROR);

    /* An action is a flag only; an ignored knob parses and keeps nothing. */
    CHECK_EQ_INT(parse_x("-v"), KNOBS_OK);
    CHECK(ex.version);
    CHECK_EQ_INT(parse_x("-p", "22", "--ssh-port=23", "cmd"), KNOBS_OK);
    CHECK(knobs_given(xfind("ssh-port")));
    CHECK_EQ_INT(rest, 4);
    CHECK(knobs_find(xtab, NEXTRAS, "version") == NULL);
    CHECK(knobs_find(xtab, NEXTRAS, "num-proc") == xfind("np"));
    CHECK(knobs_find(xtab, NEXTRAS, "np") == xfind("np"));
    CHECK(knobs_find(xtab, NEXTRAS, "H") == NULL);
    char path[256];
    write_config("action.conf", "version = true\n", path, sizeof path);
    CHECK_EQ_INT(parse_x("--config", path), KNOBS_ERROR);
    CHECK(strstr(err, "unknown knob 'version'") != NULL);

    /* The loader runs once, between the config file and the flags. */
    char settings[256], conf[300];
    write_config("x.settings", "np 8\nverbose true\nnum-proc 9\n", settings, sizeof settings);
    CHECK_EQ_INT(parse_x("--settings", settings), KNOBS_OK);
    CHECK_EQ_INT(loader_calls, 1);
    CHECK_EQ_STR(loader_path, settings);
    CHECK_EQ_INT(ex.np, 9);
    CHECK(ex.verbose);
    CHECK_EQ_STR(xfind("np")->source, "config");
    CHECK_EQ_INT(parse_x("-np", "5", "--settings", settings), KNOBS_OK);
    CHECK_EQ_INT(ex.np, 5);
    CHECK_EQ_STR(xfind("np")->source, "flag");
    snprintf(conf, sizeof conf, "np = 2\nsettings = %s\n", settings);
    write_config("x.conf", conf, path, sizeof path);
    CHECK_EQ_INT(parse_x("--config", path), KNOBS_OK);
    CHECK_EQ_INT(loader_calls, 1);
    CHECK_EQ_INT(ex.np, 9); /* the loader's file beats the config file */
    write_config("bad.settings", "bogus 1\n", settings, sizeof settings);
    CHECK_EQ_INT(parse_x("--settings", settings), KNOBS_ERROR);
    CHECK(strstr(err, "unknown 'bogus'") != NULL);
    write_config("bad2.settings", "np 999\n", settings, sizeof settings);
    CHECK_EQ_INT(parse_x("--settings", settings), KNOBS_ERROR);
    CHECK_EQ_STR(err, "np: 999 is out of range [1, 64] (from settings file)");
    CHECK_EQ_INT(parse_x("--settings="), KNOBS_OK);
    CHECK_EQ_INT(loader_calls, 0);

    /* Help: spellings, the action without a default, ignored knobs apart.
     * Dump: neither actions nor ignored knobs, the loader commented out. */
    FILE *f = tmpfile();
    REQUIRE(f);
    CHECK_EQ_INT(parse_extras(f, "--help", (const char *)NULL), KNOBS_HELP);
    long size = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)size + 1);
    REQUIRE(text && fread(text, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    CHECK(strstr(text, "-np, --num-proc, --np <int>") != NULL);
    CHECK(strstr(text, "--timeout <seconds>") != NULL);
    CHECK(strstr(text, "-v, --version               print the version\n") != NULL);
    char *apart = strstr(text, "\nAccepted for compatibility and ignored:\n");
    CHECK(apart != NULL);
    CHECK(apart && strstr(apart, "-p, --ssh-port <value>      no SSH here\n") != NULL);
    CHECK(strstr(text, "\n  -H, --hosts <str>           hosts\n") != NULL);
    free(text);

    f = tmpfile();
    REQUIRE(f);
    write_config("y.settings", "verbose true\n", settings, sizeof settings);
    CHECK_EQ_INT(
        parse_extras(f, "--settings", settings, "-p", "22", "--dump-config", (const char *)NULL),
        KNOBS_DUMPED);
    size = ftell(f);
    rewind(f);
    text = calloc(1, (size_t)size + 1);
    REQUIRE(text && fread(text, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    CHECK(strstr(text, "version") == NULL);
    CHECK(strstr(text, "ssh-port") == NULL);
    CHECK(strstr(text, "\nverbose = true\n") != NULL);
    CHECK(strstr(text, "\n# settings = ") != NULL);
    CHECK(strstr(text, "\nsettings =") == NULL);
    free(text);
    knobs_free(xtab, NEXTRAS);
}

/* capture runs a parse whose output goes to a temp file and returns that
 * output (caller frees). */
static char *capture(int *rc, const char *a1, const char *a2, const char *a3, const char *a4)
{
    FILE *f = tmpfile();
    REQUIRE(f);
    *rc = parse_out(f, a1, a2, a3, a4, (const char *)NULL);
    long size = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)size + 1);
    REQUIRE(text);
    REQUIRE(fread(text, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    return text;
}

/* values_only drops comment lines, leaving what a config file sets. */
static void values_only(char *text)
{
    char *out = text;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) + 1 : strlen(line);
        if (line[0] != '#') {
            memmove(out, line, len);
            out += len;
        }
        line += len;
    }
    *out = '\0';
}

static void test_help_and_dump(void)
{
    int rc;
    char *help = capture(&rc, "-np", "4", "--help", "--bogus");
    CHECK_EQ_INT(rc, KNOBS_HELP);
    CHECK(strncmp(help, "usage: prog [options] cmd\n", 26) == 0);
    CHECK(strstr(help, "-np, --num-proc <int>") != NULL);
    /* Descriptions wrap at 80 columns under their own column. */
    CHECK(strstr(help, "number of processes (default 1, range 1..1024, env\n"
                       "                              KOLO_NUM_PROC)"));
    for (const char *l = help; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0'))
        CHECK(strcspn(l, "\n") <= 80);
    CHECK(strstr(help, "env FUSION_BYTES") != NULL);
    CHECK(strstr(help, "range 100ms..1h") != NULL);
    CHECK(strstr(help, "--no-verbose") != NULL);
    CHECK(strstr(help, "KOLO_COLOR") == NULL);
    CHECK(strstr(help, "--dump-config") != NULL);
    CHECK(strstr(help, "--config <path>") != NULL);
    free(help);
    help = capture(&rc, "-h", NULL, NULL, NULL);
    CHECK_EQ_INT(rc, KNOBS_HELP);
    free(help);

    /* Dump, then read the dump back: the same settings. Strings that need
     * quoting (spaces at the ends, '#', quotes, backslashes, newlines,
     * empty) survive. */
    char *dump = capture(&rc, "--listen", " a \"b\" # c\\d\ne ", "--dump-config", "--lease=90s");
    CHECK_EQ_INT(rc, KNOBS_DUMPED);
    CHECK(strncmp(dump, "# usage: prog [options] cmd\n", 28) == 0);
    CHECK(strstr(dump, "\nlease = 90s\n") != NULL);
    CHECK(strstr(dump, "\nfusion-buffer = 64M\n") != NULL);
    CHECK(strstr(dump, "\nnum-proc = 1\n") != NULL);
    CHECK(strstr(dump, "\ncolor = true\n") != NULL);
    CHECK(strstr(dump, "\nquiet-level = -3\n") != NULL);
    CHECK(strstr(dump, "# state-dir = (unset)\n") != NULL);
    CHECK(strstr(dump, "[flag]") != NULL);
    char path[256];
    write_config("dump.conf", dump, path, sizeof path);
    char *again = capture(&rc, "--config", path, "--dump-config", NULL);
    CHECK_EQ_INT(rc, KNOBS_DUMPED);
    CHECK_EQ_STR(cfg.listen, " a \"b\" # c\\d\ne ");
    CHECK(cfg.state == NULL);
    values_only(dump);
    values_only(again);
    CHECK_EQ_STR(again, dump);
    free(dump);
    free(again);

    dump = capture(&rc, "--state-dir=", "--dump-config", "-np", "7");
    CHECK(strstr(dump, "\nstate-dir = \"\"\n") != NULL);
    CHECK(strstr(dump, "\nnum-proc = 7\n") != NULL);
    write_config("dump2.conf", dump, path, sizeof path);
    CHECK_EQ_INT(parse("--config", path), KNOBS_OK);
    CHECK_EQ_STR(cfg.state, "");
    CHECK_EQ_INT(cfg.np, 7);
    free(dump);
}

int main(void)
{
    REQUIRE(mkdtemp(tmpdir) != NULL);
    clear_env();
    test_value_parsers();
    test_defaults_and_flags();
    test_errors();
    test_env_and_config();
    test_help_and_dump();
    test_extras();
    knobs_free(tab, NKNOBS);
    CHECK(cfg.listen == NULL && cfg.state == NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    CHECK_EQ_INT(system(cmd), 0);
    TEST_DONE();
}
