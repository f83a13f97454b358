/*
 * test_shm_names.c - shared-memory segment names and the agent's sweep:
 * a segment whose creator died goes, one whose creator runs stays, other
 * jobs' segments and other files are never touched.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "errors.h"
#include "shm_names.h"
#include "test.h"

static bool exists(const char *name)
{
    char path[300];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

static void make(const char *name)
{
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    close(fd);
}

int main(void)
{
    /* a job number no real run here uses */
    const uint64_t job = 900000000000ull + (uint64_t)getpid();
    char mine[128], theirs[128], dead[128], other_job[128];
    REQUIRE(shm_names_make(job, 3, mine, sizeof mine) == 0);
    char want[64];
    snprintf(want, sizeof want, "/kolo-%llu-3-%d-", (unsigned long long)job, (int)getpid());
    CHECK(strncmp(mine, want, strlen(want)) == 0);
    CHECK_EQ_INT((int)strlen(mine), (int)strlen(want) + 16);
    REQUIRE(shm_names_make(job, 3, theirs, sizeof theirs) == 0);
    CHECK(strcmp(mine, theirs) != 0); /* the random part */
    char tiny[8];
    CHECK_EQ_INT(shm_names_make(job, 3, tiny, sizeof tiny), KOLO_EINVAL);

    /* a name the members derive from the generation's key: the same for
     * the same key, job, generation and creator; another for any other */
    const unsigned char key[32] = {1, 2, 3}, other_key[32] = {1, 2, 4};
    char d1[128], d2[128];
    REQUIRE(shm_names_derive(job, 5, 4242, "h", key, sizeof key, d1, sizeof d1) == 0);
    REQUIRE(shm_names_derive(job, 5, 4242, "h", key, sizeof key, d2, sizeof d2) == 0);
    CHECK_EQ_STR(d1, d2);
    snprintf(want, sizeof want, "/kolo-%llu-5-4242-", (unsigned long long)job);
    CHECK(strncmp(d1, want, strlen(want)) == 0);
    CHECK_EQ_INT((int)strlen(d1), (int)strlen(want) + 16);
    REQUIRE(shm_names_derive(job, 5, 4242, "h", other_key, sizeof key, d2, sizeof d2) == 0);
    CHECK(strcmp(d1, d2) != 0);
    REQUIRE(shm_names_derive(job, 6, 4242, "h", key, sizeof key, d2, sizeof d2) == 0);
    CHECK(strcmp(d1, d2) != 0);
    REQUIRE(shm_names_derive(job, 5, 4243, "h", key, sizeof key, d2, sizeof d2) == 0);
    CHECK(strcmp(d1, d2) != 0);
    REQUIRE(shm_names_derive(job, 5, 4242, "h2", key, sizeof key, d2, sizeof d2) == 0);
    CHECK(strcmp(d1, d2) != 0); /* another host of the same process */
    CHECK_EQ_INT(shm_names_derive(job, 5, 4242, "h", key, 0, d2, sizeof d2), KOLO_EINVAL);
    CHECK_EQ_INT(shm_names_derive(job, 5, 4242, NULL, key, sizeof key, d2, sizeof d2), KOLO_EINVAL);
    CHECK_EQ_INT(shm_names_derive(job, 5, 4242, "h", key, sizeof key, tiny, sizeof tiny), KOLO_EINVAL);

    /* a creator that has exited (a reaped child's pid) */
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0)
        _exit(0);
    REQUIRE(waitpid(child, NULL, 0) == child);
    snprintf(dead, sizeof dead, "/kolo-%llu-4-%d-00112233deadbeef", (unsigned long long)job,
             (int)child);
    snprintf(other_job, sizeof other_job, "/kolo-%llu-4-%d-00112233deadbeef",
             (unsigned long long)job + 1, (int)child);
    make(mine);
    make(dead);
    make(other_job);
    CHECK_EQ_INT(shm_names_sweep(job), 1);
    CHECK(exists(mine));       /* its creator (us) runs */
    CHECK(!exists(dead));      /* nobody will unlink it */
    CHECK(exists(other_job));  /* another job's */
    CHECK_EQ_INT(shm_names_sweep(job), 0);
    CHECK_EQ_INT(shm_names_sweep(job + 1), 1);
    shm_unlink(mine);
    CHECK(!exists(other_job));
    TEST_DONE();
}
