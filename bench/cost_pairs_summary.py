#!/usr/bin/env python3
"""One line per `cost validate` report under DIR/pair-*/validate.json (bench_cost_pairs.sh):
latency, prefill, decode B=1, TPOT B=4 / B=8 (each with its mean signed error), memory MAPE,
the profile's decode-step terms (the cold step's fixed, per-layer and, where fitted, per MoE /
Mamba layer and per weight byte; each further row's attention per-kv and MLP per-ffn rest over
the first row's), each group's batched TPOT error minus its rows' B=1 error, the base rows'
prefill and decode B=1 MAPE by each row's median sweep beside the fastest one the report uses,
and the spread of latency MAPE over the pairs (issue 37: within 3 points, each <= 10%), with
the latency MAPE at the calibration's speed beside it (`cost validate`'s
mape_at_calibration_speed: each row's time scaled by the GEMM probes' speed in its sweep over
their speed in the calibration; reports from before it have none) and how much of the base rows'
sweep-to-sweep spread that division left (`speed_tracking`, computed here for older reports:
below 0.5 the rows moved with the probes and that figure is the one to read).
Given a second DIR (a baseline's pairs), its table too, the ratio of the mean latency MAPEs, and
each side of the error apart: candidate / baseline predicted time (what the candidate's
calibration changed) and measured time (what the machine did between the two arms' validations,
which run the same code), geometric means over the architectures. A MAPE ratio means little
when the measured ratio moves more than the predicted one.
  cost_pairs_summary.py DIR [BASELINE_DIR]"""
import glob
import gzip
import json
import math
import os
import sys


def load(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


def pct(x):
    return f"{100 * x:.1f}%"


def group(name):
    return ("dense" if name.startswith("dense") else "MoE" if name.startswith("moe") else
            "hybrid" if name.startswith(("hybrid", "mamba")) else "hetero")


def speed_ratios(report, kind):
    """Per sweep, the speed reference's `kind` point (model_decode / model_prefill) now over
    calibrated, the geometric mean of the probes before and after the sweep; [] without them."""
    for x in report.get("machine_speed_by_sweep", []):
        now = x["now_s"]
        if x["point"].startswith(kind + " ") and len(now) == report["sweeps"] + 1:
            return [(now[i] * now[i + 1]) ** 0.5 / x["calibrated_s"] for i in range(report["sweeps"])]
    return []


def speed_tracking(report):
    """The base rows' sweep-to-sweep spread of log(measured / predicted) left after dividing each
    sweep by its probe ratio, over the spread before (validate.cpp's speed_tracking); None with
    fewer than three sweeps or no speed probes."""
    by_sweep = report.get("measured_over_predicted_by_sweep", {})

    def variance(values):
        mean = sum(values) / len(values)
        return sum((x - mean) ** 2 for x in values) / len(values)

    raw = normalized = 0.0
    for regime, kind in ((f"ttft p={report['prompt_tokens']}", "model_prefill"), ("tpot B=1", "model_decode")):
        ratio, speed = by_sweep.get(regime), speed_ratios(report, kind)
        if not ratio or len(ratio) < 3 or len(speed) != len(ratio):
            return None
        raw += variance([math.log(x) for x in ratio])
        normalized += variance([math.log(x / v) for x, v in zip(ratio, speed)])
    return math.sqrt(normalized / raw) if raw > 0 else None


def kept_speed(report):
    """The probes' ratio in the sweeps the base rows kept (prefill, decode): the geometric mean
    over the rows of their kept sweep's ratio (validate.cpp's speed_at_kept_sweeps); None without
    probes."""
    out = []
    for part, kind in (("prefill", "model_prefill"), ("decode", "model_decode")):
        speed = speed_ratios(report, kind)
        logs = [math.log(speed[r["sweep"][part]]) for r in report["rows"] if 0 <= r["sweep"][part] < len(speed)]
        if not speed or len(logs) != len(report["rows"]):
            return None
        out.append(math.exp(sum(logs) / len(logs)))
    return tuple(out)


def read_at_speed(report, tolerance=0.35):
    """`cost validate`'s advice: the figure at the calibration's speed only where the kept sweeps
    ran off that speed by more than the spot check's tolerance and the rows followed the probes."""
    tracking, kept = speed_tracking(report), kept_speed(report)
    if tracking is None or kept is None:
        return None
    return tracking <= 0.5 and max(abs(math.log(v)) for v in kept) > math.log1p(tolerance)


def batched_slope(paths):
    """Each row's TPOT error at B = 4 and 8 minus its own B = 1 error (signed, predicted over
    measured), averaged per group of rows over the pairs: the batched slope with the level the
    VM's speed state sets in one validation taken out."""
    diff = {}
    for p in paths:
        err = {}
        for x in load(p).get("regime_rows", []):
            if x["regime"].startswith("tpot B="):
                s = x["seconds"]
                err[(x["name"], x["concurrency"])] = s["predicted"] / s["measured"] - 1
        for (name, b), e in err.items():
            if b != 1 and (name, 1) in err:
                diff.setdefault((b, group(name)), []).append(e - err[(name, 1)])
    for b in sorted({b for b, _ in diff}):
        cells = [f"{g} {100 * sum(v) / len(v):+.1f}% (|{100 * sum(map(abs, v)) / len(v):.1f}|)"
                 for (bb, g), v in sorted(diff.items()) if bb == b]
        print(f"TPOT B={b} minus the row's B=1 error, mean (mean abs) per group: " + ", ".join(cells))


def median(v):
    v = sorted(v)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def by_sweep_statistic(paths):
    """The base rows' prefill and decode B=1 MAPE (mean signed) with each row's time taken as its
    fastest sweep's median (what `cost validate` reports) and as the median of its sweeps' medians:
    how much of an error is the fastest-sweep statistic's pull on noisy rows."""
    for p in paths:
        r = load(p)
        sweeps, per = r["sweeps"], {"prefill": r["repeats"], "decode": r["decode_steps"]}
        cells = []
        for key, n in per.items():
            for label, pick in (("fastest", min), ("median", median)):
                e = []
                for x in r["rows"]:
                    s = x.get("samples_s", {}).get(key, [])
                    if len(s) >= sweeps * n:
                        e.append(x[key + "_s"]["predicted"] / pick([median(s[i * n:(i + 1) * n]) for i in range(sweeps)]) - 1)
                if e:
                    cells.append(f"{key} {label} {pct(sum(map(abs, e)) / len(e))} ({100 * sum(e) / len(e):+.1f}%)")
        name = p.split(os.sep)[-2].split("-")[-1]
        print(f"pair {name}, each row's sweep: " + ", ".join(cells))


def reports(out_dir):
    """The pairs' reports in pair order: bench_cost_pairs.sh's output, or the compressed copies
    under docs/data/cost_pairs/."""
    paths = sorted(glob.glob(os.path.join(out_dir, "pair-*", "validate.json")) or
                   glob.glob(os.path.join(out_dir, "pair-*", "validate.json.gz")),
                   key=lambda p: int(p.split("pair-")[-1].split(os.sep)[0]))
    if not paths:
        sys.exit(f"{out_dir}: no pair-*/validate.json")
    return paths


def times(out_dir, key):
    """{architecture: ([predicted...], [measured...], kinds)} over the pairs under out_dir."""
    out = {}
    for p in reports(out_dir):
        for r in load(p)["rows"]:
            pred, meas, _ = out.setdefault(r["name"], ([], [], r["kinds"]))
            pred.append(r[key + "_s"]["predicted"])
            meas.append(r[key + "_s"]["measured"])
    return out


def sides(cand_dir, base_dir):
    """Candidate / baseline predicted and measured time, decode B=1 and prefill."""
    mean = lambda v: sum(v) / len(v)
    for key in ("decode", "prefill"):
        cand, base = times(cand_dir, key), times(base_dir, key)
        names = sorted(set(cand) & set(base))
        ratio = lambda rows, at: math.exp(mean([math.log(mean(cand[n][at]) / mean(base[n][at])) for n in rows]))
        moe = [n for n in names if "E" in cand[n][2]]
        print(f"{key}: predicted candidate / baseline {ratio(names, 0):.3f}"
              + (f" (MoE rows {ratio(moe, 0):.3f})" if moe else "")
              + f", measured candidate / baseline {ratio(names, 1):.3f} over {len(names)} architectures")


def table(out_dir):
    paths = reports(out_dir)
    print("| pair | latency | at calibration speed (speed moved, sweep spread left, kept sweeps' speed) | prefill | decode B=1 (signed) | TPOT B=4 | TPOT B=8 | memory | model_fixed | per_layer "
          "| per MoE / Mamba layer, per weight byte | further row / first: attn kv, MLP ffn |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    lat, at_speed = [], []
    for p in paths:
        r = load(p)
        m, reg = r["mape"], r.get("mape_by_regime", {})
        rows = r["rows"]
        signed = sum((x["decode_s"]["predicted"] - x["decode_s"]["measured"]) / x["decode_s"]["measured"]
                     for x in rows) / len(rows)
        ds = {}
        prof = glob.glob(os.path.join(os.path.dirname(p), "profile", "**", "*.json"), recursive=True) + \
            glob.glob(os.path.join(os.path.dirname(p), "profile.json.gz"))
        for f in prof:
            try:
                ds = load(f).get("decode_step", {}) or ds
            except (OSError, ValueError):
                pass
        tpot = lambda b: (f"{pct(reg[f'tpot B={b}']['mape'])} ({100 * reg[f'tpot B={b}']['mean_signed_error']:+.1f}%)"
                          if f"tpot B={b}" in reg else "-")
        ratio = lambda k, one: f"{ds[k] / ds[one]:.2f}" if k in ds and ds.get(one, 0) > 0 else "-"
        rows_rest = f"{ratio('attn_per_row_kv_s', 'attn_per_kv_s')}, {ratio('mlp_per_row_ffn_s', 'mlp_per_ffn_s')}"
        us = lambda k: f"{1e6 * ds[k]:.0f} us" if k in ds else "-"
        kinds = (f"{us('model_per_moe_layer_s')} / {us('model_per_mamba_layer_s')}, "
                 f"{1e12 * ds['model_per_weight_byte_s']:.0f} ps" if "model_per_weight_byte_s" in ds else "-")
        name = p.split(os.sep)[-2].split("-")[-1]  # pair-K
        log = os.path.join(os.path.dirname(p), "validate.log")
        if os.path.exists(log) and "calibrating" in open(log).read():
            name += " (recalibrated by validate)"
        norm = r.get("mape_at_calibration_speed")
        if norm:
            at_speed.append(norm["latency"])
        tracking = speed_tracking(r)
        kept = kept_speed(r)
        norm_text = (f"{pct(norm['latency'])} ({100 * norm['speed_moved']:.0f}%"
                     + (f", {100 * tracking:.0f}% of the spread left" if tracking is not None else "")
                     + (f", kept {kept[0]:.2f}x / {kept[1]:.2f}x" if kept else "")
                     + ("; read this" if read_at_speed(r) else "") + ")"
                     if norm else "-")
        print(f"| {name} | {pct(m['latency'])} | {norm_text} | {pct(m['prefill'])} | {pct(m['decode'])} ({100 * signed:+.1f}%) | "
              f"{tpot(4)} | {tpot(8)} | {pct(m['memory'])} | {us('model_fixed_s')} | {us('model_per_layer_s')} | {kinds} | {rows_rest} |")
        lat.append(m["latency"])
    batched_slope(paths)
    by_sweep_statistic(paths)
    print(f"{out_dir}: latency MAPE {pct(min(lat))}-{pct(max(lat))} over {len(lat)} pairs "
          f"(spread {100 * (max(lat) - min(lat)):.1f} points)" +
          (f"; at the calibration's speed {pct(min(at_speed))}-{pct(max(at_speed))} "
           f"(spread {100 * (max(at_speed) - min(at_speed)):.1f})" if len(at_speed) == len(lat) else ""))
    return sum(lat) / len(lat)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    mean = table(sys.argv[1])
    if len(sys.argv) == 3:
        base = table(sys.argv[2])
        print(f"mean latency MAPE: {pct(mean)} vs baseline {pct(base)} (ratio {mean / base:.2f})")
        sides(sys.argv[1], sys.argv[2])
