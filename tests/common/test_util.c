/*
 * test_util.c - clocks, randomness, file reading, token files, loopback
 * detection, mkdir_p and str_copy.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "test.h"
#include "util.h"

static char tmpdir[] = "/tmp/kolo-test-util-XXXXXX";

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    REQUIRE(fchmod(fd, mode) == 0);
    close(fd);
}

static void test_clocks_and_random(void)
{
    uint64_t a = now_mono_ms();
    usleep(20 * 1000);
    uint64_t b = now_mono_ms();
    CHECK(b >= a + 15);
    CHECK(now_wall_ms() > 1700000000000ull); /* after Nov 2023 */

    /* the coarse clock is the same clock, never ahead and only a few ms
     * behind; mono_ts_us turns a read into a deadline without a read */
    for (int i = 0; i < 1000; i++) {
        uint64_t coarse = now_mono_ms_coarse(), fine = now_mono_ms();
        CHECK(coarse <= fine && fine - coarse <= 20);
    }
    struct timespec ts;
    mono_ts_us(&ts, 5000001234567ull);
    CHECK(ts.tv_sec == 5000001 && ts.tv_nsec == 234567000L);
    mono_deadline_us(&ts, 2000000);
    uint64_t at_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    CHECK(at_us >= now_mono_us() + 1900000 && at_us <= now_mono_us() + 2000000);

    /* deadline_left: what remains, capped; 0 once passed */
    uint64_t now = now_mono_ms();
    CHECK(deadline_left(now + 10000, 500) == 500);
    uint64_t left = deadline_left(now + 10000, 0);
    CHECK(left > 9000 && left <= 10000);
    CHECK(deadline_left(now > 5 ? now - 5 : 0, 500) == 0);
    CHECK(deadline_left(0, 0) == 0);

    unsigned char x[32] = {0}, y[32] = {0};
    CHECK_EQ_INT(random_bytes(x, sizeof x), 0);
    CHECK_EQ_INT(random_bytes(y, sizeof y), 0);
    CHECK(memcmp(x, y, sizeof x) != 0);
    CHECK_EQ_INT(random_bytes(x, 0), 0);

    char hex[2 * 100 + 1];
    memset(hex, '!', sizeof hex);
    CHECK_EQ_INT(random_hex(hex, 100), 0);
    CHECK_EQ_INT(strlen(hex), 200);
    CHECK(strspn(hex, "0123456789abcdef") == 200);
    CHECK_EQ_INT(random_hex(hex, 0), 0);
    CHECK_EQ_STR(hex, "");
}

static void test_read_files(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/data", tmpdir);
    write_file(path, "hello\nworld", 0644);
    char *data = NULL;
    size_t len = 0;
    CHECK_EQ_INT(read_file_all(path, &data, &len, 1024), 0);
    CHECK_EQ_INT(len, 11);
    CHECK_EQ_STR(data, "hello\nworld");
    free(data);
    CHECK_EQ_INT(read_file_all(path, &data, &len, 10), KOLO_ETOOBIG);
    CHECK(data == NULL);
    CHECK_EQ_INT(read_file_all(path, &data, &len, 11), 0);
    free(data);
    snprintf(path, sizeof path, "%s/missing", tmpdir);
    CHECK_EQ_INT(read_file_all(path, &data, &len, 10), KOLO_ENOTFOUND);
    /* Files whose size the kernel does not report still read whole. */
    CHECK_EQ_INT(read_file_all("/proc/self/status", &data, &len, 1 << 20), 0);
    CHECK(len > 0 && strstr(data, "Pid:") != NULL);
    free(data);
}

static void test_token_file(void)
{
    char path[256], err[512];
    char *token = NULL;
    snprintf(path, sizeof path, "%s/token", tmpdir);

    write_file(path, "  0123456789abcdef-secret \n", 0600);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), 0);
    CHECK_EQ_STR(token, "0123456789abcdef-secret");
    free(token);

    /* Exactly 16 bytes is enough; 15 is not. */
    write_file(path, "0123456789abcdef\n", 0400);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), 0);
    CHECK_EQ_STR(token, "0123456789abcdef");
    free(token);
    write_file(path, "0123456789abcde\n", 0600);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), KOLO_EINVAL);
    CHECK(token == NULL);
    CHECK(strstr(err, "at least 16") != NULL);
    write_file(path, "\n\n", 0600);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), KOLO_EINVAL);

    /* Readable by group or others: refused, and the message says why and
     * what to do. */
    write_file(path, "0123456789abcdef-secret\n", 0644);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), KOLO_EPERM);
    CHECK(token == NULL);
    CHECK(strstr(err, "group or others") != NULL);
    CHECK(strstr(err, "0644") != NULL);
    CHECK(strstr(err, "chmod 600") != NULL);
    write_file(path, "0123456789abcdef-secret\n", 0640);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), KOLO_EPERM);
    write_file(path, "0123456789abcdef-secret\n", 0604);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), KOLO_EPERM);

    snprintf(path, sizeof path, "%s/no-token", tmpdir);
    CHECK_EQ_INT(read_token_file(path, &token, err, sizeof err), KOLO_ENOTFOUND);
    CHECK(strstr(err, path) != NULL);
    /* A directory is not a token file; a NULL err buffer is allowed. */
    CHECK_EQ_INT(read_token_file(tmpdir, &token, NULL, 0), KOLO_EINVAL);
}

static void test_loopback(void)
{
    static const char *yes[] = {
        "tcp://127.0.0.1:5000",
        "tcp://localhost:1",
        "tcp://[::1]:5",
        "127.0.0.1:8080",
        "localhost:80",
        "inproc://x",
        "ipc:///tmp/x",
        "tcp://127.1.2.3:9",
        "tcp://LOCALHOST:1",
        "[::1]:80",
        "::1",
        "tcp4://127.0.0.1:0",
        "http://127.0.0.1:80/api",
        "tcp://[::ffff:127.0.0.1]:7",
        "127.0.0.1",
    };
    static const char *no[] = {
        "tcp://0.0.0.0:1",
        "tcp://10.0.0.1:2",
        "0.0.0.0:80",
        "tcp://*:5",
        "tcp://:5",
        "tcp://[::]:5",
        "tcp://example.com:80",
        "192.168.1.1:22",
        "128.0.0.1:1",
        "",
        "tcp://localhost.example.com:1",
        "tcp://[::1:5",
        "ws://10.1.1.1:80/x",
    };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (!addr_is_loopback(yes[i])) {
            fprintf(stderr, "addr_is_loopback(\"%s\") should be true\n", yes[i]);
            test_failures++;
        }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (addr_is_loopback(no[i])) {
            fprintf(stderr, "addr_is_loopback(\"%s\") should be false\n", no[i]);
            test_failures++;
        }
    CHECK(!addr_is_loopback(NULL));
}

static void test_mkdir_p(void)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof path, "%s/a/b/c/", tmpdir);
    CHECK_EQ_INT(mkdir_p(path), 0);
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT(st.st_mode & 0777, 0700);
    CHECK_EQ_INT(mkdir_p(path), 0); /* already there */

    /* A file in the way is an error, not a silent success. */
    snprintf(path, sizeof path, "%s/file", tmpdir);
    write_file(path, "x", 0600);
    CHECK(mkdir_p(path) != 0);
    snprintf(path, sizeof path, "%s/file/sub", tmpdir);
    CHECK(mkdir_p(path) != 0);
    CHECK_EQ_INT(mkdir_p(""), KOLO_EINVAL);
    CHECK_EQ_INT(mkdir_p("/"), 0);
}

static void test_str_copy(void)
{
    char dst[6];
    CHECK_EQ_STR(str_copy(dst, "hello", sizeof dst), "hello");
    CHECK_EQ_STR(str_copy(dst, "hello world", sizeof dst), "hello");
    CHECK_EQ_STR(str_copy(dst, "", sizeof dst), "");
    CHECK_EQ_STR(str_copy(dst, NULL, sizeof dst), "");
    dst[0] = 'x';
    CHECK(str_copy(dst, "abc", 0) == dst && dst[0] == 'x'); /* nothing written */
    CHECK_EQ_STR(str_copy(dst, "abc", 1), "");
}

static void test_tcp_addr(void)
{
    char host[16];
    int port = 0;
    CHECK(tcp_addr_parse("tcp:127.0.0.1:4242", host, sizeof host, &port));
    CHECK_EQ_STR(host, "127.0.0.1");
    CHECK_EQ_INT(port, 4242);
    CHECK(tcp_addr_parse("tcp:::1:9", host, sizeof host, &port)); /* the last colon splits */
    CHECK_EQ_STR(host, "::1");
    CHECK_EQ_INT(port, 9);
    static const char *bad[] = {"127.0.0.1:80", "tcp:", "tcp::80", "tcp:host", "tcp:host:0",
                                "tcp:host:65536", "tcp:host:-1", "tcp:a-host-name-too-long:80",
                                NULL};
    for (int i = 0; i < 8; i++)
        CHECK(!tcp_addr_parse(bad[i], host, sizeof host, &port));
    CHECK(!tcp_addr_parse(bad[8], host, sizeof host, &port));
}

static void cleanup(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

static void test_array_room(void)
{
    struct pair {
        int a;
        double b;
    } *v = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < 1000; i++) {
        REQUIRE(array_room(&v, n, &cap, sizeof *v, 4) == 0);
        CHECK(cap > n && (cap == 4 || cap % 4 == 0));
        v[n++] = (struct pair){i, i * 0.5};
    }
    CHECK(cap == 1024);
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += v[i].a != (int)i || v[i].b != (double)i * 0.5;
    CHECK_EQ_INT(bad, 0);
    struct pair *before = v;
    REQUIRE(array_room(&v, 10, &cap, sizeof *v, 4) == 0); /* room already */
    CHECK(v == before && cap == 1024);
    free(v);
}

static void test_str_table(void)
{
    const char *a = "10.0.0.1", *b = "10.0.0.2";
    const char *src[] = {a, a, NULL, b, a};
    char **t = str_table(src, 5);
    REQUIRE(t);
    CHECK(strcmp(t[0], a) == 0 && t[1] == t[0] && t[2] == NULL);
    CHECK(strcmp(t[3], b) == 0 && strcmp(t[4], a) == 0 && t[4] != t[0]);
    CHECK(t[0] != a); /* copies */
    free(t);
    char **none = str_table(src, 0);
    CHECK(none != NULL);
    free(none);
}

/* The boot id: what ranks of namespace hosts on one machine share. */
static void test_machine_id(void)
{
    const char *id = machine_id();
    char want[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(want, sizeof want, f))
            want[0] = '\0';
        fclose(f);
        want[strcspn(want, "\n")] = '\0';
    }
    CHECK(strcmp(id, want) == 0);
    CHECK(f == NULL || strlen(id) == 36);
    CHECK(machine_id() == id); /* read once */
}

int main(void)
{
    REQUIRE(mkdtemp(tmpdir) != NULL);
    test_clocks_and_random();
    test_array_room();
    test_read_files();
    test_token_file();
    test_loopback();
    test_mkdir_p();
    test_str_copy();
    test_tcp_addr();
    test_machine_id();
    test_str_table();
    cleanup();
    TEST_DONE();
}
