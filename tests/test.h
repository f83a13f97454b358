/*
 * test.h - the assertions every kolo C test uses. A failed check prints
 * where and what, and the test exits 1 at the end (or at once for REQUIRE).
 */
#ifndef KOLO_TESTS_TEST_H
#define KOLO_TESTS_TEST_H

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static int test_failures;

/*
 * The hang guard's witness. ctest kills a test that runs past its TIMEOUT
 * and shows nothing of where it hung. A test started with
 * KOLO_TEST_WATCHDOG_S=N (tests/CMakeLists.txt sets it a little below
 * each test's TIMEOUT) prints every thread's stack (gdb, when installed)
 * once it has run N seconds, then aborts: the log then says which wait
 * never ended. An alarm, not a thread: tests fork, and a process that
 * forks must stay single-threaded for ThreadSanitizer. Neither children
 * nor the programs a test starts inherit it (fork clears the alarm, and
 * the variable is taken out of the environment).
 */
static char test_watchdog_pid[16];
static char *test_watchdog_argv[12];

static void test_watchdog_fired(int sig)
{
    (void)sig;
    static const char msg[] = "test watchdog: still running past its limit; every thread's "
                              "stack follows, then abort\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    pid_t child = test_watchdog_argv[0] ? fork() : -1;
    if (child == 0) {
        dup2(2, 1);
        execv(test_watchdog_argv[0], test_watchdog_argv);
        _exit(127);
    }
    if (child > 0)
        waitpid(child, NULL, 0);
    abort();
}

__attribute__((constructor)) static void test_watchdog_start(void)
{
    const char *env = getenv("KOLO_TEST_WATCHDOG_S");
    long secs = env ? atol(env) : 0;
    unsetenv("KOLO_TEST_WATCHDOG_S");
    if (secs <= 0)
        return;
    snprintf(test_watchdog_pid, sizeof test_watchdog_pid, "%d", (int)getpid());
    if (access("/usr/bin/timeout", X_OK) == 0 && access("/usr/bin/gdb", X_OK) == 0) {
        char **a = test_watchdog_argv;
        int i = 0;
        a[i++] = (char *)"/usr/bin/timeout";
        a[i++] = (char *)"60";
        a[i++] = (char *)"/usr/bin/gdb";
        a[i++] = (char *)"-p";
        a[i++] = test_watchdog_pid;
        a[i++] = (char *)"-batch";
        a[i++] = (char *)"-nx";
        a[i++] = (char *)"-ex";
        a[i++] = (char *)"thread apply all bt";
        a[i] = NULL;
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    }
    signal(SIGALRM, test_watchdog_fired);
    alarm((unsigned)secs);
}

/* Removes a test's SQLite database with its -wal and -shm files, then its
 * folder (empty by then). */
static inline void test_remove_db(const char *db_path, const char *dir)
{
    const char *suffixes[] = {"", "-wal", "-shm", ".dashboard"};
    for (int i = 0; i < 4; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s%s", db_path, suffixes[i]);
        unlink(path);
    }
    /* the coordinator's own timelines (coordinator/coord_timeline.c) */
    char tl[512];
    snprintf(tl, sizeof tl, "%s.timelines", db_path);
    DIR *d = opendir(tl);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", tl, e->d_name);
        if (e->d_name[0] != '.')
            unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(tl);
    rmdir(dir);
}

/* How many threads of this process are named `name` (/proc/self/task/N/comm). */
static inline int test_threads_named_now(const char *name)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        n += strcmp(comm, name) == 0;
    }
    if (d)
        closedir(d);
    return n;
}

/* test_threads_named_now, after waiting up to 2 s for at least one: a
 * thread names itself when it starts, a moment after its creator returns. */
static inline int test_threads_named(const char *name)
{
    for (int i = 0; i < 200 && test_threads_named_now(name) == 0; i++)
        usleep(10000);
    return test_threads_named_now(name);
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond);             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        if (va_ != vb_) {                                                                          \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s == %lld, %s == %lld\n", __FILE__,      \
                    __LINE__, #a, va_, #b, vb_);                                                   \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *sa_ = (a), *sb_ = (b);                                                         \
        if (!sa_ || !sb_ || strcmp(sa_, sb_) != 0) {                                               \
            fprintf(stderr, "%s:%d: CHECK_EQ_STR failed: %s == \"%s\", %s == \"%s\"\n", __FILE__,  \
                    __LINE__, #a, sa_ ? sa_ : "(null)", #b, sb_ ? sb_ : "(null)");                 \
            test_failures++;                                                                       \
        }                                                                                          \
    } while (0)

#define TEST_DONE()                                                                                \
    do {                                                                                           \
        if (test_failures) {                                                                       \
            fprintf(stderr, "%d check(s) failed\n", test_failures);                                \
            return 1;                                                                              \
        }                                                                                          \
        printf("ok\n");                                                                            \
        return 0;                                                                                  \
    } while (0)

#endif
