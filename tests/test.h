/*
 * test.h - the assertions every kolo C test uses. A failed check prints
 * where and what, and the test exits 1 at the end (or at once for REQUIRE).
 */
#ifndef KOLO_TESTS_TEST_H
#define KOLO_TESTS_TEST_H

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int test_failures;

/*
 * The hang guard's witness. ctest kills a test that runs past its TIMEOUT
 * and shows nothing of where it hung. A test started with
 * KOLO_TEST_WATCHDOG_S=N (tests/CMakeLists.txt sets it a little below
 * each test's TIMEOUT) prints every thread's stack (gdb, when installed)
 * once it has run N seconds, then aborts: the log then says which wait
 * never ended. Children the test starts do not inherit the variable.
 */
static void *test_watchdog_main(void *arg)
{
    unsigned secs = (unsigned)(uintptr_t)arg;
    struct timespec left = {(time_t)secs, 0};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    fprintf(stderr, "test watchdog: still running after %u s; every thread's stack follows, "
            "then abort\n", secs);
    char pid[16];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    pid_t child = fork();
    if (child == 0) {
        dup2(2, 1);
        execlp("timeout", "timeout", "60", "gdb", "-p", pid, "-batch", "-nx", "-ex",
               "thread apply all bt", (char *)NULL);
        _exit(127);
    }
    if (child > 0)
        waitpid(child, NULL, 0);
    abort();
    return NULL;
}

__attribute__((constructor)) static void test_watchdog_start(void)
{
    const char *env = getenv("KOLO_TEST_WATCHDOG_S");
    long secs = env ? atol(env) : 0;
    unsetenv("KOLO_TEST_WATCHDOG_S");
    pthread_attr_t attr;
    pthread_t t;
    if (secs <= 0 || pthread_attr_init(&attr) != 0)
        return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 << 10);
    if (pthread_create(&t, &attr, test_watchdog_main, (void *)(uintptr_t)secs) == 0)
        pthread_setname_np(t, "test-watchdog");
    pthread_attr_destroy(&attr);
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
