#!/usr/bin/env python3
"""Fails when the files of a crate import each other in a cycle.

The house rule is that arrows point one way: if `a.rs` uses something from `b.rs`, nothing
`b.rs` uses (directly or through other files) comes from `a.rs`. This reads every `.rs` file
under each crate's `src/`, takes the paths it names (`use crate::…`, `use super::…`, inline
`crate::x::y` in code, brace groups expanded), resolves each to the file of the deepest module
it names, and reports every strongly connected component of more than one file, with one
edge of each cycle explained (which names the first file takes from the second).

Not counted: `mod x;` declarations (a parent declaring a child is not an import) and test
code (`#[cfg(test)]` modules, `tests.rs` files), which may look at anything.

Usage: scripts/check_cycles.py [CRATE_SRC_DIR ...]   (default: nokv-server/src nokv-client/src)
       scripts/check_cycles.py --self-test            (plants a cycle; must report it)
Exit status: 0 when there is no cycle, 1 otherwise.
"""

import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

DEFAULT_CRATES = ["nokv-server/src", "nokv-client/src"]
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# `use` statements (possibly spanning lines) and inline `crate::`/`super::` paths.
USE_STMT = re.compile(r"\buse\s+((?:crate|super|self)\b[^;]*);", re.S)
INLINE = re.compile(rf"\b((?:crate|super)(?:::{IDENT})+)")
TEST_MOD = re.compile(r"^#\[cfg\(test\)\]\s*\n(?:#\[[^\n]*\]\s*\n)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{",
                      re.M)


def module_of(src: Path, file: Path) -> tuple:
    """The module path of `file` within the crate rooted at `src` (lib.rs/main.rs = ())."""
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts = parts[:-1]
    return tuple(parts)


# Comments, string and char literals, matched left to right in one pass so that a `//` or an
# `r"` inside a string (or a quote inside a comment) is never taken for the start of another.
LITERAL = re.compile(
    r"//[^\n]*"
    r"|/\*.*?\*/"
    r'|(?<![A-Za-z0-9_])b?r(#*)"(?:.|\n)*?"\1'
    r'|b?"(?:\\.|[^"\\])*"'
    r"|'(?:\\.|[^'\\])'",
    re.S,
)


def without_literals(text: str) -> str:
    """`text` with comments removed and every string or char literal emptied; the line
    breaks they spanned stay, so line numbers still point into the file."""

    def blank(m: re.Match) -> str:
        lines = "\n" * m.group(0).count("\n")
        return lines if m.group(0).startswith("/") else '""' + lines

    return LITERAL.sub(blank, text)


def strip_code(text: str) -> str:
    """`text` without comments, string literals and `#[cfg(test)]` modules."""
    text = without_literals(text)
    m = TEST_MOD.search(text)
    if m:
        # Cut the test module: from its opening brace to the matching one.
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        text = text[: m.start()] + text[i + 1:]
    return text


def expand(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix: str, t: str):
        if "{" not in t:
            t = t.split("as")[0] if re.search(r"\bas\b", t) else t
            t = re.sub(r"::\*$", "", t)
            out.append(prefix + t)
            return
        head, rest = t.split("{", 1)
        body = rest[: rest.rfind("}")]
        depth, start = 0, 0
        for i, ch in enumerate(body + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                part = body[start:i]
                start = i + 1
                if part:
                    walk(prefix + head, part)

    walk("", tree)
    return out


def resolve(path: str, here: tuple, modules: dict):
    """The file of the deepest module `path` (as written in module `here`) names, and the rest."""
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    else:
        base = list(here)
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
    full = tuple(base + parts)
    for n in range(len(full), -1, -1):
        if full[:n] in modules:
            return modules[full[:n]], "::".join(full[n:]) or "(module)"
    return None, None


def graph(src: Path):
    files = [f for f in sorted(src.rglob("*.rs")) if f.name != "tests.rs"]
    modules = {module_of(src, f): f for f in files}
    edges = defaultdict(lambda: defaultdict(set))
    for f in files:
        here = module_of(src, f)
        # A file's own `super::` is relative to its module; in mod.rs/lib.rs that is itself.
        code = strip_code(f.read_text())
        paths = []
        for m in USE_STMT.finditer(code):
            paths += expand(m.group(1))
        paths += INLINE.findall(code)
        for p in paths:
            target, item = resolve(p, here, modules)
            if target is None or target == f:
                continue
            # A parent naming its own child module to declare/re-export it is still an import.
            edges[f][target].add(item)
    return files, edges


def cycles(files, edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in files:
        if v not in index:
            visit(v)
    return out


def report(root: Path, srcs) -> int:
    found = 0
    for s in srcs:
        src = root / s
        files, edges = graph(src)
        for comp in cycles(files, edges):
            found += 1
            members = set(comp)
            print(f"cycle {found} ({len(comp)} files):")
            for a in comp:
                for b, items in sorted(edges[a].items()):
                    if b in members:
                        names = ", ".join(sorted(items)[:6])
                        print(f"  {a.relative_to(root)} -> {b.relative_to(root)}: {names}")
    if found:
        print(f"check_cycles: {found} import cycle(s) between files; arrows must point one way")
        return 1
    print(f"check_cycles: no import cycle in {', '.join(srcs)}")
    return 0


def self_test() -> int:
    """Plants a two-file cycle and a clean pair; the check must report exactly the cycle."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "src"
        (src / "shard").mkdir(parents=True)
        (src / "lib.rs").write_text("pub mod a;\npub mod b;\npub mod shard;\n")
        (src / "a.rs").write_text("use crate::b::{Thing, other::{X}};\npub struct A;\n")
        # The import sits between two strings, the first ending in `r"`: a scan that took
        # that for a raw string's start would swallow the import and miss the cycle.
        (src / "b.rs").write_text(
            'pub struct Thing;\nfn n() -> &\'static str { "committer" }\n'
            'fn f() { let _ = crate::a::A; }\nfn q() -> char { \'"\' }\nfn g() -> &\'static str { "x" }\n')
        (src / "shard" / "mod.rs").write_text("mod gate;\npub struct Shard;\n")
        (src / "shard" / "gate.rs").write_text(
            "use super::Shard;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n")
        files, edges = graph(src)
        found = cycles(files, edges)
        want = [[src / "a.rs", src / "b.rs"]]
        if found != want:
            print(f"check_cycles self-test FAILED: found {found}, want {want}")
            return 1
    print("check_cycles self-test: a planted cycle is reported (past look-alike literals), test code and mod decls are not")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    root = Path(__file__).resolve().parents[1]
    sys.exit(report(root, sys.argv[1:] or DEFAULT_CRATES))
