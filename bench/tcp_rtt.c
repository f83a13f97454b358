/*
 * tcp_rtt.c - the TCP round trip between two hosts, the floor under any
 * small allreduce across them: a 4-byte ping-pong over one connection
 * (TCP_NODELAY, blocking sockets, no library), the yardstick bench/run.sh
 * puts beside kolo's 4 B allreduce between two network namespaces.
 *
 *   tcp_rtt server PORT [local]            answers one client, then exits
 *   tcp_rtt client HOST PORT [N] [local]   N timed round trips (default 2000)
 *
 * With "local" (both sides) each side is a host of two ranks: a partner
 * process hands the side its 4 bytes through a shared page and waits for
 * the result there, the way a host's second rank meets its leader in any
 * hierarchical allreduce. Waits yield the CPU for up to 100 µs, then
 * sleep on a futex (a rank that spins would take the CPU its peer needs
 * when ranks outnumber CPUs). That is the floor under kolo's 2 hosts x 2
 * ranks 4 B allreduce on the same machine: one round trip, two local
 * hand-offs, nothing else.
 *
 * The client prints one JSON line: median and p99 of the round trips, µs.
 */
#include <arpa/inet.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "bench_clock.h"
#include "bench_net.h"

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* exactly n bytes, or exit */
static void full(int fd, char *buf, size_t n, int sending)
{
    while (n) {
        ssize_t k = sending ? send(fd, buf, n, MSG_NOSIGNAL) : recv(fd, buf, n, 0);
        if (k <= 0)
            die(sending ? "send" : "recv");
        buf += k;
        n -= (size_t)k;
    }
}

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* The shared page of a host of two ranks: the partner's contribution
 * count and the leader's result count (STOP ends the partner). */
struct pair {
    _Atomic uint32_t contrib, result;
};
#define STOP UINT32_MAX

static void post(_Atomic uint32_t *w, uint32_t v)
{
    atomic_store(w, v);
    syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* until *w reaches v (or STOP): yield for up to 100 µs, then futex */
static uint32_t await_at_least(_Atomic uint32_t *w, uint32_t v)
{
    double t0 = now_us();
    uint32_t x;
    while ((x = atomic_load(w)) < v) {
        if (now_us() - t0 < 100) {
            sched_yield();
            continue;
        }
        syscall(SYS_futex, w, FUTEX_WAIT, x, NULL, NULL, 0);
    }
    return x;
}

/* The host's second rank: a contribution, then the result, round after
 * round until STOP. */
static struct pair *start_partner(void)
{
    struct pair *p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                          -1, 0);
    if (p == MAP_FAILED)
        die("mmap");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        for (uint32_t i = 1;; i++) {
            post(&p->contrib, i);
            if (await_at_least(&p->result, i) == STOP)
                _exit(0);
        }
    }
    return p;
}

static void stop_partner(struct pair *p)
{
    if (!p)
        return;
    post(&p->result, STOP);
    wait(NULL);
}

static int serve(int port, int local)
{
    int fd = bench_accept(port);
    nodelay(fd);
    struct pair *p = local ? start_partner() : NULL;
    char b[4];
    for (uint32_t i = 1;; i++) {
        if (p)
            await_at_least(&p->contrib, i);
        ssize_t k = recv(fd, b, sizeof b, MSG_WAITALL);
        if (k <= 0)
            break; /* the client is done */
        full(fd, b, sizeof b, 1);
        if (p)
            post(&p->result, i);
    }
    stop_partner(p);
    close(fd);
    return 0;
}

static int client(const char *host, int port, int n, int local)
{
    int fd = bench_connect(host, port);
    nodelay(fd);
    struct pair *p = local ? start_partner() : NULL;
    double *t = malloc((size_t)n * sizeof *t);
    char b[4] = {1, 2, 3, 4};
    uint32_t round = 0;
    for (int i = -n / 10; i < n; i++) { /* a tenth as warm-up */
        double t0 = now_us();
        if (p)
            await_at_least(&p->contrib, ++round);
        full(fd, b, sizeof b, 1);
        full(fd, b, sizeof b, 0);
        if (p)
            post(&p->result, round);
        if (i >= 0)
            t[i] = now_us() - t0;
    }
    close(fd);
    stop_partner(p);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    printf("{\"impl\":\"tcp\",\"kind\":\"%s\",\"np\":%d,", local ? "rtt_2x2" : "rtt",
           local ? 4 : 2);
    printf("\"bytes\":4,\"iters\":%d,"
           "\"median_us\":%.2f,\"min_us\":%.2f,\"p99_us\":%.2f}\n",
           n, t[n / 2], t[0], t[(n * 99) / 100]);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    int local = strcmp(argv[argc - 1], "local") == 0;
    argc -= local;
    if (argc >= 3 && strcmp(argv[1], "server") == 0)
        return serve(atoi(argv[2]), local);
    if (argc >= 4 && strcmp(argv[1], "client") == 0)
        return client(argv[2], atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 2000, local);
    fprintf(stderr, "usage: tcp_rtt server PORT [local] | tcp_rtt client HOST PORT [N] [local]\n");
    return 2;
}
