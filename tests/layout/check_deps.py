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

Inside coordinator/, the layers (docs/design.md, "Layout") point down only:

    model   coord_model.h (state), coord.h (the public face)
    core    coord_core, coord_hosts, coord_jobs, coord_writer, placement,
            coord_static, coord_verdict
    domain  coord_negot (+ coord_rendezvous), coord_elastic, coord_snap, coord_report,
            coord_timeline, coord_study, coord_stacks
    api     coord_api.h: coord.c, coord_http*.c, coord_main.c

A file may include the headers of its own layer and those below. A header is found by
its name in the parts' folders (generated kolo.pb-c.h belongs to proto).

Inside worker/, the folders are layers (docs/design.md, "Layout"):

    runtime    the context and what drives it (may include everything below)
    gpu        the CUDA/NCCL pieces: coll, transport and base below it
    coll       the algorithms: transport and base below it
    transport  the byte movers: base only
    base       the files at worker/'s root (settings: the knob table every
               layer reads); they include nothing of the folders

Every .c and .h of worker/ must sit in one of them. Inside runtime/, the
engine (ctx, ops, fastpath, timeline: they hand the executor token to
each other) may include any runtime header; the files below it only
those in RUNTIME_MAY_INCLUDE, so the executors and the services never
call back up into the engine (ctx_model.h is the state all of them
share).
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
    "coord_verdict.h": "core",
    "coord_negot.h": "domain", "coord_negot_int.h": "domain",
    "coord_elastic.h": "domain", "coord_snap.h": "domain",
    "coord_report.h": "domain", "coord_timeline.h": "domain", "coord_study.h": "domain",
    "coord_stacks.h": "domain",
    "coord_api.h": "api",
}
# .c files whose own header is not <name>.h
COORD_FILE_LAYER = {"coord.c": "api", "coord_main.c": "api", "coord_http.c": "api",
                    "coord_http_guard.c": "api", "coord_http_report.c": "api",
                    "coord_rendezvous.c": "domain"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def includes(path):
    """(line number, header) of each #include "..." of the file at path"""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            m = INCLUDE.match(line)
            if m:
                yield lineno, m.group(1)


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
                for lineno, header in includes(path):
                    owner = where.get(header)
                    if owner is None:
                        bad.append("%s:%d: includes %s, which no part holds" %
                                   (os.path.relpath(path, ROOT), lineno, header))
                    elif owner not in allowed:
                        bad.append("%s:%d: %s includes %s (%s), against the layout rules" %
                                   (os.path.relpath(path, ROOT), lineno, part, header, owner))
    bad += coordinator_layers()
    bad += worker_layers()
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
        for lineno, header in includes(os.path.join(folder, f)):
            theirs = COORD_HEADER_LAYER.get(header)
            if theirs and COORD_LAYERS.index(theirs) > COORD_LAYERS.index(layer):
                bad.append("coordinator/%s:%d: %s (%s) includes %s (%s), a layer above" %
                           (f, lineno, f, layer, header, theirs))
    return bad


WORKER_ALLOWED = {
    "runtime": {"runtime", "gpu", "coll", "transport", "base"},
    "gpu": {"gpu", "coll", "transport", "base"},
    "coll": {"coll", "transport", "base"},
    "transport": {"transport", "base"},
    "base": {"base"},
}


# runtime/ files below the engine: the runtime headers each may include
# (a .c and its .h share the entry)
RUNTIME_MAY_INCLUDE = {
    "time_split": set(),
    "ctx_model": {"ctx_model.h", "time_split.h"},
    "plan": {"plan.h"},
    "report_rate": set(),
    "report": {"report.h", "ctx_model.h", "report_rate.h"},
    "snapshot": {"snapshot.h", "ctx_model.h"},
    "solo": {"solo.h", "ctx_model.h", "ops.h"},
    "nccl_exec": {"nccl_exec.h", "ctx_model.h", "ops.h", "plan.h"},
    "exec": {"exec.h", "ctx_model.h", "ops.h", "nccl_exec.h", "plan.h"},
}


def worker_layers():
    """Violations of worker/'s layers: a file includes a worker header
    only from its own layer or one it may use (WORKER_ALLOWED)."""
    folder = os.path.join(ROOT, "worker")
    files = []  # (path relative to worker/, layer)
    layer_of = {}  # header name -> layer
    for dirpath, _, names in os.walk(folder):
        rel = os.path.relpath(dirpath, folder)
        layer = "base" if rel == "." else rel.split(os.sep)[0]
        for f in names:
            if f.endswith((".c", ".h")):
                files.append((os.path.normpath(os.path.join(rel, f)), layer))
                if f.endswith(".h"):
                    layer_of[f] = layer
    bad = []
    for rel, layer in sorted(files):
        if layer not in WORKER_ALLOWED:
            bad.append("worker/%s: in no layer (tests/layout/check_deps.py)" % rel)
            continue
        name = os.path.basename(rel)
        stem = os.path.splitext(name)[0]
        for lineno, header in includes(os.path.join(folder, rel)):
            theirs = layer_of.get(header)
            if theirs and theirs not in WORKER_ALLOWED[layer]:
                bad.append("worker/%s:%d: %s (%s) includes %s (%s), against the layers" %
                           (rel, lineno, name, layer, header, theirs))
            if (layer == "runtime" and theirs == "runtime" and stem in RUNTIME_MAY_INCLUDE
                    and header not in RUNTIME_MAY_INCLUDE[stem]):
                bad.append("worker/%s:%d: %s includes %s, above it in the runtime" %
                           (rel, lineno, name, header))
    return bad


if __name__ == "__main__":
    sys.exit(main())
