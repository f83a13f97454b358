#!/usr/bin/python3
"""A strict check of a Prometheus text exposition (format 0.0.4), for the
coordinator's /metrics: reads it on stdin, exits 1 naming the first
problem. Checked:
  - every line is a comment, blank, or `name{labels} value`;
  - each metric family has one HELP and one TYPE line, before its samples,
    and its samples are contiguous;
  - names and label names are legal, label values are properly quoted and
    escaped, no sample (name + labels) appears twice;
  - values parse as floats (NaN, +Inf, -Inf allowed);
  - counters are named *_total and are not negative;
  - histograms have _bucket samples with `le`, cumulative (non-decreasing)
    counts in increasing `le` order, a +Inf bucket equal to _count, and
    _sum; a gauge or counter has no such suffixed samples;
  - the names kolo documents for the elastic and reporting features are there.
Where Prometheus's own promtool is on PATH (Debian's prometheus package;
scripts/test.sh does not install it, since on a machine with systemd the
package also starts a Prometheus server), `promtool check metrics` must
pass as well.
"""
import math
import re
import shutil
import subprocess
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*$")
REQUIRED = ["kolo_build_info", "kolo_members", "kolo_membership_changes_total",
            "kolo_negotiation_wait_seconds", "kolo_reset_duration_seconds",
            "kolo_stale_generation_rejects_total", "kolo_auth_failures_total",
            "kolo_store_errors_total", "kolo_output_writer_pending", "kolo_degraded", "kolo_snapshots_committed_total",
            "kolo_snapshot_commit_seconds", "kolo_host_exclusions_total"]


def fail(lineno, msg):
    print("metrics line %d: %s" % (lineno, msg))
    sys.exit(1)


def parse_labels(text, lineno):
    labels, i = {}, 0
    while i < len(text):
        m = re.match(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)=\"", text[i:])
        if not m:
            fail(lineno, "bad label syntax in {%s}" % text)
        name = m.group(1)
        i += m.end()
        value = []
        while True:
            if i >= len(text):
                fail(lineno, "unterminated label value")
            ch = text[i]
            if ch == "\\":
                if i + 1 >= len(text) or text[i + 1] not in "\\\"n":
                    fail(lineno, "bad escape in a label value")
                value.append({"n": "\n"}.get(text[i + 1], text[i + 1]))
                i += 2
                continue
            if ch == "\"":
                i += 1
                break
            value.append(ch)
            i += 1
        if name in labels:
            fail(lineno, "label %s twice" % name)
        labels[name] = "".join(value)
        m = re.match(r"\s*,?", text[i:])
        i += m.end()
    return labels


def family_of(name, types):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) == "histogram":
            return name[:-len(suffix)]
    return name


def promtool(text):
    tool = shutil.which("promtool")
    if not tool:
        return
    p = subprocess.run([tool, "check", "metrics"], input=text, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=30)
    if p.returncode != 0:
        print("metrics: promtool check metrics failed:\n" + p.stdout)
        sys.exit(1)
    print("metrics: promtool check metrics ok")


def main():
    helps, types, seen, order, done = {}, {}, set(), [], set()
    samples = {}
    current = None
    text = sys.stdin.read()
    promtool(text)
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    fail(lineno, "bad metric name %r" % name)
                table = helps if parts[1] == "HELP" else types
                if name in table:
                    fail(lineno, "second %s for %s" % (parts[1], name))
                if name in done:
                    fail(lineno, "%s for %s after its samples" % (parts[1], name))
                if parts[1] == "TYPE":
                    if len(parts) < 4 or parts[3] not in ("counter", "gauge", "histogram",
                                                          "summary", "untyped"):
                        fail(lineno, "bad TYPE line")
                    types[name] = parts[3]
                else:
                    helps[name] = parts[3] if len(parts) > 3 else ""
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$", line)
        if not m:
            fail(lineno, "not a sample: %r" % line)
        name, labels = m.group(1), parse_labels(m.group(3) or "", lineno)
        try:
            value = float(m.group(4))
        except ValueError:
            fail(lineno, "bad value %r" % m.group(4))
        fam = family_of(name, types)
        if fam not in types or fam not in helps:
            fail(lineno, "%s has no HELP and TYPE before it" % fam)
        if fam != current:
            if fam in done:
                fail(lineno, "samples of %s are not contiguous" % fam)
            if current:
                done.add(current)
            current = fam
            order.append(fam)
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            fail(lineno, "sample %s%s twice" % (name, labels))
        seen.add(key)
        kind = types[fam]
        if kind == "counter":
            if not fam.endswith("_total"):
                fail(lineno, "counter %s is not named *_total" % fam)
            if value < 0:
                fail(lineno, "counter %s is negative" % fam)
        if kind == "histogram" and name == fam:
            fail(lineno, "histogram %s has a bare sample" % fam)
        samples.setdefault(fam, []).append((name, labels, value, lineno))
    for fam, kind in types.items():
        if kind != "histogram" or fam not in samples:
            continue
        series = {}
        for name, labels, value, lineno in samples[fam]:
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            series.setdefault(rest, {"buckets": [], "sum": None, "count": None})
            s = series[rest]
            if name.endswith("_bucket"):
                if "le" not in labels:
                    fail(lineno, "%s bucket without le" % fam)
                le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
                s["buckets"].append((le, value, lineno))
            elif name.endswith("_sum"):
                s["sum"] = value
            else:
                s["count"] = value
        for s in series.values():
            b = s["buckets"]
            if not b or b[-1][0] != math.inf:
                fail(b[-1][2] if b else 0, "%s has no +Inf bucket last" % fam)
            for (le0, v0, _), (le1, v1, ln) in zip(b, b[1:]):
                if le1 <= le0 or v1 < v0:
                    fail(ln, "%s buckets are not increasing and cumulative" % fam)
            if s["count"] is None or s["sum"] is None or s["count"] != b[-1][1]:
                fail(b[-1][2], "%s: _count must equal the +Inf bucket, with a _sum" % fam)
    missing = [n for n in REQUIRED if n not in types]
    if missing:
        print("metrics: missing %s" % ", ".join(missing))
        sys.exit(1)
    print("metrics: %d families, %d samples, format ok" % (len(types), len(seen)))


if __name__ == "__main__":
    main()
