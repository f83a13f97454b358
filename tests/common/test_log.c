/*
 * test_log.c - levels, the environment, the line format on stderr, sinks,
 * and that concurrent lines never interleave.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "test.h"

/* level_in_child returns what log_get_level() says in a fresh process
 * with KOLO_LOG_LEVEL=env (NULL: unset) and the given default. The
 * environment is read once per process, so each case needs its own. */
static int level_in_child(const char *env, int def)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (env)
            setenv("KOLO_LOG_LEVEL", env, 1);
        else
            unsetenv("KOLO_LOG_LEVEL");
        if (def >= 0)
            log_set_default(def);
        int level = log_get_level();
        /* Read once: changing the variable later changes nothing. */
        setenv("KOLO_LOG_LEVEL", "trace", 1);
        _exit(log_get_level() == level ? level : 100);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

struct captured {
    int count;
    int level;
    char module[32];
    char msg[4096];
};

static void capture_sink(int level, const char *module, const char *msg, void *arg)
{
    struct captured *c = arg;
    c->count++;
    c->level = level;
    snprintf(c->module, sizeof c->module, "%s", module);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
}

/* with_stderr_to_file runs fn with stderr pointing at a temp file and
 * returns the file's contents (caller frees). */
static char *with_stderr_to_file(void (*fn)(void))
{
    char path[] = "/tmp/kolo-test-log-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)size + 1);
    REQUIRE(text);
    REQUIRE(pread(fd, text, (size_t)size, 0) == size);
    close(fd);
    return text;
}

static void write_two_lines(void)
{
    log_msg(LOG_INFO, "store", "opened %s with %d tables", "db", 3);
    LOGW("coord", "lease expired\n"); /* trailing newline is not doubled */
    LOGD("coord", "below the level, never printed");
}

#define THREADS          8
#define LINES_PER_THREAD 200

static void *spam(void *arg)
{
    char big[1500];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    for (int i = 0; i < LINES_PER_THREAD; i++)
        log_msg(LOG_ERROR, "spam", "t%ld i%d %s end", (long)(size_t)arg, i, big);
    return NULL;
}

static void write_concurrently(void)
{
    pthread_t t[THREADS];
    for (size_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, spam, (void *)i);
    for (size_t i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
}

int main(void)
{
    /* Parsing and names. */
    CHECK_EQ_INT(log_parse_level("trace"), LOG_TRACE);
    CHECK_EQ_INT(log_parse_level("INFO"), LOG_INFO);
    CHECK_EQ_INT(log_parse_level("Warn"), LOG_WARN);
    CHECK_EQ_INT(log_parse_level("warning"), LOG_WARN);
    CHECK_EQ_INT(log_parse_level("FATAL"), LOG_ERROR); /* Horovod's top level */
    CHECK_EQ_INT(log_parse_level("error"), LOG_ERROR);
    CHECK_EQ_INT(log_parse_level("off"), LOG_OFF);
    CHECK_EQ_INT(log_parse_level("2"), LOG_INFO);
    CHECK_EQ_INT(log_parse_level("0"), LOG_TRACE);
    CHECK_EQ_INT(log_parse_level("5"), LOG_OFF);
    CHECK_EQ_INT(log_parse_level("6"), -1);
    CHECK_EQ_INT(log_parse_level("22"), -1);
    CHECK_EQ_INT(log_parse_level("loud"), -1);
    CHECK_EQ_INT(log_parse_level(""), -1);
    CHECK_EQ_INT(log_parse_level(NULL), -1);
    CHECK_EQ_STR(log_level_name(LOG_DEBUG), "debug");
    CHECK_EQ_STR(log_level_name(LOG_OFF), "off");
    CHECK_EQ_STR(log_level_name(42), "?");

    /* Resolution: default, environment, explicit level. */
    CHECK_EQ_INT(level_in_child(NULL, -1), LOG_OFF); /* a library is silent */
    CHECK_EQ_INT(level_in_child(NULL, LOG_INFO), LOG_INFO);
    CHECK_EQ_INT(level_in_child("debug", LOG_INFO), LOG_DEBUG);
    CHECK_EQ_INT(level_in_child("ERROR", -1), LOG_ERROR);
    CHECK_EQ_INT(level_in_child("bogus", LOG_WARN), LOG_WARN);

    unsetenv("KOLO_LOG_LEVEL");
    log_set_default(LOG_INFO);
    CHECK_EQ_INT(log_get_level(), LOG_INFO);
    CHECK(log_enabled(LOG_WARN));
    CHECK(!log_enabled(LOG_DEBUG));
    log_set_level(LOG_TRACE);
    log_set_default(LOG_ERROR); /* an explicit level wins over the default */
    CHECK_EQ_INT(log_get_level(), LOG_TRACE);
    log_set_level(LOG_INFO);

    /* The line on stderr: timestamp, level, module, message, one newline. */
    char *text = with_stderr_to_file(write_two_lines);
    char *nl = strchr(text, '\n');
    REQUIRE(nl);
    *nl = '\0';
    int y, mo, d, h, mi, s, ms;
    char z;
    CHECK_EQ_INT(sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h, &mi, &s, &ms, &z),
                 8);
    CHECK(z == 'Z');
    CHECK(y >= 2024);
    CHECK(strlen(text) > 25);
    if (strlen(text) > 25)
        CHECK_EQ_STR(text + 25, "INFO  store: opened db with 3 tables");
    char *second = nl + 1;
    nl = strchr(second, '\n');
    REQUIRE(nl);
    CHECK(nl[1] == '\0'); /* exactly two lines, the debug one filtered */
    *nl = '\0';
    if (strlen(second) > 25)
        CHECK_EQ_STR(second + 25, "WARN  coord: lease expired");
    free(text);

    /* Concurrent lines stay whole. */
    text = with_stderr_to_file(write_concurrently);
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        lines++;
        CHECK(strstr(line, "ERROR spam: t") != NULL);
        size_t len = strlen(line);
        CHECK(len > 4 && strcmp(line + len - 4, " end") == 0);
        CHECK(strchr(line + 25, 'Z') == NULL); /* no second timestamp inside */
    }
    CHECK_EQ_INT(lines, THREADS * LINES_PER_THREAD);
    free(text);

    /* A sink gets level, module and the bare message, filtered by level. */
    struct captured c = {0};
    log_set_sink(capture_sink, &c);
    log_msg(LOG_WARN, "agent", "worker %d exited\n", 3);
    CHECK_EQ_INT(c.count, 1);
    CHECK_EQ_INT(c.level, LOG_WARN);
    CHECK_EQ_STR(c.module, "agent");
    CHECK_EQ_STR(c.msg, "worker 3 exited");
    LOGD("agent", "filtered");
    log_msg(LOG_DEBUG, "agent", "filtered too");
    CHECK_EQ_INT(c.count, 1);
    log_msg(LOG_ERROR, NULL, "no module");
    CHECK_EQ_STR(c.module, "-");

    /* Long messages arrive whole. */
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    log_msg(LOG_ERROR, "big", "%s!", big);
    CHECK_EQ_INT(strlen(c.msg), sizeof big);
    CHECK(c.msg[sizeof big - 1] == '!');

    /* Off silences everything; removing the sink stops calls to it. */
    log_set_level(LOG_OFF);
    log_msg(LOG_ERROR, "agent", "silenced");
    CHECK_EQ_INT(c.count, 3); /* warn, no-module, big */
    log_set_level(LOG_INFO);
    log_set_sink(NULL, NULL);
    text = with_stderr_to_file(write_two_lines);
    CHECK(strstr(text, "opened db") != NULL);
    free(text);
    CHECK_EQ_INT(c.count, 3);
    TEST_DONE();
}
