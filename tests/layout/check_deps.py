#!/usr/bin/env python3
"""The dependency rules of the tree (docs/design.md, "Layout"), checked on
every #include "..." of every .c and .h of each part:

    common  <- proto <- store <- coordinator
    common  <- proto <- agent
    common  <- proto <- worker        (libkolo; include/ is its public face)
    negotiation: pure rules, for the coordinator and libkolo
    cli: the kolo binary, on top of everything

common depends on nothing of ours but the shared vocabulary
(include/kolo/abi.h), so it must not include kolo.h. A header is found by
its name in the parts' folders (generated kolo.pb-c.h belongs to proto).
Prints each violation as file:line and exits 1 if there is one."""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PARTS = ["common", "proto", "store", "coordinator", "agent", "worker", "negotiation", "cli",
         "include", "dashboard"]
ALLOWED = {
    "common": {"common", "include/kolo"},
    "proto": {"proto"},
    "negotiation": {"negotiation", "common", "include/kolo"},
    "store": {"store", "common", "proto", "include/kolo"},
    "coordinator": {"coordinator", "store", "common", "proto", "negotiation", "dashboard",
                    "include/kolo"},
    "agent": {"agent", "common", "proto", "include/kolo"},
    "worker": {"worker", "common", "proto", "negotiation", "include", "include/kolo"},
    "include": {"include", "include/kolo"},
    "cli": set(PARTS) | {"include/kolo"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def owners():
    """header name -> the part that holds it"""
    where = {"kolo.pb-c.h": "proto"}
    for part in PARTS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, part)):
            rel = os.path.relpath(dirpath, ROOT)
            for f in files:
                if f.endswith(".h"):
                    key = os.path.relpath(os.path.join(rel, f), part) if part == "include" else f
                    where.setdefault(key, "include/kolo" if key.startswith("kolo/") else part)
                    where.setdefault(f, where[key])
    return where


def main():
    where = owners()
    bad = []
    for part, allowed in ALLOWED.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, part)):
            for f in files:
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        owner = where.get(m.group(1))
                        if owner is None:
                            bad.append("%s:%d: includes %s, which no part holds" %
                                       (os.path.relpath(path, ROOT), lineno, m.group(1)))
                        elif owner not in allowed:
                            bad.append("%s:%d: %s includes %s (%s), against the layout rules" %
                                       (os.path.relpath(path, ROOT), lineno, part, m.group(1), owner))
    for b in bad:
        print(b)
    print("%d violation(s)" % len(bad) if bad else "ok: every include follows the layout rules")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
