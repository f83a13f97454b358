/*
 * fuzz_hello.c - libFuzzer harness for the data plane's handshake on the
 * accepting side (worker/transport/transport_tcp.c): the bytes a stranger can send
 * to a rank's data port. Each input arrives on a real loopback connection
 * and ends with the sender's EOF; the acceptor must refuse or accept it
 * without crashing, and never hand out a connection whose proof is wrong.
 */
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "errors.h"
#include "transport.h"
#include "util.h"

static int lfd = -1, port;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (lfd < 0 && tcp_listen("127.0.0.1", &lfd, &port) != 0)
        abort();
    if (size > 4096)
        size = 4096; /* within the socket buffer: the write never blocks */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    /* closed with a reset (linger 0): tens of thousands of inputs a minute
     * would otherwise fill the ephemeral ports with TIME_WAIT */
    struct linger off = {.l_onoff = 1, .l_linger = 0};
    if (s < 0)
        abort();
    setsockopt(s, SOL_SOCKET, SO_LINGER, &off, sizeof off);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(s); /* the machine's ports, not kolo: skip this input */
        return 0;
    }
    if (size && write(s, data, size) != (ssize_t)size)
        abort();
    shutdown(s, SHUT_WR);
    struct tcp_ident me = {.job = 7, .generation = 3, .rank = 0, .key = "fuzz key, thirty-two bytes long"};
    struct xport *x = NULL;
    int rc = tcp_accept(lfd, &me, now_mono_ms() + 200, &x);
    if (rc == 0) {
        unsigned char byte;
        /* the proof must fail: nobody here holds the key */
        if (xport_recv(x, &byte, 1, now_mono_ms() + 200) == 0)
            abort();
    }
    close(s); /* the reset first, then our end: no TIME_WAIT on either */
    if (x)
        xport_close(x);
    return 0;
}
