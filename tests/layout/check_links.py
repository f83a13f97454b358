#!/usr/bin/env python3
"""Every relative link of the README and of docs/*.md resolves: the file
(or folder) it names exists, and an anchor (#section) names a heading of
that page, spelled as GitHub spells heading anchors. Links to other sites
are not followed (tests run offline)."""
import glob
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path):
    """The anchors of a markdown file's headings, GitHub's way: lower case,
    punctuation dropped but '-' and '_', spaces made '-', repeats -1, -2."""
    seen, out = {}, set()
    fence = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else "%s-%d" % (slug, n))
    return out


def links(path):
    fence = False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            yield no, m.group(1)


def main():
    pages = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    bad = []
    for page in pages:
        for no, target in links(page):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            where = "%s:%d" % (os.path.relpath(page, ROOT), no)
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(dest):
                bad.append("%s: %s: no such file" % (where, target))
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append("%s: %s: no such section" % (where, target))
    for b in bad:
        print(b)
    print("%d page(s), %s" % (len(pages), "%d broken link(s)" % len(bad) if bad else "every link resolves"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
