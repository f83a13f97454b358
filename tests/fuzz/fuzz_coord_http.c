/*
 * fuzz_coord_http.c - libFuzzer harness for the HTTP side of a real
 * coordinator: nng's request parser, kolo's router, REST handlers, query
 * and JSON parsing, bearer checks. Each input is written raw on a new
 * loopback connection to the coordinator's HTTP port (a token is set, so
 * writes need `Authorization: Bearer`); whatever comes back must be an
 * HTTP response or nothing, within the deadline, and every 256 inputs
 * /healthz must still answer 200.
 */
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "fuzz_coord.h"

static struct coord *coord;
static int port;
static unsigned inputs;

static void start(void)
{
    coord = fuzz_coord_start("inproc://kolo-fuzz-http", "127.0.0.1:0");
    const char *colon = strrchr(coord_http_url(coord), ':');
    port = colon ? atoi(colon + 1) : 0;
    if (port <= 0)
        abort();
}

/* Sends len bytes on a new connection and reads the answer into out
 * (NUL-terminated, at most outlen - 1 bytes); the bytes read. */
static size_t exchange(const void *data, size_t len, char *out, size_t outlen)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    /* a reset, not TIME_WAIT: thousands of inputs a minute */
    struct linger off = {.l_onoff = 1, .l_linger = 0};
    struct timeval tv = {.tv_sec = 5};
    if (s < 0)
        abort();
    setsockopt(s, SOL_SOCKET, SO_LINGER, &off, sizeof off);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t got = 0;
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(s); /* the machine's ports, not kolo: skip this input */
        out[0] = '\0';
        return 0;
    }
    if (len && write(s, data, len) != (ssize_t)len)
        abort();
    shutdown(s, SHUT_WR);
    for (;;) {
        ssize_t n = read(s, out + got, outlen - 1 - got);
        if (n <= 0 || (got += (size_t)n) == outlen - 1)
            break;
    }
    close(s);
    out[got] = '\0';
    return got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char out[1 << 16];
    if (!coord)
        start();
    if (size > 8192)
        size = 8192; /* within the socket buffer: the write never blocks */
    size_t got = exchange(data, size, out, sizeof out);
    if (got >= 5 && memcmp(out, "HTTP/", 5) != 0) {
        fprintf(stderr, "fuzz_coord_http: not an HTTP response: %.80s\n", out);
        abort();
    }
    if (++inputs % 256 == 0) {
        static const char health[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        exchange(health, sizeof health - 1, out, sizeof out);
        if (strncmp(out, "HTTP/1.1 200", 12) != 0) {
            fprintf(stderr, "fuzz_coord_http: /healthz answers %.80s\n", out);
            abort();
        }
    }
    return 0;
}
