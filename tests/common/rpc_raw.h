/*
 * rpc_raw.h - plain sockets for the RPC tests that speak nng's TCP framing
 * by hand (test_rpc.c, test_rpc_trust.c): every byte and every close in
 * the test's control, and no nng in a forked child.
 */
#ifndef KOLO_TESTS_RPC_RAW_H
#define KOLO_TESTS_RPC_RAW_H

#include <stdint.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

/* A connection to 127.0.0.1:port whose reads give up after 3 s, or -1. */
static inline int raw_tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Reads exactly len bytes: 0, or -1 at an end, an error or the timeout. */
static inline int read_full(int fd, void *buf, size_t len)
{
    for (size_t got = 0; got < len;) {
        ssize_t n = read(fd, (uint8_t *)buf + got, len - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

#endif
