#!/usr/bin/env python3
"""The workspace's crate dependency graph, from `cargo metadata`.

docs/architecture.md carries it between the markers below; `--check FILE`
fails when the file's copy differs from the crates (scripts/test.sh runs
it), `--write FILE` replaces it. Without arguments it prints the block.
"""
import json
import subprocess
import sys

BEGIN = "<!-- crate-graph:begin (scripts/crate-graph.py --write docs/architecture.md) -->"
END = "<!-- crate-graph:end -->"


def block() -> str:
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {p["name"]: p for p in meta["packages"]}
    # Directory names are what the tree shows; package names are what cargo says.
    def short(name: str) -> str:
        path = packages[name]["manifest_path"]
        return "`" + path.rsplit("/", 2)[-2] + "/`"

    rows = []
    for name in sorted(packages, key=short):
        normal, dev = set(), set()
        for d in packages[name]["dependencies"]:
            if d["name"] in packages:
                (dev if d["kind"] == "dev" else normal).add(d["name"])
        dev -= normal
        fmt = lambda s: ", ".join(sorted(short(n) for n in s)) or "—"
        rows.append(f"| {short(name)} | `{name}` | {fmt(normal)} | {fmt(dev)} |")
    return "\n".join(
        [
            BEGIN,
            "| crate | package | depends on | its tests and benches also use |",
            "| --- | --- | --- | --- |",
            *rows,
            END,
        ]
    )


def main() -> int:
    want = block()
    if len(sys.argv) == 1:
        print(want)
        return 0
    mode, path = sys.argv[1], sys.argv[2]
    text = open(path, encoding="utf-8").read()
    try:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        print(f"{path}: crate-graph markers missing", file=sys.stderr)
        return 1
    new = head + want + tail
    if mode == "--write":
        open(path, "w", encoding="utf-8").write(new)
        return 0
    if mode == "--check":
        if new != text:
            print(
                f"{path}: the crate graph differs from `cargo metadata`; "
                f"run python3 scripts/crate-graph.py --write {path}",
                file=sys.stderr,
            )
            return 1
        return 0
    print(f"usage: {sys.argv[0]} [--check|--write FILE]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
