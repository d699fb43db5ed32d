#!/usr/bin/env python3
"""Compares two metrics.jsonl files step by step (tests of the trainer).

  compare_metrics.py A B --exact            every training and eval loss identical (bitwise)
  compare_metrics.py A B --rtol 1e-4        losses equal within a relative tolerance
  compare_metrics.py A --decreasing KEY     KEY's last value is below its first
Exit 1 with the first difference otherwise.
"""
import argparse
import json
import sys


def load(path):
    train, evals = {}, {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            (evals if "eval_loss" in j else train)[j["step"]] = j
    return train, evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--rtol", type=float, default=0.0)
    ap.add_argument("--decreasing")
    ap.add_argument("--keys", default="loss,kd_loss,ce_loss,eval_loss")
    args = ap.parse_args()
    ta, ea = load(args.a)
    if args.decreasing:
        steps = sorted(s for s in ta if args.decreasing in ta[s])
        if len(steps) < 2:
            sys.exit(f"{args.a}: fewer than 2 steps with {args.decreasing}")
        first, last = ta[steps[0]][args.decreasing], ta[steps[-1]][args.decreasing]
        if not last < first:
            sys.exit(f"{args.a}: {args.decreasing} did not decrease: {first} -> {last}")
        print(f"{args.decreasing}: {first:.4f} -> {last:.4f}")
        return
    tb, eb = load(args.b)
    keys = args.keys.split(",")
    for name, xa, xb in (("train", ta, tb), ("eval", ea, eb)):
        if sorted(xa) != sorted(xb):
            sys.exit(f"{name} steps differ: {sorted(xa)} vs {sorted(xb)}")
        for s in sorted(xa):
            for k in keys:
                if k not in xa[s] and k not in xb[s]:
                    continue
                va, vb = xa[s].get(k), xb[s].get(k)
                if va is None or vb is None:
                    sys.exit(f"step {s}: {k} missing in one file")
                if args.exact and va != vb:
                    sys.exit(f"step {s}: {k} differs: {va!r} vs {vb!r}")
                if not args.exact and abs(va - vb) > args.rtol * max(abs(va), abs(vb)):
                    sys.exit(f"step {s}: {k} differs beyond rtol {args.rtol}: {va!r} vs {vb!r}")
    print(f"{len(ta)} train and {len(ea)} eval records match" + (" exactly" if args.exact else f" (rtol {args.rtol})"))


if __name__ == "__main__":
    main()
