/*
 * transport.c - the blocking helpers every transport shares.
 *
 * DESIGN. xport_sendrecv is the one loop: xport_send and xport_recv are
 * its one-sided cases. It alternates try_send on one connection and
 * try_recv on the other, so neither direction waits for the other; that
 * is what keeps two ranks that send large buffers to each other (a ring
 * step) from deadlocking on full buffers. When neither side moves:
 *
 *   1. If a connection is memory based (ops->spin) or set to spin (TCP
 *      when every local rank has a CPU: x->spin), retry for a short
 *      spin window with a pause instruction: a peer that is running on
 *      another core usually answers within microseconds, far less than a
 *      sleep and wake-up cost.
 *   2. Otherwise arm both connections, retry once (the arm is what makes
 *      the peer signal us, so data that came in just before it would
 *      otherwise be slept on), then poll() both fds until the deadline,
 *      and disarm.
 *
 * Every wait is bounded by the deadline, and nothing loops without
 * sleeping once the spin window is over.
 */
#include "transport.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "errors.h"
#include "settings.h"
#include "util.h"

#define SPIN_US_DEFAULT 20
#define SPIN_US_MAX     10000

/* -1: not read from the environment yet. Written once (or by the
 * override), read by every wait, hence an atomic. */
static _Atomic int spin_us_setting = -1;

static int spin_us_from_env(void)
{
    int64_t v = settings_int(SET_SPIN_US, SPIN_US_DEFAULT);
    return v > SPIN_US_MAX ? SPIN_US_MAX : (int)v;
}

int xport_spin_us(void)
{
    int v = spin_us_setting;
    if (v < 0) {
        /* Two threads may both read the environment; they get the same
         * answer, so the race is harmless. */
        v = spin_us_from_env();
        spin_us_setting = v;
    }
    return v;
}

void xport_set_spin_us(int us)
{
    spin_us_setting = us < 0 ? -1 : (us > SPIN_US_MAX ? SPIN_US_MAX : us);
}

ssize_t xport_fail(struct xport *x, int code, const char *fmt, ...)
{
    if (!x->failed) {
        x->failed = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->why, sizeof x->why, fmt, ap);
        va_end(ap);
    }
    return -(ssize_t)x->failed;
}

/* One direction of a transfer in progress. */
struct leg {
    struct xport *x;
    bool send;
    char *buf; /* const for a send; try_send takes it back as const */
    size_t len, done;
};

static bool leg_open(const struct leg *l)
{
    return l->x && l->done < l->len;
}

/* Moves what it can without blocking; 0 or a KOLO_E* code. */
static int leg_try(struct leg *l, bool *moved)
{
    if (!leg_open(l))
        return 0;
    ssize_t n = l->send ? l->x->ops->try_send(l->x, l->buf + l->done, l->len - l->done)
                        : l->x->ops->try_recv(l->x, l->buf + l->done, l->len - l->done);
    if (n < 0)
        return (int)-n;
    if (n > 0) {
        l->done += (size_t)n;
        *moved = true;
    }
    return 0;
}

static int timed_out(struct leg *legs, int nlegs)
{
    for (int i = 0; i < nlegs; i++) {
        struct leg *l = &legs[i];
        /* A partial transfer leaves the stream out of step with the
         * peer's idea of it; nobody can use the connection after that. */
        if (leg_open(l) && (l->done > 0 || (l->send && xport_mid_send(l->x))))
            xport_fail(l->x, KOLO_ETIMEDOUT, "timed out %s rank %d after %zu of %zu bytes",
                       l->send ? "sending to" : "receiving from", l->x->peer, l->done, l->len);
    }
    return KOLO_ETIMEDOUT;
}

/* Arms the open legs, retries once, and sleeps in poll() if still
 * nothing moves. 0 (woken, or moved) or a KOLO_E* code. */
static int wait_legs(struct leg *legs, int nlegs, uint64_t deadline)
{
    struct pollfd pfd[2];
    struct xport *armed[2];
    int narmed = 0;

    /* The same connection in both legs is armed once, for both. */
    bool same = nlegs == 2 && leg_open(&legs[0]) && leg_open(&legs[1]) && legs[0].x == legs[1].x;
    for (int i = 0; i < nlegs; i++) {
        struct leg *l = &legs[i];
        if (!leg_open(l) || (same && i == 1))
            continue;
        bool want_send = same || l->send, want_recv = same || !l->send;
        short events = 0;
        int fd = l->x->ops->arm(l->x, want_send, want_recv, &events);
        if (fd < 0) {
            for (int k = 0; k < narmed; k++)
                if (armed[k]->ops->disarm)
                    armed[k]->ops->disarm(armed[k]);
            return l->x->failed ? l->x->failed : KOLO_ESYS;
        }
        pfd[narmed].fd = fd;
        pfd[narmed].events = events;
        pfd[narmed].revents = 0;
        armed[narmed++] = l->x;
    }

    bool moved = false;
    int rc = 0;
    for (int i = 0; i < nlegs && rc == 0; i++)
        rc = leg_try(&legs[i], &moved);

    if (rc == 0 && !moved) {
        int timeout = -1;
        if (deadline) {
            uint64_t now = now_mono_ms();
            timeout = now >= deadline
                          ? 0
                          : (int)(deadline - now > INT32_MAX ? INT32_MAX : deadline - now);
        }
        if (poll(pfd, (nfds_t)narmed, timeout) < 0 && errno != EINTR)
            rc = KOLO_ESYS;
    }

    for (int k = 0; k < narmed; k++)
        if (armed[k]->ops->disarm)
            armed[k]->ops->disarm(armed[k]);
    return rc;
}

static int transfer(struct leg *legs, int nlegs, uint64_t deadline)
{
    bool spin = false;
    for (int i = 0; i < nlegs; i++) {
        if (legs[i].x && legs[i].x->failed && legs[i].len > 0)
            return legs[i].x->failed;
        if (leg_open(&legs[i]) && xport_spins(legs[i].x))
            spin = true;
    }
    uint64_t spin_ns = spin ? (uint64_t)xport_spin_us() * 1000u : 0;
    uint64_t idle_since = 0; /* start of the current spin window, 0 if moving */

    for (;;) {
        bool moved = false;
        for (int i = 0; i < nlegs; i++) {
            int rc = leg_try(&legs[i], &moved);
            if (rc)
                return rc;
        }
        bool open = false;
        for (int i = 0; i < nlegs; i++)
            open = open || leg_open(&legs[i]);
        if (!open)
            return 0;
        /* Checked even while data moves, so that a trickle cannot keep a
         * caller past its deadline. */
        if (deadline && now_mono_ms() >= deadline)
            return timed_out(legs, nlegs);
        if (moved) {
            idle_since = 0;
            continue;
        }
        if (spin_ns) {
            uint64_t t = now_mono_ns();
            if (!idle_since)
                idle_since = t;
            if (t - idle_since < spin_ns) {
                for (int k = 0; k < 8; k++)
                    cpu_relax();
                continue;
            }
        }
        int rc = wait_legs(legs, nlegs, deadline);
        if (rc)
            return rc;
        idle_since = 0;
    }
}

int xport_sendrecv(struct xport *xs, const void *sbuf, size_t slen, struct xport *xr, void *rbuf,
                   size_t rlen, uint64_t deadline)
{
    if ((slen && (!xs || !sbuf)) || (rlen && (!xr || !rbuf)))
        return KOLO_EINVAL;
    struct leg legs[2] = {
        {.x = xs, .send = true, .buf = (char *)(uintptr_t)sbuf, .len = slen},
        {.x = xr, .send = false, .buf = rbuf, .len = rlen},
    };
    return transfer(legs, 2, deadline);
}

int xport_send(struct xport *x, const void *buf, size_t len, uint64_t deadline)
{
    return xport_sendrecv(x, buf, len, NULL, NULL, 0, deadline);
}

int xport_recv(struct xport *x, void *buf, size_t len, uint64_t deadline)
{
    return xport_sendrecv(NULL, NULL, 0, x, buf, len, deadline);
}

void xport_close(struct xport *x)
{
    if (x)
        x->ops->close(x);
}
