/*
 * test_settings.c - libkolo's knob table (worker/settings.h): parsing,
 * defaults, aliases and the refusal text of every type; docs/libkolo.md's
 * Environment section lists exactly the table's variables; no file of
 * worker/ reads the environment but settings.c.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "settings.h"
#include "test.h"
#include "util.h"

static void test_types(void)
{
    char err[256];
    unsetenv("KOLO_SPIN_US");
    CHECK(!settings_set(SET_SPIN_US));
    CHECK_EQ_INT(settings_int(SET_SPIN_US, 77), 77); /* no default: the caller's */
    CHECK_EQ_INT(settings_int(SET_RANK, 5), -1);       /* the table's default */
    setenv("KOLO_SPIN_US", "33", 1);
    CHECK_EQ_INT(settings_int(SET_SPIN_US, 77), 33);
    CHECK_EQ_INT(settings_check(err, sizeof err), 0);
    setenv("KOLO_SPIN_US", "fast", 1);
    CHECK_EQ_INT(settings_int(SET_SPIN_US, 77), 77); /* invalid reads as unset ... */
    CHECK_EQ_INT(settings_check(err, sizeof err), KOLO_EINVAL); /* ... and init refuses it */
    CHECK_EQ_STR(err, "KOLO_SPIN_US=fast: want an integer from 0 to 1000000");
    setenv("KOLO_SPIN_US", "2000000", 1);
    CHECK_EQ_INT(settings_check(err, sizeof err), KOLO_EINVAL);
    unsetenv("KOLO_SPIN_US");

    setenv("KOLO_DISABLE_SHM", "yes", 1);
    CHECK_EQ_INT(settings_int(SET_DISABLE_SHM, 0), 1);
    setenv("KOLO_DISABLE_SHM", "off", 1);
    CHECK_EQ_INT(settings_int(SET_DISABLE_SHM, 1), 0);
    setenv("KOLO_DISABLE_SHM", "maybe", 1);
    CHECK_EQ_INT(settings_check(err, sizeof err), KOLO_EINVAL);
    CHECK_EQ_STR(err, "KOLO_DISABLE_SHM=maybe: want 0 or 1");
    unsetenv("KOLO_DISABLE_SHM");

    /* sizes take units; the Horovod alias is read when the name is unset */
    unsetenv("KOLO_FUSION_THRESHOLD");
    setenv("HOROVOD_FUSION_THRESHOLD", "16M", 1);
    CHECK(settings_set(SET_FUSION_THRESHOLD));
    CHECK_EQ_INT(settings_int(SET_FUSION_THRESHOLD, 0), 16 << 20);
    setenv("KOLO_FUSION_THRESHOLD", "4096", 1); /* the name wins */
    CHECK_EQ_INT(settings_int(SET_FUSION_THRESHOLD, 0), 4096);
    unsetenv("KOLO_FUSION_THRESHOLD");
    setenv("HOROVOD_FUSION_THRESHOLD", "lots", 1);
    CHECK_EQ_INT(settings_check(err, sizeof err), KOLO_EINVAL);
    CHECK(strncmp(err, "HOROVOD_FUSION_THRESHOLD=lots: want a size", 42) == 0);
    unsetenv("HOROVOD_FUSION_THRESHOLD");
    setenv("KOLO_SNAPSHOT_CHUNK_BYTES", "64k", 1);
    CHECK_EQ_INT(settings_int(SET_SNAPSHOT_CHUNK_BYTES, 0), 65536);
    unsetenv("KOLO_SNAPSHOT_CHUNK_BYTES");
    CHECK_EQ_INT(settings_int(SET_SNAPSHOT_CHUNK_BYTES, 0), 768 << 10);

    /* choices */
    CHECK_EQ_STR(settings_str(SET_FAST_PATH), "auto");
    setenv("KOLO_FAST_PATH", "0", 1);
    CHECK_EQ_STR(settings_str(SET_FAST_PATH), "0");
    setenv("KOLO_FAST_PATH", "sometimes", 1);
    CHECK_EQ_INT(settings_check(err, sizeof err), KOLO_EINVAL);
    CHECK_EQ_STR(err, "KOLO_FAST_PATH=sometimes: want one of: auto 1 0");
    unsetenv("KOLO_FAST_PATH");
    setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "force", 1);
    CHECK_EQ_STR(settings_raw(SET_HIERARCHICAL_ALLREDUCE), "force");
    CHECK_EQ_INT(settings_check(err, sizeof err), 0);
    unsetenv("HOROVOD_HIERARCHICAL_ALLREDUCE");

    /* empty is unset */
    setenv("KOLO_RANK", "", 1);
    CHECK(!settings_set(SET_RANK));
    CHECK_EQ_INT(settings_check(err, sizeof err), 0);
    unsetenv("KOLO_RANK");
    /* text knobs take anything */
    setenv("KOLO_HOST_ID", "any text: at all", 1);
    CHECK_EQ_STR(settings_str(SET_HOST_ID), "any text: at all");
    CHECK_EQ_INT(settings_check(err, sizeof err), 0);
    unsetenv("KOLO_HOST_ID");
}

/* Appends to names every KOLO_/HOROVOD_ word of text. */
static int words_of(const char *text, char names[][64], int max)
{
    int n = 0;
    for (const char *p = text; *p && n < max; p++) {
        if ((strncmp(p, "KOLO_", 5) && strncmp(p, "HOROVOD_", 8)) ||
            (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_')))
            continue;
        size_t len = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
        if (len >= 64)
            continue;
        memcpy(names[n], p, len);
        names[n][len] = '\0';
        n++;
        p += len - 1;
    }
    return n;
}

static bool in_table(const char *name)
{
    for (int s = 0; s < SET_COUNT; s++)
        if (!strcmp(settings_table[s].env, name) ||
            (settings_table[s].alias && !strcmp(settings_table[s].alias, name)))
            return true;
    return false;
}

static void test_docs_list_the_table(void)
{
    char *doc = NULL;
    size_t len = 0;
    REQUIRE(read_file_all(KOLO_SOURCE_DIR "/docs/libkolo.md", &doc, &len, 1 << 20) == 0);
    char *start = strstr(doc, "\n## Environment\n");
    REQUIRE(start);
    char *end = strstr(start + 1, "\n## ");
    REQUIRE(end);
    *end = '\0';
    static char names[512][64];
    int n = words_of(start, names, 512);
    for (int i = 0; i < n; i++)
        if (!in_table(names[i]) && strcmp(names[i], "KOLO_ETIMEDOUT") != 0) {
            fprintf(stderr, "docs/libkolo.md names %s, which worker/settings.h lacks\n",
                    names[i]);
            test_failures++;
        }
    for (int s = 0; s < SET_COUNT; s++) {
        const char *want[] = {settings_table[s].env, settings_table[s].alias};
        for (int w = 0; w < 2; w++) {
            bool found = false;
            for (int i = 0; i < n && want[w] && !found; i++)
                found = !strcmp(names[i], want[w]);
            if (want[w] && !found) {
                fprintf(stderr, "%s is in worker/settings.h but not in docs/libkolo.md\n",
                        want[w]);
                test_failures++;
            }
        }
    }
    free(doc);
}

/* Every .c of worker/ (its root and each layer's folder) reads the
 * environment only through settings.h. */
static int no_getenv_in(const char *folder)
{
    char dir[512];
    snprintf(dir, sizeof dir, KOLO_SOURCE_DIR "/worker%s%s", folder[0] ? "/" : "", folder);
    DIR *d = opendir(dir);
    REQUIRE(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 3 || strcmp(e->d_name + l - 2, ".c") || !strcmp(e->d_name, "settings.c"))
            continue;
        char path[768], *text = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        REQUIRE(read_file_all(path, &text, &len, 4 << 20) == 0);
        files++;
        if (strstr(text, "getenv(")) {
            fprintf(stderr, "%s calls getenv: declare the knob in settings.h\n", path);
            test_failures++;
        }
        free(text);
    }
    closedir(d);
    return files;
}

static void test_only_settings_reads_the_environment(void)
{
    static const char *const folders[] = {"", "runtime", "coll", "transport", "gpu"};
    int files = 0;
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++)
        files += no_getenv_in(folders[i]);
    CHECK(files > 10);
}

int main(void)
{
    test_types();
    test_docs_list_the_table();
    test_only_settings_reads_the_environment();
    TEST_DONE();
}
