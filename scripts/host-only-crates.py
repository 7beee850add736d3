#!/usr/bin/env python3
"""Prints the crates that only run while building: those the test build
(`--features wgpu,mpi`, this platform) reaches only through a proc macro or
a build script. Cargo.toml's dev profile builds them at opt-level 0, as a
release build does, and names them one by one because `package."*"`
outranks `build-override`. Exits 1 when Cargo.toml's list differs: a crate
missing there costs build time, one listed there that is linked into a
binary would be slow at run time.

    python3 scripts/host-only-crates.py
"""
import re
import subprocess
import sys


def tree(edges):
    """(depth, name, is_proc_macro) for every line of `cargo tree`."""
    out = subprocess.run(
        ["cargo", "tree", "--features", "wgpu,mpi", "-e", edges, "--no-dedupe",
         "--prefix", "depth", "--format", "{p}"],
        check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        m = re.match(r"(\d+)(\S+) v\S+(.*)", line)
        if m:
            yield int(m[1]), m[2], "(proc-macro)" in m[3]


built = {name for _, name, _ in tree("normal,build,dev")}
# What the binaries and tests link: normal and dev edges, never into a
# proc macro's subtree.
linked, skip_below = set(), None
for depth, name, proc_macro in tree("normal,dev"):
    if skip_below is not None and depth > skip_below:
        continue
    skip_below = depth if proc_macro else None
    if not proc_macro:
        linked.add(name)

host = sorted(built - linked)
print("\n".join(host))

listed = set(re.findall(r"^([\w-]+) = \{ opt-level = 0 \}$",
                        open("Cargo.toml").read(), re.M))
missing, stale = sorted(set(host) - listed), sorted(listed - set(host))
if missing or stale:
    print(f"Cargo.toml: missing {missing}, linked into a binary {stale}", file=sys.stderr)
    sys.exit(1)
