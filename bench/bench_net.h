/*
 * bench_net.h - the TCP set-up of the floor programs (tcp_rtt.c,
 * copy_floor.c): one accepted connection on a port, or one connection to
 * a host's port while its server may still be starting. Header-only, as
 * bench_clock.h; both exit with a message on failure.
 */
#ifndef KOLO_BENCH_NET_H
#define KOLO_BENCH_NET_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* the one connection a server takes on port */
static inline int bench_accept(int port)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) {
        perror("listen");
        exit(1);
    }
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) {
        perror("accept");
        exit(1);
    }
    close(ls);
    return fd;
}

/* a connection to host:port, retried for 5 s (the server may be starting) */
static inline int bench_connect(const char *host, int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "not an IPv4 address: %s\n", host);
        exit(2);
    }
    for (int tries = 0; tries < 100; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
            return fd;
        close(fd);
        usleep(50000);
    }
    perror("connect");
    exit(1);
}

#endif
