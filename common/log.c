/*
 * log.c - leveled logging to stderr or to a caller's sink.
 *
 * DESIGN. The effective level is resolved in this order: an explicit
 * log_set_level(), then KOLO_LOG_LEVEL, then the default (LOG_OFF for a
 * library, whatever a daemon passed to log_set_default()). The environment
 * is read once, lazily, under pthread_once, so a process that never logs
 * never looks at it and a daemon can set its default before the first
 * message. The level lives in atomics so the hot check in the LOG* macros
 * is one load with no lock.
 *
 * A line is formatted completely into one buffer and handed to stderr with
 * a single write(2), so lines from different threads never interleave
 * (pipes and terminals keep writes up to PIPE_BUF whole; longer lines are
 * still one call). The sink pointer is guarded by a read-write lock that
 * is held, shared, while the sink runs: once log_set_sink() returns, the
 * old sink is never called again, so Python may drop its callback safely.
 * glibc's default rwlock prefers readers, so a sink that itself logs does
 * not deadlock; a sink must not call log_set_sink() itself, though.
 */
#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* A line longer than this is formatted into a heap buffer instead. */
#define LOG_STACK_LINE 1024

static atomic_int log_default_level = LOG_OFF;
static atomic_int log_env_level = -1;      /* -1: KOLO_LOG_LEVEL unset or invalid */
static atomic_int log_explicit_level = -1; /* -1: log_set_level never called */
static pthread_once_t log_env_once = PTHREAD_ONCE_INIT;

static pthread_rwlock_t log_sink_lock = PTHREAD_RWLOCK_INITIALIZER;
static log_sink_fn log_sink;
static void *log_sink_arg;

static const char *const log_names[] = {"trace", "debug", "info", "warn", "error", "off"};

static void log_read_env(void)
{
    const char *s = getenv("KOLO_LOG_LEVEL");
    if (s && *s) {
        int level = log_parse_level(s);
        if (level >= 0)
            atomic_store(&log_env_level, level);
        else
            /* Nothing else can report this: logging is what is broken. */
            fprintf(stderr,
                    "kolo: ignoring KOLO_LOG_LEVEL=%s (want trace, debug, info, warn, "
                    "error or off)\n",
                    s);
    }
}

void log_set_default(int level)
{
    if (level >= LOG_TRACE && level <= LOG_OFF)
        atomic_store(&log_default_level, level);
}

void log_set_level(int level)
{
    if (level >= LOG_TRACE && level <= LOG_OFF)
        atomic_store(&log_explicit_level, level);
}

int log_get_level(void)
{
    int level = atomic_load_explicit(&log_explicit_level, memory_order_relaxed);
    if (level >= 0)
        return level;
    pthread_once(&log_env_once, log_read_env);
    level = atomic_load_explicit(&log_env_level, memory_order_relaxed);
    if (level >= 0)
        return level;
    return atomic_load_explicit(&log_default_level, memory_order_relaxed);
}

int log_parse_level(const char *s)
{
    if (!s)
        return -1;
    if (s[0] >= '0' && s[0] <= '9' && s[1] == '\0') {
        int level = s[0] - '0';
        return level <= LOG_OFF ? level : -1;
    }
    for (int i = LOG_TRACE; i <= LOG_OFF; i++)
        if (strcasecmp(s, log_names[i]) == 0)
            return i;
    /* Spellings people type out of habit from other tools. */
    if (strcasecmp(s, "warning") == 0)
        return LOG_WARN;
    if (strcasecmp(s, "fatal") == 0) /* Horovod's level above error */
        return LOG_ERROR;
    if (strcasecmp(s, "none") == 0)
        return LOG_OFF;
    return -1;
}

const char *log_level_name(int level)
{
    if (level >= LOG_TRACE && level <= LOG_OFF)
        return log_names[level];
    return "?";
}

void log_set_sink(log_sink_fn fn, void *arg)
{
    pthread_rwlock_wrlock(&log_sink_lock);
    log_sink = fn;
    log_sink_arg = arg;
    pthread_rwlock_unlock(&log_sink_lock);
}

void log_msg(int level, const char *module, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, module, fmt, ap);
    va_end(ap);
}

/* log_write_all writes the whole line, retrying only what the kernel cut
 * short; a failing stderr has nowhere to report to, so errors are dropped. */
static void log_write_all(const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(STDERR_FILENO, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += n;
        len -= (size_t)n;
    }
}

/* log_timestamp writes "2024-05-01T12:34:56.789Z" (UTC) into out. */
static void log_timestamp(char *out, size_t size)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, size, "%Y-%m-%dT%H:%M:%S", &tm);
    unsigned ms = (unsigned)(ts.tv_nsec / 1000000) % 1000;
    if (n + 6 <= size) {
        out[n++] = '.';
        out[n++] = (char)('0' + ms / 100);
        out[n++] = (char)('0' + ms / 10 % 10);
        out[n++] = (char)('0' + ms % 10);
        out[n++] = 'Z';
        out[n] = '\0';
    }
}

void log_vmsg(int level, const char *module, const char *fmt, va_list ap)
{
    if (level < LOG_TRACE || level >= LOG_OFF || level < log_get_level())
        return;
    if (!module || !*module)
        module = "-";

    /* Format the message once; it goes either to the sink or into a line. */
    char stack_msg[LOG_STACK_LINE];
    char *msg = stack_msg;
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(stack_msg, sizeof stack_msg, fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return;
    }
    if ((size_t)n >= sizeof stack_msg) {
        char *heap = malloc((size_t)n + 1);
        if (heap) {
            vsnprintf(heap, (size_t)n + 1, fmt, ap2);
            msg = heap;
        } else {
            n = (int)sizeof stack_msg - 1; /* keep what fitted */
        }
    }
    va_end(ap2);
    /* The line ends with exactly one newline, whatever the caller wrote. */
    size_t msg_len = (size_t)n;
    while (msg_len > 0 && (msg[msg_len - 1] == '\n' || msg[msg_len - 1] == '\r'))
        msg[--msg_len] = '\0';

    pthread_rwlock_rdlock(&log_sink_lock);
    if (log_sink) {
        log_sink(level, module, msg, log_sink_arg);
        pthread_rwlock_unlock(&log_sink_lock);
    } else {
        pthread_rwlock_unlock(&log_sink_lock);
        char stamp[40];
        log_timestamp(stamp, sizeof stamp);
        char upper[8];
        const char *name = log_level_name(level);
        size_t i;
        for (i = 0; name[i] && i < sizeof upper - 1; i++)
            upper[i] = (char)toupper((unsigned char)name[i]);
        upper[i] = '\0';

        char stack_line[LOG_STACK_LINE + 128];
        char *line = stack_line;
        size_t need = strlen(stamp) + sizeof upper + strlen(module) + msg_len + 8;
        if (need > sizeof stack_line) {
            line = malloc(need);
            if (!line) {
                line = stack_line;
                need = sizeof stack_line;
            }
        } else {
            need = sizeof stack_line;
        }
        int len = snprintf(line, need, "%s %-5s %s: %s\n", stamp, upper, module, msg);
        if (len > 0) {
            size_t out = (size_t)len < need ? (size_t)len : need - 1;
            if ((size_t)len >= need)
                line[out - 1] = '\n'; /* truncated (out of memory): still end the line */
            log_write_all(line, out);
        }
        if (line != stack_line)
            free(line);
    }
    if (msg != stack_msg)
        free(msg);
}
