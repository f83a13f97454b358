/* tcp_ident.h - who a test rank is on a TCP connection, with the key every
 * test rank shares (a test of the handshake itself passes its own). */
#ifndef KOLO_TESTS_TCP_IDENT_H
#define KOLO_TESTS_TCP_IDENT_H

#include "transport.h"

#define TEST_KEY "kolo test key: thirty-two bytes"
#define IDENT(j, g, r) (&(struct tcp_ident){.job = (j), .generation = (g), .rank = (r), .key = TEST_KEY})

#endif
