#!/usr/bin/env python3
"""Layout check (issue 11): no import cycle between src files or between src folders,
src/ root holds only lib.rs, error.rs, store.rs and folders, and no src file is over
1,200 lines unless it states why in a `//! Size:` line at its top.

An arrow is any `crate::a::b` path in code (comments and strings outside `use` lines are
skipped), resolved to the deepest file that exists; `crate::Name` (a lib.rs re-export) is
refused inside src/, so every arrow names its module. Declaring a child module (`mod x;`)
is containment, not an arrow; a parent that *uses* its child counts like any other file.
Unit tests (`#[cfg(test)] mod tests`, at the end of a file, or moved to its own
`tests.rs` beside it) may use any layer.
"""
import os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
ROOT = os.path.normpath(ROOT)
LINES_MAX = 1200
ALLOWED_ROOT = {"lib.rs", "error.rs", "store.rs"}

def module_file(parts):
    """The file of module path parts (relative to src), or None."""
    base = os.path.join(ROOT, *parts)
    for cand in (base + ".rs", os.path.join(base, "mod.rs")):
        if os.path.isfile(cand):
            return os.path.relpath(cand, ROOT)
    return None

def file_module(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts == ["lib"]:
        return []
    return parts

def strip_comments(text):
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("//"):
            continue
        # drop trailing comments and string literals (rough, enough for paths)
        line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
        line = line.split("//")[0]
        out.append(line)
    return "\n".join(out)

def expand_use_groups(text):
    """`use crate::a::{b, c::D}` -> crate::a::b crate::a::c::D (one level of braces)."""
    paths = []
    for m in re.finditer(r"crate::((?:[a-z_][a-z0-9_]*::)*)\{([^{}]*)\}", text):
        prefix = m.group(1)
        for item in m.group(2).split(","):
            item = item.strip().split(" as ")[0].strip()
            if item and item != "self":
                paths.append("crate::" + prefix + item)
            elif item == "self":
                paths.append("crate::" + prefix.rstrip(":"))
    return paths

def without_tests(text):
    """Code before the file's `#[cfg(test)] mod tests` (tests may use any layer)."""
    m = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod tests", text, re.M)
    return text[: m.start()] if m else text

def arrows(rel, text):
    if os.path.basename(rel) == "tests.rs":
        return set(), []  # a file's unit tests, moved out of it: any layer
    text = strip_comments(without_tests(text))
    paths = re.findall(r"crate(?:::[A-Za-z_][A-Za-z0-9_]*)+", text) + expand_use_groups(text)
    found, errors = set(), []
    for p in paths:
        parts = p.split("::")[1:]
        if parts and parts[0][:1].isupper():
            errors.append(f"{rel}: `{p}` goes through a lib.rs re-export; name the module")
            continue
        target = None
        for n in range(len(parts), 0, -1):
            f = module_file(parts[:n])
            if f:
                target = f
                break
        if target and target != rel:
            found.add(target)
    return found, errors

def find_cycle(graph):
    color, stack = {}, []
    def visit(n):
        color[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if not color.get(m):
                c = visit(m)
                if c:
                    return c
        stack.pop()
        color[n] = 2
        return None
    for n in sorted(graph):
        if not color.get(n):
            c = visit(n)
            if c:
                return c
    return None

def main():
    problems = []
    files = []
    for d, _, names in os.walk(ROOT):
        for n in names:
            if n.endswith(".rs"):
                files.append(os.path.relpath(os.path.join(d, n), ROOT))
    for n in os.listdir(ROOT):
        if os.path.isfile(os.path.join(ROOT, n)) and n not in ALLOWED_ROOT:
            problems.append(f"src/{n}: src/ root holds only lib.rs, error.rs, store.rs and folders")
    graph = {}
    for rel in sorted(files):
        text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
        lines = text.count("\n")
        if lines > LINES_MAX and "//! Size:" not in "\n".join(text.splitlines()[:40]):
            problems.append(f"src/{rel}: {lines} lines (over {LINES_MAX}) with no `//! Size:` reason at its top")
        if rel == "lib.rs":
            continue  # the flat re-exports are the public API, not an arrow
        found, errs = arrows(rel, text)
        problems += errs
        graph[rel] = found
    c = find_cycle(graph)
    if c:
        problems.append("file import cycle: " + " -> ".join("src/" + x for x in c))
    # folders: src/<top>/... and src/<top>.rs collapse into <top>
    def top(rel):
        parts = rel.split(os.sep)
        return parts[0][:-3] if len(parts) == 1 else parts[0]
    fgraph = {}
    for a, bs in graph.items():
        for b in bs:
            if top(a) != top(b):
                fgraph.setdefault(top(a), set()).add(top(b))
    c = find_cycle(fgraph)
    if c:
        problems.append("folder import cycle: " + " -> ".join(c))
    if "-v" in sys.argv:
        for a in sorted(fgraph):
            print(f"{a} -> {', '.join(sorted(fgraph[a]))}")
    for p in problems:
        print(p)
    print(f"layout: {len(files)} files, {sum(len(v) for v in graph.values())} arrows, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0

if __name__ == "__main__":
    sys.exit(main())
