#!/usr/bin/env python3
"""Checks the include order of the library folders (docs/README.md, "Layers").

A folder may include only folders below it:
    launcher > eval > search > distill > job > checkpoint > model, data > dist
and inside search/: das, minitron > prune > importance > budget, plan > costmodel.
Folders on one level (model and data; das and minitron) do not include each other.
bench/, tests/ and scripts/ sit outside the order.

usage: check_layering.py [ROOT]            exit 1 and one line per offending include
       check_layering.py --self-test       proves the check fails on a planted violation
"""
import os
import re
import sys
import tempfile

LEVELS = {"launcher": 8, "eval": 7, "search": 6, "distill": 5, "job": 4, "checkpoint": 3,
          "model": 2, "data": 2, "dist": 1}
SEARCH_LEVELS = {"das": 5, "minitron": 5, "prune": 4, "importance": 3, "budget": 2, "plan": 2,
                 "costmodel": 1}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def part(path):
    """(top folder, search part or None) of a repo-relative path such as search/das/das.cpp."""
    bits = path.split("/")
    top = bits[0]
    if top != "search" or len(bits) < 2:
        return top, None
    sub = bits[1] if len(bits) > 2 else os.path.splitext(bits[1])[0]
    return top, sub


def violation(src, inc):
    (a, a_sub), (b, b_sub) = part(src), part(inc)
    if a not in LEVELS or b not in LEVELS:
        return None
    if a == b:
        if a != "search" or a_sub == b_sub or a_sub not in SEARCH_LEVELS or b_sub not in SEARCH_LEVELS:
            return None
        la, lb = SEARCH_LEVELS[a_sub], SEARCH_LEVELS[b_sub]
        what = f"search/{a_sub} includes search/{b_sub}"
    else:
        la, lb = LEVELS[a], LEVELS[b]
        what = f"{a}/ includes {b}/"
    if lb > la:
        return what + " (a higher layer)"
    if lb == la:
        return what + " (the same layer: they must not depend on each other)"
    return None


def check(root):
    bad = []
    for top in LEVELS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp", ".inc", ".cu")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    why = violation(rel, m.group(1))
                    if why:
                        line = text.count("\n", 0, m.start()) + 1
                        bad.append(f"{rel}:{line}: #include \"{m.group(1)}\": {why}")
    return bad


def self_test():
    with tempfile.TemporaryDirectory() as d:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as fh:
                fh.write(text)
        write("model/a.cpp", '#include "dist/x.h"\n')
        write("search/das/d.cpp", '#include "search/prune/prune.h"\n#include "job/x.h"\n')
        assert check(d) == [], check(d)
        cases = {"job/b.cpp": '#include "distill/trainer.h"\n',      # up a layer
                 "data/c.cpp": '#include "model/model.h"\n',         # across one level
                 "search/costmodel/e.cpp": '#include "search/das/das.h"\n',  # up inside search
                 "search/das/f.cpp": '#include "search/minitron/minitron.h"\n'}  # the two methods
        for rel, text in cases.items():
            write(rel, text)
            found = check(d)
            assert len(found) == 1 and found[0].startswith(rel), (rel, found)
            os.remove(os.path.join(d, rel))
    print("check_layering self-test: 4 planted violations found, a clean tree passes")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = check(root)
    for line in bad:
        print(line)
    if bad:
        print(f"layering: {len(bad)} include(s) against the order in docs/README.md")
        return 1
    print("layering: every include follows launcher > eval > search > distill > job > checkpoint > model, data > dist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
