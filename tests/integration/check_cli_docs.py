#!/usr/bin/env python3
"""Every command's --help against docs/cli.md (issue 33): each flag that
`kolo CMD --help` lists has a description there and is documented for
that command in docs/cli.md,
each flag docs/cli.md documents for a command is in its --help, and where
--help shows a default, the documentation says the same one.

docs/cli.md marks which commands a table documents with a comment line
before it, `<!-- help: kolo run -->` or several commands at once
(`<!-- help: kolo status, kolo jobs -->`, `<!-- help: every command -->`).
A row documents the flags spelled in its flag columns (headed `flag`,
`horovodrun` or `kolo run`; "same" repeats the column before); its
default is its `default` column, or the words "default X" in the row.

KOLO is the kolo binary; the commands are the ones `kolo --help` lists."""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KOLO = os.environ.get("KOLO") or os.path.join(ROOT, "build", "bin", "kolo")
FLAG = re.compile(r"^(--?\[?n?o?-?\]?[A-Za-z][\w-]*)")
COLUMN = 30  # where --help's descriptions start (common/knobs.c, python/kolo/tune.py)


def commands():
    out = subprocess.run([KOLO, "--help"], capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.split("commands:", 1)[1].splitlines():
        m = re.match(r"^  ([a-z_]+(?:, [a-z_]+)*)(?:  |$)", line)
        if m:
            names += [n.strip() for n in m.group(1).split(",")]
    return [n for n in names if n != "version"]


def help_flags(cmd):
    """{spelling: (canonical, default or None, kind)} of `kolo cmd --help`."""
    out = subprocess.run([KOLO, cmd, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit("kolo %s --help: exit %d: %s" % (cmd, out.returncode, out.stderr))
    entries, cur = [], None
    for line in out.stdout.splitlines():
        if re.match(r"^  -", line):
            flags, text = line[2:COLUMN].rstrip(), line[COLUMN:]
            if len(line) < COLUMN or line[COLUMN - 1] != " ":  # too wide: text on the next line
                flags, text = line[2:].strip(), ""
            cur = [flags, text]
            entries.append(cur)
        elif cur and line.startswith(" " * COLUMN):
            cur[1] += " " + line.strip()
        else:
            cur = None
    flags = {}
    for spellings, text in entries:
        if not text.strip():
            raise SystemExit("kolo %s --help: %s has no description" % (cmd, spellings))
        kind = re.search(r"<(\w+)>", spellings)
        kind = kind.group(1) if kind else "bool"
        names = [s.split(" ")[0] for s in spellings.split(", ")]
        canonical = names[-1]
        d = re.search(r"\(default ([^,)]+)", text)
        default = d.group(1).strip() if d else None
        if kind == "bool" and default == "false":
            default = None  # a switch that is off unless given: nothing to document
        for n in names:
            flags[n] = (canonical, default, kind)
    return flags


def doc_tables():
    """[(commands, header cells, rows of cells)] of docs/cli.md's marked tables."""
    lines = open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read().splitlines()
    tables, i = [], 0
    while i < len(lines):
        m = re.match(r"^<!-- help: (.*) -->$", lines[i].strip())
        i += 1
        if not m:
            continue
        cmds = [c.strip().replace("kolo ", "") for c in m.group(1).split(",")]
        while i < len(lines) and not lines[i].startswith("|"):
            i += 1
        rows = []
        while i < len(lines) and lines[i].startswith("|"):
            rows.append(split_row(lines[i]))
            i += 1
        tables.append((cmds, rows[0], [r for r in rows[2:]]))
    return tables


def split_row(line):
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip() for c in cells]


def spellings(cell):
    """The flags a flag cell spells: each backticked word that is a flag;
    --[no-]x is --x and --no-x."""
    out = []
    for code in re.findall(r"`([^`]+)`", cell):
        m = FLAG.match(code)
        if not m:
            continue
        f = m.group(1)
        if "[no-]" in f:
            out += [f.replace("[no-]", ""), f.replace("[no-]", "no-")]
        else:
            out.append(f)
    return out


UNITS = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "k": 1 << 10, "m_": 1 << 20, "g": 1 << 30}


def norm(value, kind):
    """A default as a comparable value: durations in ms (a bare number in
    the docs is seconds), sizes in bytes, on/off as true/false."""
    v = value.strip().strip("`'\"").strip().lower()
    v = {"off": "false", "on": "true"}.get(v, v)
    m = re.match(r"^(\d+)\s*(ms|s|m|h)?$", v)
    if kind in ("duration", "seconds") and m:
        return int(m.group(1)) * UNITS[m.group(2) or "s"]
    m = re.match(r"^(\d+)\s*([kmg])(i?b)?$", v)
    if kind == "size" and m:
        return int(m.group(1)) * UNITS[m.group(2) + ("_" if m.group(2) == "m" else "")]
    return v


def doc_defaults(header, row):
    """The default(s) a row states: its default column, and each
    "default X" in its text."""
    out = []
    for h, c in zip(header, row):
        if h.lower() == "default" and c and c not in ("—", "-"):
            code = re.match(r"^`([^`]+)`", c)  # `0`: its GPUs, else its CPUs
            out.append(code.group(1) if code else c)
    for m in re.finditer(r"[Dd]efault:? (`[^`]+`|[^\s,;.)`:]+)", " ".join(row)):
        out.append(m.group(1))
    return out


def main():
    tables = doc_tables()
    problems = []
    cmds = commands()
    for cmd in cmds:
        helped = help_flags(cmd)
        if "--help" not in helped or len(helped) < 3:  # the parser lost its way
            problems.append("kolo %s --help: read only %s" % (cmd, sorted(helped)))
        documented = {}
        for names, header, rows in tables:
            if cmd not in names and "every command" not in names:
                continue
            cols = [i for i, h in enumerate(header) if h.lower() in ("flag", "horovodrun", "kolo run")]
            for row in rows:
                found = []
                for i in cols:
                    cell = row[i] if i < len(row) else ""
                    if cell.startswith("same") and found:
                        continue
                    found += spellings(cell)
                for f in found:
                    documented.setdefault(f, (header, row))
        for f, (canonical, default, kind) in sorted(helped.items()):
            if f == canonical and f not in documented and not any(
                    n in documented for n, v in helped.items() if v[0] == canonical):
                problems.append("kolo %s: %s is in --help, not in docs/cli.md" % (cmd, f))
                continue
            if f != canonical or default is None:
                continue
            rows = [documented[n] for n, v in helped.items() if v[0] == canonical and n in documented]
            stated = [d for header, row in rows for d in doc_defaults(header, row)]
            if not any(norm(d, kind) == norm(default, kind) for d in stated):
                problems.append("kolo %s: %s: --help's default is %s, docs/cli.md says %s" % (
                    cmd, f, default, " / ".join(stated) or "none"))
        for f in sorted(documented):
            base = re.sub(r"^--no-", "--", f)
            if f not in helped and not (base in helped and helped[base][2] == "bool"):
                problems.append("kolo %s: docs/cli.md documents %s, --help has no such flag" % (cmd, f))
    for p in problems:
        print(p)
    print("%d command(s), %s" % (len(cmds), "%d problem(s)" % len(problems) if problems else
                                 "--help and docs/cli.md agree"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
