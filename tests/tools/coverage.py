#!/usr/bin/python3
"""Line coverage per area from gcov's JSON (make coverage; mk/coverage.mk).

    coverage.py --build build/cov --area kernelmgr/engine --area sandbox ...

Runs gcov (--json-format --stdout, no files written) on every .gcno under
the build directory, from the checkout's root, where the objects were
compiled. A line is one gcov counts as code; it is executed when any object
that compiled it ran it (a header's inline function or a .c file compiled
into two objects is one set of lines, their counts merged). Each file goes
to the first area that is a prefix of its path (a directory or one file);
files of no area (the unit tests themselves, system headers) are left out.
Prints one line per area and a total: lines executed, lines, percent.
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
BATCH = 64  # .gcno files per gcov run


def area_of(path: str, areas: list[str]) -> str | None:
    for a in areas:
        if path == a or path.startswith(a.rstrip("/") + "/"):
            return a
    return None


def gcov_lines(gcnos: list[str]) -> dict[str, dict[int, bool]]:
    """{source path relative to ROOT: {line: executed}} over every object"""
    lines: dict[str, dict[int, bool]] = {}
    for i in range(0, len(gcnos), BATCH):
        # stderr: "cannot open data file, assuming not executed" for each
        # object no test ran, which is what is wanted
        out = subprocess.run(
            ["gcov", "--json-format", "--stdout", *gcnos[i : i + BATCH]],
            cwd=ROOT,
            check=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ).stdout
        for doc in out.splitlines():
            if not doc.strip():
                continue
            d = json.loads(doc)
            cwd = d.get("current_working_directory", ROOT)
            for f in d["files"]:
                path = os.path.relpath(os.path.normpath(os.path.join(cwd, f["file"])), ROOT)
                seen = lines.setdefault(path, {})
                for ln in f["lines"]:
                    n = ln["line_number"]
                    seen[n] = seen.get(n, False) or ln["count"] > 0
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="the coverage build directory")
    ap.add_argument("--area", action="append", required=True, help="a directory or file")
    args = ap.parse_args()
    build = os.path.join(ROOT, args.build) if not os.path.isabs(args.build) else args.build
    gcnos = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(build) for f in fs if f.endswith(".gcno")
    )
    if not gcnos:
        print(f"coverage: no .gcno files under {args.build}", file=sys.stderr)
        return 1
    totals = {a: [0, 0] for a in args.area}  # area: [executed, lines]
    for path, seen in gcov_lines(gcnos).items():
        a = area_of(path, args.area)
        if a is None:
            continue
        totals[a][0] += sum(seen.values())
        totals[a][1] += len(seen)
    width = max(len(a) for a in args.area)
    print(f"{'area':<{width}}  {'executed':>8}  {'lines':>6}  {'percent':>7}")
    for a, (run, n) in totals.items():
        pct = f"{100.0 * run / n:6.1f}%" if n else "     -"
        print(f"{a:<{width}}  {run:>8}  {n:>6}  {pct:>7}")
    run = sum(t[0] for t in totals.values())
    n = sum(t[1] for t in totals.values())
    print(f"{'total':<{width}}  {run:>8}  {n:>6}  {100.0 * run / max(n, 1):6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
