#!/usr/bin/env python3
"""The dependency rules of the tree (docs/design.md, "Layout"), checked on
every #include "..." of every .c and .h of each part:

    common  <- proto <- store <- coordinator
    common  <- proto <- agent
    common  <- proto <- worker        (libkolo; include/ is its public face)
    common  <- proto <- negotiation   (the rules, the response cache, the
                                       log, resume: for the coordinator
                                       and libkolo, no I/O)
    cli: the kolo binary, on top of everything

common depends on nothing of ours but the shared vocabulary
(include/kolo/abi.h), so it must not include kolo.h.

Inside coordinator/, the layers (README, "Layout") point down only:

    model   coord_model.h (state), coord.h (the public face)
    core    coord_core, coord_hosts, coord_jobs, coord_writer, placement,
            coord_static
    domain  coord_negot (+ coord_rendezvous), coord_elastic, coord_snap, coord_report,
            coord_timeline, coord_study
    api     coord_api.h: coord.c, coord_http*.c, coord_main.c

A file may include the headers of its own layer and those below. A header is found by
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
    "negotiation": {"negotiation", "common", "proto", "include/kolo"},
    "store": {"store", "common", "proto", "include/kolo"},
    "coordinator": {"coordinator", "store", "common", "proto", "negotiation", "dashboard",
                    "include/kolo"},
    "agent": {"agent", "common", "proto", "include/kolo"},
    "worker": {"worker", "common", "proto", "negotiation", "include", "include/kolo"},
    "include": {"include", "include/kolo"},
    "cli": set(PARTS) | {"include/kolo"},
}
COORD_LAYERS = ["model", "core", "domain", "api"]
COORD_HEADER_LAYER = {
    "coord.h": "model", "coord_model.h": "model",
    "coord_core.h": "core", "coord_hosts.h": "core", "coord_jobs.h": "core",
    "coord_writer.h": "core", "placement.h": "core", "coord_static.h": "core",
    "coord_negot.h": "domain", "coord_negot_int.h": "domain",
    "coord_elastic.h": "domain", "coord_snap.h": "domain",
    "coord_report.h": "domain", "coord_timeline.h": "domain", "coord_study.h": "domain",
    "coord_api.h": "api",
}
# .c files whose own header is not <name>.h
COORD_FILE_LAYER = {"coord.c": "api", "coord_main.c": "api", "coord_http.c": "api",
                    "coord_http_guard.c": "api", "coord_http_report.c": "api",
                    "coord_rendezvous.c": "domain"}
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
    bad += coordinator_layers()
    for b in bad:
        print(b)
    print("%d violation(s)" % len(bad) if bad else "ok: every include follows the layout rules")
    return 1 if bad else 0


def coordinator_layers():
    """Violations of the coordinator's layers; every file of coordinator/
    must have a layer."""
    bad = []
    folder = os.path.join(ROOT, "coordinator")
    for f in sorted(os.listdir(folder)):
        if not f.endswith((".c", ".h")):
            continue
        own = f if f.endswith(".h") else f[:-2] + ".h"
        layer = COORD_FILE_LAYER.get(f) or COORD_HEADER_LAYER.get(own)
        if layer is None:
            bad.append("coordinator/%s: in no layer (tests/layout/check_deps.py)" % f)
            continue
        with open(os.path.join(folder, f), encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                theirs = COORD_HEADER_LAYER.get(m.group(1)) if m else None
                if theirs and COORD_LAYERS.index(theirs) > COORD_LAYERS.index(layer):
                    bad.append("coordinator/%s:%d: %s (%s) includes %s (%s), a layer above" %
                               (f, lineno, f, layer, m.group(1), theirs))
    return bad


if __name__ == "__main__":
    sys.exit(main())
