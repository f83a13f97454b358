/*
 * util.c - clocks, randomness, files and address checks.
 */
#include "util.h"

#include <arpa/inet.h>
#include <sched.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"

/* The longest token file read_token_file accepts; a token is a short
 * secret, so anything bigger is a wrong path. */
#define TOKEN_FILE_MAX 4096
#define TOKEN_MIN_LEN  16

static uint64_t clock_ms(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t now_mono_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

uint64_t now_mono_ms_coarse(void)
{
    return clock_ms(CLOCK_MONOTONIC_COARSE);
}

uint64_t deadline_left(uint64_t deadline, uint64_t cap)
{
    uint64_t now = now_mono_ms();
    uint64_t left = deadline > now ? deadline - now : 0;
    return cap && left > cap ? cap : left;
}

uint64_t now_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t now_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int array_room(void *array, size_t n, size_t *cap, size_t elem, size_t first)
{
    if (n < *cap)
        return 0;
    void *v;
    memcpy(&v, array, sizeof v); /* any T *, without aliasing it as void * */
    size_t ncap = *cap ? *cap * 2 : first;
    void *nv = realloc(v, ncap * elem);
    if (!nv)
        return -1;
    memcpy(array, &nv, sizeof nv);
    *cap = ncap;
    return 0;
}

void cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &ca);
    pthread_condattr_destroy(&ca);
}

void mono_ts_us(struct timespec *ts, uint64_t at_us)
{
    ts->tv_sec = (time_t)(at_us / 1000000u);
    ts->tv_nsec = (long)(at_us % 1000000u) * 1000L;
}

void mono_deadline_us(struct timespec *ts, uint64_t us)
{
    mono_ts_us(ts, now_mono_us() + us);
}

void mono_deadline(struct timespec *ts, uint64_t ms)
{
    mono_deadline_us(ts, ms * 1000);
}

/* Fault tests step the wall clock of one process without touching the
 * machine's: with KOLO_TEST_WALL_OFFSET_FILE set, now_wall_ms adds the
 * milliseconds that file holds (re-read at most every 100 ms). */
static pthread_once_t wall_hook_once = PTHREAD_ONCE_INIT;
static const char *wall_hook_path;
static _Atomic int64_t wall_hook_offset;
static _Atomic uint64_t wall_hook_read_at;

static void wall_hook_init(void)
{
    const char *p = getenv("KOLO_TEST_WALL_OFFSET_FILE");
    wall_hook_path = p && p[0] ? p : NULL;
}

static int64_t wall_offset_ms(void)
{
    pthread_once(&wall_hook_once, wall_hook_init);
    if (!wall_hook_path)
        return 0;
    uint64_t now = now_mono_ms(), at = atomic_load(&wall_hook_read_at);
    if (now - at >= 100 && atomic_compare_exchange_strong(&wall_hook_read_at, &at, now)) {
        char *text = NULL;
        size_t len = 0;
        if (read_file_all(wall_hook_path, &text, &len, 64) == 0) {
            atomic_store(&wall_hook_offset, strtoll(text, NULL, 10));
            free(text);
        }
    }
    return atomic_load(&wall_hook_offset);
}

uint64_t now_wall_ms(void)
{
    return (uint64_t)((int64_t)clock_ms(CLOCK_REALTIME) + wall_offset_ms());
}

/* The wall clock when first asked, then moved on by the monotonic clock:
 * steps of the wall clock after that (settimeofday, a VM resumed, an
 * operator's date -s) do not move it. */
static pthread_once_t stepless_once = PTHREAD_ONCE_INIT;
static uint64_t stepless_wall, stepless_mono;

static void stepless_init(void)
{
    stepless_wall = now_wall_ms();
    stepless_mono = now_mono_ms();
}

uint64_t now_stepless_ms(void)
{
    pthread_once(&stepless_once, stepless_init);
    return stepless_wall + (now_mono_ms() - stepless_mono);
}

int random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len > 0) {
        /* getrandom returns at most 32 MiB per call and may be interrupted
         * by a signal before the pool is ready; loop over both. */
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return KOLO_ESYS;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int random_hex(char *out, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char chunk[64];
    size_t done = 0;
    while (done < nbytes) {
        size_t n = nbytes - done < sizeof chunk ? nbytes - done : sizeof chunk;
        int rc = random_bytes(chunk, n);
        if (rc) {
            out[0] = '\0';
            return rc;
        }
        for (size_t i = 0; i < n; i++) {
            out[2 * (done + i)] = hex[chunk[i] >> 4];
            out[2 * (done + i) + 1] = hex[chunk[i] & 15];
        }
        done += n;
    }
    out[2 * nbytes] = '\0';
    return 0;
}

static int errno_to_kolo(int e)
{
    switch (e) {
    case ENOENT:
    case ENOTDIR:
        return KOLO_ENOTFOUND;
    case EACCES:
    case EPERM:
        return KOLO_EPERM;
    case ENOMEM:
        return KOLO_ENOMEM;
    default:
        return KOLO_EIO;
    }
}

/* read_fd_all reads fd to its end into a NUL-terminated allocation.
 * It reads until EOF rather than trusting st_size, which is 0 for /proc
 * files and may change under us. */
static int read_fd_all(int fd, char **data, size_t *len, size_t max)
{
    size_t cap = 4096, used = 0;
    char *p = malloc(cap);
    if (!p)
        return KOLO_ENOMEM;
    for (;;) {
        if (used + 1 >= cap) {
            size_t ncap = cap * 2;
            char *np = realloc(p, ncap);
            if (!np) {
                free(p);
                return KOLO_ENOMEM;
            }
            p = np;
            cap = ncap;
        }
        ssize_t n = read(fd, p + used, cap - used - 1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int rc = errno_to_kolo(errno);
            free(p);
            return rc;
        }
        if (n == 0)
            break;
        used += (size_t)n;
        if (used > max) {
            free(p);
            return KOLO_ETOOBIG;
        }
    }
    p[used] = '\0';
    *data = p;
    if (len)
        *len = used;
    return 0;
}

int read_file_all(const char *path, char **data, size_t *len, size_t max)
{
    *data = NULL;
    if (len)
        *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno_to_kolo(errno);
    int rc = read_fd_all(fd, data, len, max);
    close(fd);
    return rc;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int read_token_file(const char *path, char **token, char *err, size_t errlen)
{
    *token = NULL;
    if (err && errlen)
        err[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        set_err(err, errlen, "cannot open token file %s: %s", path, strerror(e));
        return errno_to_kolo(e);
    }
    /* Check the file we opened, not the path, so it cannot be swapped
     * between the check and the read. */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        set_err(err, errlen, "cannot stat token file %s: %s", path, strerror(e));
        return KOLO_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        set_err(err, errlen, "token file %s is not a regular file", path);
        return KOLO_EINVAL;
    }
    /* A token others can read is a leaked token; one others can write lets
     * them choose it. Either way the cluster's authentication is void. */
    if (st.st_mode & (S_IRGRP | S_IROTH | S_IWGRP | S_IWOTH)) {
        close(fd);
        set_err(err, errlen,
                "token file %s is accessible by group or others (mode %04o); "
                "run: chmod 600 %s",
                path, (unsigned)(st.st_mode & 07777), path);
        return KOLO_EPERM;
    }
    char *data;
    size_t len;
    int rc = read_fd_all(fd, &data, &len, TOKEN_FILE_MAX);
    close(fd);
    if (rc) {
        if (rc == KOLO_ETOOBIG)
            set_err(err, errlen, "token file %s is larger than %d bytes", path, TOKEN_FILE_MAX);
        else
            set_err(err, errlen, "cannot read token file %s: %s", path, abi_strerror(rc));
        return rc;
    }
    if (memchr(data, '\0', len)) {
        free(data);
        set_err(err, errlen, "token file %s contains a NUL byte", path);
        return KOLO_EINVAL;
    }
    /* Editors add a trailing newline; people paste with spaces. */
    size_t start = 0;
    while (start < len && isspace((unsigned char)data[start]))
        start++;
    while (len > start && isspace((unsigned char)data[len - 1]))
        len--;
    size_t n = len - start;
    if (n < TOKEN_MIN_LEN) {
        free(data);
        set_err(err, errlen, "token in %s is %zu bytes; at least %d are required", path, n,
                TOKEN_MIN_LEN);
        return KOLO_EINVAL;
    }
    memmove(data, data + start, n);
    data[n] = '\0';
    *token = data;
    return 0;
}

/* host_is_loopback decides for a bare host: a name, an IPv4 address or an
 * IPv6 address without brackets. */
static int host_is_loopback(const char *host)
{
    if (strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0)
        return 1;
    struct in_addr v4;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    struct in6_addr v6;
    if (inet_pton(AF_INET6, host, &v6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&v6))
            return 1;
        /* ::ffff:127.0.0.1 is IPv4 loopback reached over an IPv6 socket. */
        return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
    }
    /* Anything else (other names, "*", empty = all interfaces) may be
     * reachable from elsewhere. */
    return 0;
}

bool tcp_addr_parse(const char *s, char *host, size_t n, int *port)
{
    const char *colon = s && strncmp(s, "tcp:", 4) == 0 ? strrchr(s + 4, ':') : NULL;
    size_t len = colon ? (size_t)(colon - (s + 4)) : 0;
    if (!colon || len == 0 || len >= n)
        return false;
    memcpy(host, s + 4, len);
    host[len] = '\0';
    *port = atoi(colon + 1);
    return *port > 0 && *port < 65536;
}

int addr_is_loopback(const char *addr)
{
    if (!addr)
        return 0;
    /* In-process and Unix-socket transports never leave the machine. */
    if (strncmp(addr, "inproc://", 9) == 0 || strncmp(addr, "ipc://", 6) == 0 ||
        strncmp(addr, "unix://", 7) == 0 || strncmp(addr, "abstract://", 11) == 0)
        return 1;
    const char *rest = addr;
    const char *scheme_end = strstr(addr, "://");
    if (scheme_end)
        rest = scheme_end + 3;

    char host[256];
    size_t n;
    if (rest[0] == '[') {
        const char *close = strchr(rest, ']');
        if (!close)
            return 0;
        n = (size_t)(close - rest - 1);
        if (n >= sizeof host)
            return 0;
        memcpy(host, rest + 1, n);
    } else {
        /* The host ends at the path; the port follows the only ':'. With
         * several colons and no brackets it is a bare IPv6 address. */
        size_t end = strcspn(rest, "/");
        size_t colons = 0, colon_at = 0;
        for (size_t i = 0; i < end; i++)
            if (rest[i] == ':') {
                colons++;
                colon_at = i;
            }
        if (colons == 1)
            end = colon_at;
        n = end;
        if (n >= sizeof host)
            return 0;
        memcpy(host, rest, n);
    }
    host[n] = '\0';
    return host_is_loopback(host);
}

FILE *fopen_private(const char *path, bool append)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0600);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, append ? "a" : "w");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

int mkdir_p(const char *path)
{
    if (!path || !*path)
        return KOLO_EINVAL;
    char tmp[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof tmp)
        return KOLO_EINVAL;
    memcpy(tmp, path, len + 1);
    while (len > 1 && tmp[len - 1] == '/')
        tmp[--len] = '\0';
    /* Create each prefix in turn. One that exists already is fine; if it is
     * not a directory, the next mkdir fails with ENOTDIR and says so. */
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
            return errno == EACCES ? KOLO_EPERM : KOLO_ESYS;
        *p = '/';
    }
    if (mkdir(tmp, 0700) != 0) {
        int e = errno;
        struct stat st;
        if (e == EEXIST && stat(tmp, &st) == 0 && S_ISDIR(st.st_mode))
            return 0;
        errno = e; /* callers may want the precise reason */
        return e == EEXIST ? KOLO_EEXIST : (e == EACCES ? KOLO_EPERM : KOLO_ESYS);
    }
    return 0;
}

char *str_copy(char *dst, const char *src, size_t size)
{
    if (size == 0)
        return dst;
    size_t n = src ? strlen(src) : 0;
    if (n >= size)
        n = size - 1;
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
    return dst;
}

uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

void thread_name(const char *name)
{
    char cut[16];
    snprintf(cut, sizeof cut, "%s", name);
    pthread_setname_np(pthread_self(), cut);
}

int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

char **str_table(const char *const *src, int n)
{
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(char *);
    for (int i = 0; i < n; i++)
        if (src[i] && (i == 0 || src[i] != src[i - 1]))
            bytes += strlen(src[i]) + 1;
    char **out = malloc(bytes);
    if (!out)
        return NULL;
    char *text = (char *)(out + (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        if (!src[i]) {
            out[i] = NULL;
        } else if (i > 0 && src[i] == src[i - 1]) {
            out[i] = out[i - 1];
        } else {
            size_t len = strlen(src[i]) + 1;
            memcpy(text, src[i], len);
            out[i] = text;
            text += len;
        }
    }
    return out;
}

static char machine_text[40];
static pthread_once_t machine_once = PTHREAD_ONCE_INIT;

static void machine_read(void)
{
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, machine_text, sizeof machine_text - 1);
    close(fd);
    n = n < 0 ? 0 : n;
    while (n > 0 && (machine_text[n - 1] == '\n' || machine_text[n - 1] == ' '))
        n--;
    machine_text[n] = '\0';
}

const char *machine_id(void)
{
    pthread_once(&machine_once, machine_read);
    return machine_text;
}

const char *timeline_env_path(const char *value)
{
    return value && value[0] && strcmp(value, "DYNAMIC") != 0 ? value : NULL;
}

int trace_file_open(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        return open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        if (errno == ELOOP)
            errno = EEXIST; /* a symbolic link: not followed */
        return -1;
    }
    struct stat st;
    char first = 0;
    bool ours = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                (st.st_size == 0 || (pread(fd, &first, 1, 0) == 1 && first == '['));
    if (!ours || ftruncate(fd, 0) != 0) {
        int e = ours ? errno : EEXIST;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int pwrite_all(int fd, const void *data, size_t len, uint64_t at)
{
    const uint8_t *p = data;
    while (len) {
        ssize_t n = pwrite(fd, p, len, (off_t)at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
        at += (uint64_t)n;
    }
    return 0;
}

void stop_signals_block(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}
