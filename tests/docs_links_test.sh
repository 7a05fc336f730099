#!/usr/bin/env bash
# The documentation holds together: every relative link of README.md,
# BENCHMARKS.md, docs/*.md and bench/*.md names a file that exists (and, with
# #anchor, a heading of that file, as GitHub makes anchors), the README stays a
# first screen (at most 250 lines) and keeps the two commands verbatim.
# Usage: docs_links_test.sh [REPO_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
exec python3 - "$root" <<'EOF'
import os, re, sys

root = sys.argv[1]
files = [f for f in ["README.md", "BENCHMARKS.md"] if os.path.exists(os.path.join(root, f))]
for d in ["docs", "bench"]:
    if os.path.isdir(os.path.join(root, d)):
        files += sorted(os.path.join(d, f) for f in os.listdir(os.path.join(root, d)) if f.endswith(".md"))

def outside_code(text):
    """The lines of a markdown text outside fenced code blocks."""
    fence = None
    for line in text.split("\n"):
        m = re.match(r"\s*(```|~~~)", line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None:
            yield line

def anchors(path):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to '-', -N for repeats."""
    seen, out = {}, set()
    for line in outside_code(open(path, encoding="utf-8").read()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out

errors = []
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
for f in files:
    path = os.path.join(root, f)
    for lineno, line in enumerate(outside_code(open(path, encoding="utf-8").read()), 1):
        for target in link.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                errors.append(f"{f}: link to {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                errors.append(f"{f}: link to {target}: no heading with that anchor")

readme = os.path.join(root, "README.md")
text = open(readme, encoding="utf-8").read()
lines = text.count("\n")
if lines > 250:
    errors.append(f"README.md: {lines} lines, more than 250: move reference text to docs/")
for command in ["bash scripts/demo.sh", "bash scripts/test.sh"]:
    if command not in text:
        errors.append(f"README.md: the command '{command}' is missing")

for e in errors:
    print(e)
print(f"{len(files)} files checked, {len(errors)} problems")
sys.exit(1 if errors else 0)
EOF
