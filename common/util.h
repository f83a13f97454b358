/*
 * util.h - clocks, randomness and small helpers shared by every binary.
 */
#ifndef KOLO_COMMON_UTIL_H
#define KOLO_COMMON_UTIL_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* trace_file_open opens a trace (timeline) file for writing, from its
 * start: a new file is 0600; an existing one is replaced only when it is
 * a regular file of this user that is empty or starts like a trace ('[');
 * symbolic links are not followed. So a timeline path never makes kolo
 * clobber what is not a timeline. The descriptor, or -1 with errno
 * (EEXIST: something else is there, TRACE_FILE_EEXIST says it). */
int trace_file_open(const char *path);
/* timeline_env_path: the file a HOROVOD_TIMELINE value names, or NULL
 * for none: unset, empty, or Horovod's "DYNAMIC" (the timeline API is on
 * and nothing is written until start_timeline names a file). */
const char *timeline_env_path(const char *value);
/* pwrite_all writes all of data at offset at (retrying short writes and
 * EINTR): 0, or -1 with errno. */
int pwrite_all(int fd, const void *data, size_t len, uint64_t at);
#define TRACE_FILE_EEXIST                                                                      \
    "something that is not a kolo timeline is there (a file of another user or kind, or a "  \
    "symbolic link): kolo overwrites only timelines"

/* now_mono_ms: CLOCK_MONOTONIC in ms, for leases and deadlines. */
uint64_t now_mono_ms(void);
/* now_mono_ms_coarse: the same clock as the kernel last ticked it (a few
 * ms behind now_mono_ms at most, never ahead), at a quarter of the cost
 * (~6 against ~25 ns here): for deadlines of seconds and checks every
 * 100 ms on the path of every small operation. */
uint64_t now_mono_ms_coarse(void);
/* now_mono_us: the same clock in microseconds, for short intervals. */
uint64_t now_mono_us(void);
/* now_mono_ns: the same clock in nanoseconds, for spin-then-sleep waits
 * on the data plane. */
uint64_t now_mono_ns(void);
/* cpu_relax tells the CPU this thread is spinning (x86 pause, arm yield),
 * so a sibling hyperthread runs and the spin wastes less power. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
/* usable_cpus: the CPUs this process may run on (its affinity mask, so a
 * taskset or cpuset counts, not the machine's total); at least 1. */
int usable_cpus(void);
/* str_table: a copy of n strings (NULL entries stay NULL) in one block,
 * freed with free(): n pointers, then the text; an entry whose pointer
 * equals the one before it shares that copy (a peer table's address, the
 * same for each rank of a host). NULL when out of memory. */
char **str_table(const char *const *src, int n);
/* machine_id: the running kernel's boot id (/proc/sys/kernel/random/
 * boot_id), which network namespaces and containers on one machine share
 * and other machines do not: processes that report the same one share
 * CPUs. "" when it cannot be read. Read once, then cached. */
const char *machine_id(void);
/* stop_signals_block blocks SIGINT and SIGTERM in the calling thread, into
 * set for sigwait, and ignores SIGPIPE: a daemon's main calls it before it
 * starts threads, which inherit the mask, so that only its sigwait sees the
 * stop signals. */
void stop_signals_block(sigset_t *set);

/* thread_name names the calling thread (at most 15 bytes are kept), as
 * `top -H`, `ps -L`, gdb and /proc show it: kolo's threads are all
 * "kolo-..." (docs/libkolo.md). */
void thread_name(const char *name);
/* cond_init_monotonic initialises a condition variable whose timed waits
 * use CLOCK_MONOTONIC (deadlines from mono_deadline), so a step of the
 * wall clock cannot stretch or cut them. */
void cond_init_monotonic(pthread_cond_t *cond);
/* deadline_left: the ms from now to deadline (monotonic ms), at most
 * cap (0: no cap), 0 once it has passed. For a wait cut in slices. */
uint64_t deadline_left(uint64_t deadline, uint64_t cap);
/* mono_deadline sets *ts to ms milliseconds from now on CLOCK_MONOTONIC,
 * for pthread_cond_timedwait on a condition set to that clock. */
struct timespec;
void mono_deadline(struct timespec *ts, uint64_t ms);
/* mono_deadline_us: the same, us microseconds from now. */
void mono_deadline_us(struct timespec *ts, uint64_t us);
/* mono_ts_us: *ts for the CLOCK_MONOTONIC time at_us (now_mono_us's
 * scale), for a deadline computed from a clock read already made. */
void mono_ts_us(struct timespec *ts, uint64_t at_us);
/* now_wall_ms: CLOCK_REALTIME in ms since the epoch, for records. */
uint64_t now_wall_ms(void);
/* now_stepless_ms: ms since the epoch as the wall clock read when this
 * process first asked, advanced by the monotonic clock since: what
 * freshness checks between processes use (rpc.c), so that a step of one
 * host's clock does not make it refuse, or be refused by, everyone. */
uint64_t now_stepless_ms(void);
/* random_bytes fills buf from getrandom(2); 0 or KOLO_ESYS. */
int random_bytes(void *buf, size_t len);
/* random_hex writes 2*nbytes hex digits and a NUL into out. */
int random_hex(char *out, size_t nbytes);
/* read_file_all reads a whole (small) file; caller frees *data. */
int read_file_all(const char *path, char **data, size_t *len, size_t max);
/* read_token_file reads a cluster token: whitespace trimmed, at least 16
 * bytes, and the file must not be readable by group or others. */
int read_token_file(const char *path, char **token, char *err, size_t errlen);
/* addr_is_loopback: true for tcp://127.x / localhost / [::1] style URLs or
 * "host:port" strings, and for inproc:// and ipc://. */
int addr_is_loopback(const char *addr);
/* tcp_addr_parse: a data-plane address "tcp:ADDR:PORT" into ADDR (host,
 * n bytes with its NUL) and PORT (1..65535); false when it is not that. */
bool tcp_addr_parse(const char *s, char *host, size_t n, int *port);
/* mkdir_p creates a directory and its parents (mode 0700 for new ones). */
int mkdir_p(const char *path);
/* fopen_private opens path for writing (truncated, or appended to), creating
 * it readable by its owner only (0600): job output and timelines may hold
 * what the job printed or named. NULL and errno on failure. */
FILE *fopen_private(const char *path, bool append);
/* str_hash: FNV-1a of a NUL-terminated string, for hash tables. */
uint64_t str_hash(const char *s);
/* array_room makes room for one more element in the array whose pointer
 * is at `array` (the address of a `T *`; n in use, *cap allocated, elem
 * bytes each), doubling from `first`; 0, or -1 when out of memory (the
 * array is then unchanged). */
int array_room(void *array, size_t n, size_t *cap, size_t elem, size_t first);
/* str_copy copies with truncation, always NUL-terminates; returns dst. */
char *str_copy(char *dst, const char *src, size_t size);

#endif
