#!/usr/bin/env python3
"""Fails when a storage crate is named outside the one module that owns it.

The house rule: only the `meta` module touches redb, only the `object` module touches
object_store — test code included, so a test that needs a provider fake asks `object` for one
(`object::fault::MemoryFake`) instead of building it from the crate. That keeps each storage
engine replaceable behind one module and its invariants stated in one place.

A file is in breach when its code (comments and string literals stripped) names the crate as a
path (`redb::…`, `use redb`, `object_store::…`) outside the owning module's directory.

Usage: scripts/check_boundaries.py [SERVER_SRC_DIR]   (default: nokv-server/src)
       scripts/check_boundaries.py --self-test       (plants a breach; must report it)
Exit status: 0 when every crate stays inside its module, 1 otherwise.
"""

import re
import sys
import tempfile
from pathlib import Path

from check_cycles import without_literals

# crate name -> the module (file stem and directory) that alone may name it
OWNERS = {"redb": "meta", "object_store": "object"}


def breaches(src: Path) -> list:
    found = []
    for file in sorted(src.rglob("*.rs")):
        top = file.relative_to(src).parts[0].removesuffix(".rs")
        code = without_literals(file.read_text())
        for crate, owner in OWNERS.items():
            if top == owner:
                continue
            pattern = re.compile(rf"(?<![A-Za-z0-9_:]){crate}(::|\s*;|\s+as\b)")
            for m in pattern.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                found.append(f"{file}:{line}: names `{crate}` outside `{owner}`")
    return found


def self_test() -> int:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d)
        (src / "meta").mkdir()
        (src / "meta" / "store.rs").write_text("use redb::Database;\n")
        (src / "object.rs").write_text("use object_store::ObjectStore;\n")
        (src / "clean.rs").write_text('// redb::Database in a comment\nlet s = "object_store::x";\n')
        if breaches(src):
            print("check_boundaries self-test: a clean tree was reported", file=sys.stderr)
            return 1
        (src / "shard.rs").write_text("fn f() { let m = object_store::memory::InMemory::new(); }\n")
        if len(breaches(src)) != 1:
            print("check_boundaries self-test: a planted breach was not reported", file=sys.stderr)
            return 1
    print("check_boundaries self-test: a planted breach is reported")
    return 0


def main(argv: list) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    src = Path(argv[1] if len(argv) > 1 else "nokv-server/src")
    found = breaches(src)
    for b in found:
        print(b, file=sys.stderr)
    if found:
        return 1
    print(f"check_boundaries: redb only in meta, object_store only in object ({src})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
