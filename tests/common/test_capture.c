/*
 * test_capture.c - capture_run: output collected, exit codes and signals
 * named, a helper that hangs or floods killed with its whole process
 * group, a program that does not exist, stdin from /dev/null.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "errors.h"
#include "test.h"
#include "util.h"

static int run_sh(const char *script, uint64_t timeout_ms, size_t max_out, char **out,
                  char *err, size_t errlen)
{
    char *argv[] = {"sh", "-c", (char *)script, NULL};
    return capture_run(argv, "the script", timeout_ms, max_out, out, err, errlen);
}

static void test_output_and_codes(void)
{
    char err[256] = "", *out = NULL;
    CHECK_EQ_INT(run_sh("printf 'a\\nb:2\\n'; echo to-stderr >&2", 5000, 1024, &out, err,
                        sizeof err), 0);
    CHECK_EQ_STR(out, "a\nb:2\n");
    free(out);

    out = (char *)1;
    CHECK_EQ_INT(run_sh("true", 5000, 1024, &out, err, sizeof err), 0);
    CHECK_EQ_STR(out, ""); /* printed nothing: an empty string, not NULL */
    free(out);

    /* stdin is /dev/null: cat ends at once instead of waiting on ours */
    CHECK_EQ_INT(run_sh("cat; echo done", 5000, 1024, &out, err, sizeof err), 0);
    CHECK_EQ_STR(out, "done\n");
    free(out);

    CHECK_EQ_INT(run_sh("echo partial; exit 3", 5000, 1024, &out, err, sizeof err), KOLO_EIO);
    CHECK(out == NULL);
    CHECK_EQ_STR(err, "the script exited with code 3");

    CHECK_EQ_INT(run_sh("kill -9 $$", 5000, 1024, &out, err, sizeof err), KOLO_EIO);
    CHECK_EQ_STR(err, "the script was killed by signal 9");

    char *missing[] = {"kolo-no-such-program-here", NULL};
    int rc = capture_run(missing, "the helper", 5000, 1024, &out, err, sizeof err);
    CHECK(rc == KOLO_ESYS || rc == KOLO_EIO); /* spawn error, or exec failed in the child */
    CHECK(strstr(err, "the helper") != NULL);
    CHECK(out == NULL);
}

/* A helper that hangs, with a grandchild holding the pipe open: the
 * deadline holds and the whole group goes. */
static void test_deadline_kills_the_group(void)
{
    char err[256] = "", *out = NULL, pidfile[] = "/tmp/kolo-test-capture-XXXXXX";
    int fd = mkstemp(pidfile);
    REQUIRE(fd >= 0);
    close(fd);
    char script[512];
    snprintf(script, sizeof script, "sleep 30 & echo $! > %s; wait", pidfile);
    uint64_t t0 = now_mono_ms();
    CHECK_EQ_INT(run_sh(script, 300, 1024, &out, err, sizeof err), KOLO_EIO);
    uint64_t took = now_mono_ms() - t0;
    CHECK(took >= 290 && took < 3000);
    CHECK_EQ_STR(err, "the script ran over 0.3 s");
    char *text = NULL;
    size_t len = 0;
    REQUIRE(read_file_all(pidfile, &text, &len, 64) == 0);
    pid_t grandchild = (pid_t)atoi(text);
    free(text);
    unlink(pidfile);
    REQUIRE(grandchild > 0);
    /* killed with the group (a zombie until init reaps it: poll a moment) */
    bool gone = false;
    for (int i = 0; i < 100 && !gone; i++) {
        char path[64], *stat = NULL;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)grandchild);
        if (read_file_all(path, &stat, &len, 4096) != 0)
            gone = true;
        else {
            char *state = strrchr(stat, ')');
            gone = state && state[1] == ' ' && state[2] == 'Z';
            free(stat);
        }
        if (!gone)
            usleep(10 * 1000);
    }
    CHECK(gone);
}

/* A helper that closes its output and goes on running is still bounded
 * by the deadline. */
static void test_deadline_after_output(void)
{
    char err[256] = "", *out = NULL;
    uint64_t t0 = now_mono_ms();
    CHECK_EQ_INT(run_sh("echo early; exec >&-; sleep 30", 300, 1024, &out, err, sizeof err),
                 KOLO_EIO);
    CHECK(now_mono_ms() - t0 < 3000);
    CHECK_EQ_STR(err, "the script ran over 0.3 s");
    CHECK(out == NULL);
}

static void test_output_cap(void)
{
    char err[256] = "", *out = NULL;
    uint64_t t0 = now_mono_ms();
    CHECK_EQ_INT(run_sh("yes kolo", 10000, 64 * 1024, &out, err, sizeof err), KOLO_EIO);
    CHECK(now_mono_ms() - t0 < 5000);
    CHECK_EQ_STR(err, "the script printed over 65536 bytes");
    CHECK(out == NULL);
    /* exactly at the cap is fine */
    CHECK_EQ_INT(run_sh("head -c 1024 /dev/zero | tr '\\0' x", 5000, 1024, &out, err,
                        sizeof err), 0);
    CHECK(out && strlen(out) == 1024);
    free(out);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    test_output_and_codes();
    test_deadline_kills_the_group();
    test_deadline_after_output();
    test_output_cap();
    TEST_DONE();
}
