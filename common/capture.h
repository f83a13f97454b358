/*
 * capture.h - run a short helper program and collect what it prints: the
 * coordinator's host discovery script, Slurm's scontrol and squeue. Every
 * run has a deadline and an output cap, so a helper that hangs or floods
 * cannot stall its caller.
 */
#ifndef KOLO_COMMON_CAPTURE_H
#define KOLO_COMMON_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

/* capture_run runs argv (argv[0] looked up on PATH) with stdin from
 * /dev/null, in a process group of its own, and reads its stdout. It
 * returns 0 with the output in *out (NUL-terminated; the caller frees)
 * when the program exits with code 0 within timeout_ms after printing at
 * most max_out bytes. Otherwise the whole group is killed (on a timeout or
 * too much output) and it returns KOLO_ESYS (could not start it),
 * KOLO_EIO (it failed) or KOLO_ENOMEM, with a reason in err that names
 * `what` ("the host discovery script exited with code 2"). stderr is
 * left to the caller's. */
int capture_run(char *const argv[], const char *what, uint64_t timeout_ms, size_t max_out,
                char **out, char *err, size_t errlen);

#endif
