/*
 * errors.h - kolo's error codes for every component.
 *
 * The table itself lives in include/kolo.h (KOLO_ERRORS), because libkolo
 * hands these codes to users; the daemons use the same table, so a code
 * means the same thing in a log line, on the wire and in Python.
 */
#ifndef KOLO_COMMON_ERRORS_H
#define KOLO_COMMON_ERRORS_H

#include "kolo.h"

#endif
