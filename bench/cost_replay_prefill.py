#!/usr/bin/env python3
"""Stored calibrate + validate pairs replayed for the prefill (issue 37): `bench_cost_replay
--prefill` refits each stored profile's attention curve from its own `attention` points without
and with a term per score element (HardwareProfile::score_element_s), refits the whole-model
prefill rest after it, and predicts the 24 architectures' TTFT at 128, 256 and 2048 tokens; here
each is scored against the report's measured TTFT (each row's fastest sweep, as `cost validate`
reports it). No timing: the same measurements priced two ways.

A report counts only where the replay's stored-profile predictions match the report's own (same
formulas) and the refit without the term gives them back. Per report: TTFT MAPE (mean signed) at
each prompt and the latency MAPE (the prefill at the report's prompt and its decode B=1, which the
term does not touch) stored / with the term; then the means per dtype and per group of
architectures.
  cost_replay_prefill.py [--bin build/bench/bench_cost_replay] DIR..."""
import argparse
import glob
import json
import os
import subprocess
import tempfile

from cost_pairs_summary import group, load

PROMPTS = ("128", "256", "2048")


def profile_of(report):
    d = os.path.dirname(report)
    found = glob.glob(os.path.join(d, "profile.json.gz")) + \
        glob.glob(os.path.join(d, "profile", "**", "*.json"), recursive=True)
    return found[0] if found else None


def replay(binary, profile, dtype):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(load(profile), f)
        f.flush()
        run = subprocess.run([binary, "--prefill", f.name, dtype], capture_output=True, text=True)
    return (json.loads(run.stdout)["prefill"], "") if run.returncode == 0 else (None, run.stderr.strip())


def score(report, rp):
    """{arm: {prompt: [signed error per row]}}, {arm: latency MAPE}, or None and why."""
    ttft = {}
    for r in report.get("regime_rows", []):
        if r["regime"].startswith("ttft p="):
            ttft[(r["name"], r["regime"][len("ttft p="):])] = r["seconds"]
    if not ttft:
        return None, None, "no TTFT rows"
    for (name, p), s in ttft.items():
        if p not in PROMPTS:
            continue
        if abs(rp["stored"]["ttft_s"][name][p] / s["predicted"] - 1) > 0.005:
            return None, None, "the stored profile's predictions differ from the report's (other formulas)"
        if abs(rp["refit"]["ttft_s"][name][p] / s["predicted"] - 1) > 0.005:
            return None, None, "the refit without the term does not give the stored profile back"
    errs, latency = {}, {}
    own = str(report.get("prompt_tokens", 256))
    decode = report["mape"]["decode"] if isinstance(report.get("mape"), dict) else None
    for arm in ("stored", "scores"):
        errs[arm] = {}
        for (name, p), s in ttft.items():
            if p in PROMPTS:
                errs[arm].setdefault(p, []).append((name, rp[arm]["ttft_s"][name][p] / s["measured"] - 1))
        if decode is not None and own in errs[arm]:
            pre = sum(abs(e) for _, e in errs[arm][own]) / len(errs[arm][own])
            latency[arm] = (pre + decode) / 2
    return errs, latency, ""


def mape(v):
    return 100 * sum(abs(e) for e in v) / len(v), 100 * sum(v) / len(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bench/bench_cost_replay")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        raise SystemExit(f"{a.bin}: not built (cmake --build build --target bench_cost_replay)")
    print("| report | dtype | ns per score element | attention fit stored / scores | " +
          " | ".join(f"TTFT p={p} stored / scores (signed)" for p in PROMPTS) + " | latency stored / scores |")
    print("|---|---|---|---|" + "---|" * (len(PROMPTS) + 1))
    by_dtype = {}
    for d in a.dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "validate.json*"), recursive=True)):
            report, prof = load(path), profile_of(path)
            name = os.path.join(os.path.basename(d.rstrip("/")), os.path.relpath(os.path.dirname(path), d))
            dtype = report.get("dtype", "bfloat16")
            rp, why = replay(a.bin, prof, dtype) if prof else (None, "no profile")
            errs, latency, why = score(report, rp) if rp else (None, None, why)
            if errs is None:
                print(f"| {name} | {dtype} | skipped: {why} |")
                continue
            cells = []
            for p in PROMPTS:
                if p not in errs["stored"]:
                    cells.append("-")
                    continue
                (ms, ss), (mn, sn) = (mape([e for _, e in errs[arm][p]]) for arm in ("stored", "scores"))
                cells.append(f"{ms:.1f} ({ss:+.1f}) / {mn:.1f} ({sn:+.1f})")
            lat = f"{100 * latency['stored']:.1f} / {100 * latency['scores']:.1f}" if latency else "-"
            t = rp["scores"]["terms"]
            print(f"| {name} | {dtype} | {1e9 * t['score_element_s']:.2f} | "
                  f"{100 * rp['refit']['terms']['attention_fit_mape']:.1f} / {100 * t['attention_fit_mape']:.1f} | " +
                  " | ".join(cells) + f" | {lat} |")
            by_dtype.setdefault(dtype, []).append((errs, latency))
    for dtype, reports in sorted(by_dtype.items()):
        print(f"\n{dtype}, {len(reports)} reports: TTFT MAPE (mean signed) over every row, stored -> with the term")
        for p in PROMPTS:
            rows = {arm: [e for errs, _ in reports for _, e in errs[arm].get(p, [])] for arm in ("stored", "scores")}
            if rows["stored"]:
                (ms, ss), (mn, sn) = mape(rows["stored"]), mape(rows["scores"])
                print(f"  p={p}: {ms:.1f}% ({ss:+.1f}%) -> {mn:.1f}% ({sn:+.1f}%)")
        lats = [lat for _, lat in reports if lat]
        if lats:
            print(f"  latency: {100 * sum(l['stored'] for l in lats) / len(lats):.1f}% -> "
                  f"{100 * sum(l['scores'] for l in lats) / len(lats):.1f}%")
        groups = {}
        for errs, _ in reports:
            for arm in ("stored", "scores"):
                for p in PROMPTS:
                    for n, e in errs[arm].get(p, []):
                        groups.setdefault((group(n), arm), []).append(e)
        print("  signed per group, all prompts: " + ", ".join(
            f"{g} {100 * sum(groups[(g, 'stored')]) / len(groups[(g, 'stored')]):+.1f} -> "
            f"{100 * sum(groups[(g, 'scores')]) / len(groups[(g, 'scores')]):+.1f}%"
            for g in sorted({g for g, _ in groups})))


if __name__ == "__main__":
    main()
