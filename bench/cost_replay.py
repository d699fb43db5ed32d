#!/usr/bin/env python3
"""Stored calibrate + validate pairs replayed with each statistic on each side (issue 37): the
calibration's whole-model decode points as the fastest (what `cost calibrate` keeps), the fastest
of their first six or three windows (how the fastest depends on the number of windows), or the
median of their windows (bench_cost_replay refits the profile's decode rest and predicts the
24 architectures), against each architecture's measured time as its fastest sweep's median
(what `cost validate` reports), the median of its sweeps' medians, or the median of its sweeps'
medians each divided by the speed reference's ratio around that sweep (now / calibrated, the
geometric mean of the probes before and after it: the reference's model_decode point for decode,
model_prefill for prefill), i.e. the time at the machine's speed when it was calibrated. The same
measurements read twelve ways, so the comparison carries no machine noise between arms.

Per report: the decode B=1 and latency MAPE (mean signed) of each pairing. Per set (a folder of
consecutive pairs): the mean and the spread of latency MAPE. Per dtype: the means, and the
signed decode B=1 error per group of architectures. A report counts only where the replay's
prediction from the stored profile matches the report's own (same formulas; else the profile was
made by code this build does not reproduce) and the refit with the fastest windows gives the
stored profile back.
  cost_replay.py [--bin build/bench/bench_cost_replay] DIR..."""
import argparse
import glob
import json
import os
import subprocess
import tempfile

from cost_pairs_summary import group, load, median, speed_ratios  # the same folder's pair summary

CAL = ("fastest", "first6", "first3", "median")


# Each statistic of one row's sweep medians `m`, given the speed ratio `s` around each sweep.
VAL = {"fastest": lambda m, s: min(m), "median": lambda m, s: median(m),
       "probe": lambda m, s: median([x / r for x, r in zip(m, s)])}
KEYS = [(c, v) for c in CAL for v in VAL]


def profile_of(report):
    d = os.path.dirname(report)
    found = glob.glob(os.path.join(d, "profile.json.gz")) + \
        glob.glob(os.path.join(d, "profile", "**", "*.json"), recursive=True)
    return found[0] if found else None


def replay(binary, profile, dtype, prompt, steps):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(load(profile), f)
        f.flush()
        run = subprocess.run([binary, f.name, dtype, str(prompt), str(steps)], capture_output=True, text=True)
    return (json.loads(run.stdout), "") if run.returncode == 0 else (None, run.stderr.strip())


def measured(row, key, n, sweeps, pick, ratios):
    s = row.get("samples_s", {}).get(key, [])
    if len(s) < sweeps * n:
        return None
    return pick([median(s[i * n:(i + 1) * n]) for i in range(sweeps)], ratios)


def score(report, rp):
    """{(cal, val): (latency MAPE, decode MAPE, decode signed, {group: [signed...]})} or None."""
    rows, sweeps = report["rows"], report["sweeps"]
    n = {"prefill": report["repeats"], "decode": report["decode_steps"]}
    stored = rp["stored"]["decode_s"]
    if any(abs(stored[r["name"]] / r["decode_s"]["predicted"] - 1) > 0.005 for r in rows):
        return None, "the stored profile's predictions differ from the report's (other formulas)"
    if any(abs(rp["fastest"]["decode_s"][k] / stored[k] - 1) > 0.005 for k in stored):
        return None, "the refit with the fastest windows does not give the stored profile back"
    ratios = {"prefill": speed_ratios(report, "model_prefill"), "decode": speed_ratios(report, "model_decode")}
    if not ratios["prefill"] or not ratios["decode"]:
        return None, "no speed reference around each sweep"
    out = {}
    mean = lambda v: sum(v) / len(v)
    for cal, val in KEYS:
        pre, dec, groups = [], [], {}
        for r in rows:
            mp, md = (measured(r, k, n[k], sweeps, VAL[val], ratios[k]) for k in ("prefill", "decode"))
            if mp is None or md is None:
                return None, "no per-sample times"
            pre.append(abs(r["prefill_s"]["predicted"] / mp - 1))
            dec.append(rp[cal]["decode_s"][r["name"]] / md - 1)
            groups.setdefault(group(r["name"]), []).append(dec[-1])
        dm = mean([abs(e) for e in dec])
        out[(cal, val)] = ((mean(pre) + dm) / 2, dm, mean(dec), groups)
    return out, ""


def replay_all(binary, dirs):
    """[(name, set, dtype, score)] over every report under `dirs`, skipped ones printed as rows."""
    out = []
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "validate.json*"), recursive=True)):
            report, prof = load(path), profile_of(path)
            name = os.path.join(os.path.basename(d.rstrip("/")), os.path.relpath(os.path.dirname(path), d))
            dtype = report.get("dtype", "bfloat16")
            rp, why = (replay(binary, prof, dtype, report.get("prompt_tokens", 256), report["decode_steps"])
                       if prof else (None, "no profile"))
            s, why = score(report, rp) if rp else (None, why)
            if s is None:
                print(f"| {name} | {dtype} | skipped: {why} |")
                continue
            print(f"| {name} | {dtype} | " + " | ".join(
                f"{100 * s[k][0]:.1f} / {100 * s[k][1]:.1f} ({100 * s[k][2]:+.1f})" for k in KEYS) + " |")
            out.append((name, os.path.dirname(name), dtype, s))
    return out


def spreads(reports, dtype=None):
    """{set: {pairing: [latency MAPE...]}} over the sets of two or more reports (of `dtype`)."""
    sets = {}
    for _, st, dt, s in reports:
        if dtype in (None, dt):
            for k in KEYS:
                sets.setdefault((st, dt), {}).setdefault(k, []).append(s[k][0])
    return {k: v for k, v in sets.items() if len(v[KEYS[0]]) >= 2}


def print_dtype(reports, dtype):
    ss = [s for _, _, dt, s in reports if dt == dtype]
    print(f"\n{dtype}, {len(ss)} reports: mean latency / decode B=1 MAPE (signed), the spread of latency MAPE within a "
          "set, and decode B=1 signed per group")
    sets = spreads(reports, dtype).values()
    for k in KEYS:
        mean = lambda i: 100 * sum(s[k][i] for s in ss) / len(ss)
        groups = {}
        for s in ss:
            for g, v in s[k][3].items():
                groups.setdefault(g, []).extend(v)
        gs = ", ".join(f"{g} {100 * sum(v) / len(v):+.1f}%" for g, v in sorted(groups.items()))
        sp = [max(x[k]) - min(x[k]) for x in sets]
        spread = f"spread mean {100 * sum(sp) / len(sp):.1f} max {100 * max(sp):.1f}" if sp else "no sets"
        print(f"  cal {k[0]:7s} val {k[1]:7s}: {mean(0):.1f}% / {mean(1):.1f}% ({mean(2):+.1f}%), {spread}; {gs}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bench/bench_cost_replay")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        raise SystemExit(f"{a.bin}: not built (cmake --build build --target bench_cost_replay)")
    print("| report | dtype | " + " | ".join(f"cal {c}, val {v}: latency / decode B=1 (signed)" for c, v in KEYS) + " |")
    print("|---|---|" + "---|" * len(KEYS))
    reports = replay_all(a.bin, a.dirs)
    print("\nPer set of consecutive pairs: latency MAPE mean (spread) per pairing, " + ", ".join("/".join(k) for k in KEYS))
    for (st, dt), lat in sorted(spreads(reports).items()):
        cells = [f"{100 * sum(v) / len(v):.1f}% ({100 * (max(v) - min(v)):.1f})" for v in (lat[k] for k in KEYS)]
        print(f"  {st} [{dt}, {len(lat[KEYS[0]])}]: " + ", ".join(cells))
    for dtype in sorted({dt for _, _, dt, _ in reports}):
        print_dtype(reports, dtype)


if __name__ == "__main__":
    main()
