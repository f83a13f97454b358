/*
 * tcp_rtt.c - the TCP round trip between two hosts, the floor under any
 * small allreduce across them: a 4-byte ping-pong over one connection
 * (TCP_NODELAY, blocking sockets, no library), the yardstick bench/run.sh
 * puts beside kolo's 4 B allreduce between two network namespaces.
 *
 *   tcp_rtt server PORT            answers one client, then exits
 *   tcp_rtt client HOST PORT [N]   N timed round trips (default 2000)
 *
 * The client prints one JSON line: median and p99 of the round trips, µs.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "bench_clock.h"

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

static int serve(int port)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1))
        die("listen");
    int fd = accept(ls, NULL, NULL);
    if (fd < 0)
        die("accept");
    nodelay(fd);
    char b[4];
    for (;;) {
        ssize_t k = recv(fd, b, sizeof b, MSG_WAITALL);
        if (k <= 0)
            break; /* the client is done */
        full(fd, b, sizeof b, 1);
    }
    close(fd);
    close(ls);
    return 0;
}

static int client(const char *host, int port, int n)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "tcp_rtt: not an IPv4 address: %s\n", host);
        return 2;
    }
    int fd = -1;
    for (int tries = 0; tries < 100; tries++) { /* the server may still be starting */
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
            break;
        close(fd);
        fd = -1;
        usleep(50000);
    }
    if (fd < 0)
        die("connect");
    nodelay(fd);
    double *t = malloc((size_t)n * sizeof *t);
    char b[4] = {1, 2, 3, 4};
    for (int i = -n / 10; i < n; i++) { /* a tenth as warm-up */
        double t0 = now_us();
        full(fd, b, sizeof b, 1);
        full(fd, b, sizeof b, 0);
        if (i >= 0)
            t[i] = now_us() - t0;
    }
    close(fd);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    printf("{\"impl\":\"tcp\",\"kind\":\"rtt\",\"np\":2,\"bytes\":4,\"iters\":%d,"
           "\"median_us\":%.2f,\"min_us\":%.2f,\"p99_us\":%.2f}\n",
           n, t[n / 2], t[0], t[(n * 99) / 100]);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "server") == 0)
        return serve(atoi(argv[2]));
    if (argc >= 4 && strcmp(argv[1], "client") == 0)
        return client(argv[2], atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 2000);
    fprintf(stderr, "usage: tcp_rtt server PORT | tcp_rtt client HOST PORT [N]\n");
    return 2;
}
