/*
 * copy_floor.c - the floor under a large allreduce on 2 hosts of L ranks:
 * the copies, reductions and TCP transfers that the hierarchical pattern
 * needs, and nothing else (no collective library, no synchronisation
 * between the ranks of a host, no fusion, no checks). bench/run.sh puts
 * it beside kolo's 16 MiB allreduce on 2 network namespaces.
 *
 *   copy_floor server PORT [L] [BYTES] [ITERS]        one host: answers L clients
 *   copy_floor client HOST PORT [L] [BYTES] [ITERS]   the other host, timed
 *
 * Each side forks L ranks; local rank i of one side pairs with local rank
 * i of the other over its own connection (PORT + i). Per iteration every
 * rank, on float32 buffers of BYTES with a shard of BYTES/L per rank:
 *
 *   1. copies into the host's shared segment the parts of its input the
 *      host's other ranks reduce: (L-1)/L of BYTES;
 *   2. reduces its shard: its own input and the other ranks' parts from
 *      the segment, into its output;
 *   3. runs the 2-member ring with its pair on the other host over TCP:
 *      sends half its shard and receives the other half (into a scratch
 *      buffer), reduces that half, then sends the reduced half and
 *      receives the other reduced half into its output;
 *   4. copies its reduced shard into the segment, and the other ranks'
 *      shards from the segment into its output.
 *
 * The ranks of a host never wait for each other, so phases overlap freely:
 * the time is the work of all ranks spread over the machine's CPUs with
 * no idle gap, which no real collective reaches. The results are not
 * checked (the ranks race on the segment by design). The client's local
 * rank 0 prints one JSON line: median and p99 of its iterations, µs.
 */
#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_clock.h"
#include "bench_net.h"

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* Sends sn bytes and receives rn bytes at once (full duplex: neither side
 * may block on a send while the other's send waits for its receive). */
static void exchange(int fd, const char *s, size_t sn, char *r, size_t rn)
{
    while (sn || rn) {
        struct pollfd p = {.fd = fd, .events = (short)((sn ? POLLOUT : 0) | (rn ? POLLIN : 0))};
        if (poll(&p, 1, 60000) != 1)
            die("poll");
        if (sn && (p.revents & POLLOUT)) {
            ssize_t k = send(fd, s, sn, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k < 0 && errno != EAGAIN)
                die("send");
            if (k > 0) {
                s += k;
                sn -= (size_t)k;
            }
        }
        if (rn && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t k = recv(fd, r, rn, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN))
                die("recv");
            if (k > 0) {
                r += k;
                rn -= (size_t)k;
            }
        }
    }
}

/* the ring's reduce-scatter step goes by pieces of this many floats */
#define CHUNK ((size_t)64 << 10)

static void add(float *restrict acc, const float *restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        acc[i] += b[i];
}

/* One rank's iterations (see the top of the file). seg: the host's
 * segment, L buffers of bytes; me: this rank's local index. */
static void rank_run(int fd, float *seg, int L, int me, size_t bytes, int iters, int first,
                     int timed)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t n = bytes / sizeof(float), sh = n / (size_t)L, half = sh / 2;
    float *buf = malloc(bytes), *scratch = malloc(CHUNK * sizeof(float));
    if (!buf || !scratch)
        die("malloc");
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f;
    float *mine = seg + (size_t)me * n; /* this rank's buffer in the segment */
    float *shard = buf + (size_t)me * sh;
    /* the ring's two halves: the client keeps the first, the server the second */
    float *keep = first ? shard : shard + half, *give = first ? shard + half : shard;
    double *t = malloc((size_t)iters * sizeof *t);
    int warm = iters / 10 + 2;
    double start = 0;
    for (int it = -warm; it < iters; it++) {
        if (it == 0)
            start = now_us();
        double t0 = now_us();
        for (int j = 0; j < L; j++) /* 1 */
            if (j != me)
                memcpy(mine + (size_t)j * sh, buf + (size_t)j * sh, sh * sizeof(float));
        for (int j = 0; j < L; j++) /* 2 */
            if (j != me)
                add(shard, seg + (size_t)j * n + (size_t)me * sh, sh);
        for (size_t at = 0; at < half; at += CHUNK) { /* 3, a piece at a time while hot */
            size_t k = half - at < CHUNK ? half - at : CHUNK;
            exchange(fd, (char *)(give + at), k * sizeof(float), (char *)scratch, k * sizeof(float));
            add(keep + at, scratch, k);
        }
        exchange(fd, (char *)keep, half * sizeof(float), (char *)give, half * sizeof(float));
        memcpy(mine + (size_t)me * sh, shard, sh * sizeof(float)); /* 4 */
        for (int j = 0; j < L; j++)
            if (j != me)
                memcpy(buf + (size_t)j * sh, seg + (size_t)j * n + (size_t)j * sh,
                       sh * sizeof(float));
        if (it >= 0)
            t[it] = now_us() - t0;
    }
    double mean = (now_us() - start) / iters;
    if (timed) {
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        printf("{\"impl\":\"floor\",\"kind\":\"copies_2x%d\",\"np\":%d,\"bytes\":%zu,"
               "\"iters\":%d,\"median_us\":%.2f,\"min_us\":%.2f,\"p99_us\":%.2f,\"mean_us\":%.2f}\n",
               L, 2 * L, bytes, iters, t[iters / 2], t[0], t[(iters * 99) / 100], mean);
        fflush(stdout);
    }
    close(fd);
    free(t);
    free(buf);
    free(scratch);
}

/* One side: L ranks as processes sharing a segment; the client's rank 0
 * (this process) is the timed one. */
static int side(const char *host, int port, int L, size_t bytes, int iters)
{
    float *seg = mmap(NULL, bytes * (size_t)L, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (seg == MAP_FAILED)
        die("mmap");
    memset(seg, 0, bytes * (size_t)L);
    for (int i = 1; i < L; i++) {
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            int fd = host ? bench_connect(host, port + i) : bench_accept(port + i);
            rank_run(fd, seg, L, i, bytes, iters, host != NULL, 0);
            _exit(0);
        }
    }
    int fd = host ? bench_connect(host, port) : bench_accept(port);
    rank_run(fd, seg, L, 0, bytes, iters, host != NULL, host != NULL);
    int rc = 0, st;
    while (wait(&st) > 0)
        rc |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    return rc;
}

int main(int argc, char **argv)
{
    int server = argc >= 3 && strcmp(argv[1], "server") == 0;
    int client = argc >= 4 && strcmp(argv[1], "client") == 0;
    if (!server && !client) {
        fprintf(stderr, "usage: copy_floor server PORT [L] [BYTES] [ITERS] | "
                        "copy_floor client HOST PORT [L] [BYTES] [ITERS]\n");
        return 2;
    }
    int a = client ? 4 : 3; /* the first optional argument */
    int L = argc > a ? atoi(argv[a]) : 2;
    size_t bytes = argc > a + 1 ? strtoull(argv[a + 1], NULL, 10) : 16u << 20;
    int iters = argc > a + 2 ? atoi(argv[a + 2]) : 20;
    /* whole halves of whole shards */
    if (L < 1 || L > 64 || iters < 1 || bytes < (size_t)L * 2 * sizeof(float) ||
        bytes % ((size_t)L * 2 * sizeof(float))) {
        fprintf(stderr, "copy_floor: L in 1..64, BYTES a multiple of 8 L, ITERS >= 1\n");
        return 2;
    }
    return side(client ? argv[2] : NULL, atoi(argv[client ? 3 : 2]), L, bytes, iters);
}
