#!/usr/bin/env bash
# `autocompress cost validate` on a small subset: a report with one row per architecture,
# positive predicted and measured values, the MAPE fields; exit 2 naming the file or option on
# bad input. The MAPE goals are not asserted here (timings on a shared CI machine are noisy);
# docs/costmodel.md records a full run.
source "$(dirname "$0")/lib.sh"
T=$AC_TEST_TMP
# A cache of this test's own: the first `cpu-local` use calibrates this machine into it.
CACHE=$T/cache
rm -rf "$CACHE" "$T/report.json"
VAL=(cost validate --cache-dir "$CACHE" --quick-calibration)

expect_rc 0 "$AC_BIN" "${VAL[@]}" --hardware cpu-local --limit 3 --prompt-tokens 64 --decode-steps 4 --repeats 2 --sweeps 2 \
  --prompts 64 --concurrency 1 --out "$T/report.json"
expect_out "cpu-local: no profile of this CPU"
expect_out "cpu-local: calibrated in"
expect_out "MAPE over 3 architectures: prefill"
expect_out "dense-256-4L"
expect_out "machine speed vs the profile's calibration"
expect_out "measured / predicted by sweep"
expect_out "at the calibration's speed (each sweep divided by the speed probe around it): prefill"
ls "$CACHE"/hardware/cpu-local-*.json >/dev/null 2>&1 || fail "no profile in the cache"
python3 - "$CACHE" <<'PY' || fail "cached profile"
import glob, json, sys
(p,) = glob.glob(sys.argv[1] + "/hardware/cpu-local-*.json")
j = json.load(open(p))
model = next(l for l in open("/proc/cpuinfo") if l.startswith("model name")).split(":", 1)[1].strip()
assert j["calibrated_on"]["cpu_model"] == model, (j["calibrated_on"], model)
flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split(":", 1)[1].split()
want = "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"
assert j["calibrated_on"]["dtype"] == want, (j["calibrated_on"], want)  # --dtype auto
# The cold model step was measured (a profile without it would be recalibrated when cached).
assert j["decode_step"]["model_fixed_s"] >= 0 and j["decode_step"]["model_per_layer_s"] >= 0, j["decode_step"]
# ... on one- and two-block models (one block alone cannot tell the step's term from the layers').
shapes = [p["shape"] for p in j["measurements"]["points"] if p["kind"] == "model_decode"]
assert any(s.startswith("h") for s in shapes) and any(s.startswith("2x(") for s in shapes), shapes
# ... of each layer family, so a MoE or Mamba sublayer gets its own rest, and per weight byte.
for fam in ("moe", "mamba"):
    assert any(s.startswith(fam + " h") for s in shapes) and any(s.startswith("2x(" + fam + " h") for s in shapes), shapes
assert all(j["decode_step"][k] >= 0 for k in ("model_per_moe_layer_s", "model_per_mamba_layer_s", "model_per_weight_byte_s")), j["decode_step"]
# Attention and MLP sublayers stepped over 8 sequences too, each further row's rest fitted apart.
for kind in ("attention_decode", "mlp_decode"):
    assert any(p["kind"] == kind and " x8 sequences" in p["shape"] for p in j["measurements"]["points"]), kind
assert all(j["decode_step"][k] >= 0 for k in ("attn_per_row_s", "attn_per_row_kv_s", "attn_per_row_q_s", "mlp_per_row_s",
                                              "mlp_per_row_ffn_s")), j["decode_step"]
# A call of 2-16 rows' own terms beyond the one-row call's (0 where one kernel serves both).
assert all(j["decode_step"][k] >= 0 for k in ("gemv_multirow_fixed_s", "gemv_multirow_per_mac_s")), j["decode_step"]
# ... each in windows spread over the pass (its start, middle and end), keeping the fastest.
for p in j["measurements"]["points"]:
    if p["kind"] == "model_decode":
        assert len(p["window_s"]) == 3 and p["seconds"] == min(p["window_s"]) > 0, p
# ... and the cold whole-model prefill's rest (PrefillStepCost), fitted on model_prefill points.
assert all(j["prefill_step"][k] >= 0 for k in ("model_fixed_s", "model_per_element_s")), j
# The GEMM line the prefill is priced on, fitted on square and rectangular GEMMs of > 16 rows.
g = j["gemm_line"]
assert all(g[k] >= 0 for k in ("fixed_s", "per_weight_byte_s", "per_flop_s")) and g["per_flop_s"] > 0, g
lined = [p["shape"] for p in j["measurements"]["points"] if p["kind"] == "gemm" and int(p["shape"].split("x")[0]) > 16]
assert any(s.split("x")[1] != s.split("x")[2] for s in lined), lined  # rectangular weights among them
assert any(p["kind"] == "model_prefill" for p in j["measurements"]["points"]), "no model_prefill points"
print("cached profile ok")
PY
python3 - "$T/report.json" <<'PY' || fail "report json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "autocompress.cost_validation" and j["engine"] == "local-eager", j
assert len(j["rows"]) == 3 and j["sweeps"] == 2, (len(j["rows"]), j.get("sweeps"))
for r in j["rows"]:
    for k in ("prefill_s", "decode_s", "memory_bytes"):
        assert r[k]["predicted"] > 0 and r[k]["measured"] > 0, (r["name"], k, r[k])
    # the measured peak holds at least the weights
    assert r["memory_bytes"]["measured"] >= r["weight_bytes"], r
    # Every sample is kept, in sweep order; each time is its fastest sweep's median.
    s = r["samples_s"]
    assert len(s["prefill"]) == 2 * 2 and len(s["decode"]) == 2 * 4, (r["name"], s)
    def fastest(v, per):
        med = lambda x: sorted(x)[len(x) // 2] if len(x) % 2 else 0.5 * (sorted(x)[len(x) // 2 - 1] + sorted(x)[len(x) // 2])
        return min(med(v[i:i + per]) for i in range(0, len(v), per))
    assert abs(fastest(s["decode"], 4) - r["decode_s"]["measured"]) <= 1e-12, (r["name"], s["decode"], r["decode_s"])
    assert abs(fastest(s["prefill"], 2) - r["prefill_s"]["measured"]) <= 1e-12, (r["name"], s["prefill"], r["prefill_s"])
for k in ("prefill", "decode", "latency", "memory"):
    assert j["mape"][k] >= 0, j["mape"]
# The profile's own points re-timed before every sweep and after the last (the speed
# reference): its GEMMs and the smallest model's cold decode step and prefill.
pts = [p["point"] for p in j["machine_speed"]]
assert pts == ["gemm 512x1024x1024", "gemm 16x1024x1024", "gemm 1x1024x1024", "model_decode h256 ffn 768 vocab 4096",
               "model_prefill 1x(h256 ffn 768) vocab 4096 prompt 128"], pts
for p in j["machine_speed"]:
    assert p["calibrated_s"] > 0 and p["start_s"] > 0 and p["end_s"] > 0, p
    assert 0.1 < p["start_s"] / p["calibrated_s"] < 10, p  # calibrated here a moment ago: not 10x off
probes = {p["point"].split()[0] if p["point"].startswith("model_") else p["point"]: p for p in j["machine_speed_by_sweep"]}
assert all(len(p["now_s"]) == 2 + 1 for p in probes.values()), probes
# Each kept time names the sweep whose median it is.
def med(x):
    x = sorted(x)
    return x[len(x) // 2] if len(x) % 2 else 0.5 * (x[len(x) // 2 - 1] + x[len(x) // 2])
for r in j["rows"]:
    for part, per in (("prefill", 2), ("decode", 4)):
        v = r["samples_s"][part]
        meds = [med(v[i:i + per]) for i in range(0, len(v), per)]
        assert meds[r["sweep"][part]] == r[part + "_s"]["measured"] == min(meds), (r["name"], part, meds, r["sweep"])
# Per regime and sweep: the geometric mean over architectures of that sweep's median / the prediction.
import math
by = j["measured_over_predicted_by_sweep"]
assert sorted(by) == ["tpot B=1", "ttft p=64"], by
for regime, part, per in (("ttft p=64", "prefill", 2), ("tpot B=1", "decode", 4)):
    assert len(by[regime]) == 2, by
    for k in range(2):
        logs = [math.log(med(r["samples_s"][part][k * per:(k + 1) * per]) / r[part + "_s"]["predicted"]) for r in j["rows"]]
        want = math.exp(sum(logs) / len(logs))
        assert abs(by[regime][k] / want - 1) < 1e-9, (regime, k, by[regime], want)
# At the calibration's speed: each sweep's median divided by the probe's ratio around it (the
# geometric mean of the probe before and after), the median over sweeps against the prediction.
at = j["mape_at_calibration_speed"]
for part, kind, per in (("prefill", "model_prefill", 2), ("decode", "model_decode", 4)):
    ratios = [n / probes[kind]["calibrated_s"] for n in probes[kind]["now_s"]]
    speed = [math.sqrt(ratios[k] * ratios[k + 1]) for k in range(2)]
    err = 0
    for r in j["rows"]:
        v = r["samples_s"][part]
        t = med([med(v[k * per:(k + 1) * per]) / speed[k] for k in range(2)])
        err += abs(r[part + "_s"]["predicted"] - t) / t / len(j["rows"])
    assert abs(at[part] - err) < 1e-9, (part, at, err)
assert abs(at["latency"] - (at["prefill"] + at["decode"]) / 2) < 1e-12, at
assert at["speed_moved"] >= 0, at
# Whether the rows moved with the probes needs three sweeps; this run has two.
assert "speed_tracking" in at and at["speed_tracking"] is None, at
print("report ok")
PY

# The reference is the profile's own points: a copy of the cached profile with its model
# points' times halved reads them halved (the same machine, so no second calibration).
python3 - "$CACHE" "$T/halved.json" <<'PY'
import glob, json, sys
(p,) = glob.glob(sys.argv[1] + "/hardware/cpu-local-*.json")
j = json.load(open(p))
for q in j["measurements"]["points"]:
    if q["kind"] in ("model_decode", "model_prefill"):
        q["seconds"] *= 0.5
json.dump(j, open(sys.argv[2], "w"))
PY
expect_rc 0 "$AC_BIN" "${VAL[@]}" --hardware "$T/halved.json" --limit 1 --prompt-tokens 32 --decode-steps 2 --repeats 1 \
  --sweeps 1 --prompts 32 --concurrency 1 --out "$T/halved-report.json"
python3 - "$CACHE" "$T/halved-report.json" <<'PY' || fail "speed reference of the halved profile"
import glob, json, sys
(p,) = glob.glob(sys.argv[1] + "/hardware/cpu-local-*.json")
cal = {q["kind"] + " " + q["shape"]: q["seconds"] for q in json.load(open(p))["measurements"]["points"]}
j = json.load(open(sys.argv[2]))
for q in j["machine_speed"]:
    scale = 0.5 if q["point"].startswith("model_") else 1.0
    assert abs(q["calibrated_s"] - scale * cal[q["point"]]) < 1e-12 * cal[q["point"]], (q, cal[q["point"]])
print("halved ok")
PY

# A profile calibrated on another CPU (the committed example): a warning naming both CPUs,
# and the validation runs against this machine's cached profile (no second calibration).
# Named architectures, mixing kinds (hybrid with MoE, heterogeneous).
OTHER=$AC_SOURCE_DIR/configs/hardware/cpu-avx512bf16-example.json
python3 - "$OTHER" "$T/other.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["calibrated_on"]["cpu_model"] = "Some Other CPU 9000"  # never this machine, whatever it is
json.dump(j, open(sys.argv[2], "w"))
PY
expect_rc 0 "$AC_BIN" "${VAL[@]}" --hardware "$T/other.json" --archs moe-latent,hetero-mixed --prompt-tokens 64 \
  --decode-steps 2 --repeats 1 --sweeps 1 --prompts 64 --concurrency 1
expect_out "warning: profile 'cpu-avx512bf16-example' was calibrated on Some Other CPU 9000"
expect_out "using this machine's own profile instead"
expect_out "profile: $CACHE/hardware/cpu-local-"
expect_no_out "cpu-local: no profile of this CPU"
expect_out "MAPE over 2 architectures"
expect_out "hetero-mixed"
# --keep-profile: validated against it as asked, still with the warning.
expect_rc 0 "$AC_BIN" "${VAL[@]}" --hardware "$T/other.json" --keep-profile --limit 1 --prompt-tokens 32 \
  --decode-steps 2 --repeats 1 --sweeps 1 --prompts 32 --concurrency 1
expect_out "validating against it anyway"
expect_out "profile: $T/other.json"

# The regimes the search prices, on a tiny set (a dense model, a Mamba hybrid, a MoE and a
# student with skipped layers, plus the Minitron student of the run fixtures): TTFT at three
# prompt lengths, TPOT of 1 and 4 sequences decoding together, MAPE per regime and per layer
# kind. The CI guard: each regime's MAPE under a loose bound that a shared, loaded 2-core
# machine meets with the quick calibration (the figures of a full calibration on a quiet
# machine are in docs/benchmarks.md); a kernel change that breaks the model (2x off) fails it.
# TPOT of several sequences keeps a looser bound (100%): the formulas charged every extra row a
# one-row GEMM's outputs (+33-42% quiet, 86% in one loaded CI run); with the extra rows
# calibrated on 2-16-row GEMMs (issue 37) it measured 12-17% at B=4, 11-25% at B=8 under load 3-9
# (docs/benchmarks.md), but the fix has not yet been through a CI machine's load (the CUDA
# compile beside the suite, unknown CPU class): tighten to the common bound once a CI run shows
# the margin. Timings on a shared machine are noisy, so a failed guard is retried once with a
# fresh calibration (its own cache); a model that is really off fails both tries.
BOUND=${AC_COST_GUARD_MAPE:-0.6}
BOUND_BATCHED=${AC_COST_GUARD_MAPE_BATCHED:-1.0}
regimes() {  # $1: cache dir, $2: report
  expect_rc 0 "$AC_BIN" cost validate --cache-dir "$1" --quick-calibration --hardware cpu-local \
    --archs dense-256-4L,hybrid-M*M-,moe-16x1,hetero-dense-skip \
    --arch "$AC_SOURCE_DIR/tests/fixtures/run/minitron/arch.json" --prompt-tokens 128 --prompts 64,256 --concurrency 1,4 \
    --decode-steps 4 --repeats 2 --sweeps 2 --out "$2"
  expect_out "per regime (TTFT of one prompt; TPOT and tokens/s of B sequences decoding together)"
  expect_out "tpot B=4 *5 rows: MAPE"
  expect_out "per layer kind"
}
check_regimes() {  # $1: report; exit 1 names the regime over its bound
  python3 - "$1" "$BOUND" "$BOUND_BATCHED" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); bound, bound_batched = float(sys.argv[2]), float(sys.argv[3])
want = ["ttft p=128", "ttft p=64", "ttft p=256", "tpot B=1", "tpot B=4"]
assert sorted(j["mape_by_regime"]) == sorted(want), list(j["mape_by_regime"])
assert list(dict.fromkeys(r["regime"] for r in j["regime_rows"])) == want  # per architecture, in this order
names = {r["name"] for r in j["regime_rows"]}
assert len(names) == 5 and "dense-256-4L" in names and "minitron" in names, names
assert len(j["regime_rows"]) == 25, len(j["regime_rows"])
for r in j["regime_rows"]:
    assert r["seconds"]["predicted"] > 0 and r["seconds"]["measured"] > 0, r
    if r["regime"].startswith("tpot"):
        b = r["concurrency"]
        assert abs(r["tokens_per_s"]["measured"] * r["seconds"]["measured"] - b) < 1e-6 * b, r
# the base row's two regimes are the report's prefill and decode columns
for row in j["rows"]:
    base = {r["regime"]: r for r in j["regime_rows"] if r["name"] == row["name"]}
    assert base["ttft p=128"]["seconds"]["measured"] == row["prefill_s"]["measured"], row["name"]
    assert base["tpot B=1"]["seconds"]["measured"] == row["decode_s"]["measured"], row["name"]
kinds = set(k.split()[0] for k in j["mape_by_layer_kind"])
assert kinds == {"attention", "mlp", "mamba", "moe"}, kinds
over = []
for k, e in j["mape_by_regime"].items():
    b = bound_batched if k.startswith("tpot B=") and k != "tpot B=1" else bound
    print(f"{k}: MAPE {100 * e['mape']:.1f}% (signed {100 * e['mean_signed_error']:+.1f}%) over {e['rows']} rows (bound {100 * b:.0f}%)")
    assert e["rows"] == 5, (k, e)
    if e["mape"] >= b:
        over.append(k)
if over:
    print("over the bound:", ", ".join(over))
    sys.exit(1)
PY
}
regimes "$CACHE" "$T/regimes.json"
if ! check_regimes "$T/regimes.json"; then
  echo "regimes: over the bound; retrying once with a fresh calibration"
  rm -rf "$T/cache2"
  regimes "$T/cache2" "$T/regimes2.json"
  check_regimes "$T/regimes2.json" || fail "regimes"
fi

# Bad input: exit 2 and the message names what is wrong.
expect_rc 2 "$AC_BIN" "${VAL[@]}" --hardware "$T/no-such-profile.json" --limit 1
expect_out "no-such-profile.json"
expect_rc 2 "$AC_BIN" "${VAL[@]}" --limit 1
expect_out "missing --hardware"
expect_rc 2 "$AC_BIN" "${VAL[@]}" --hardware cpu-local --archs no-such-arch
expect_out "no-such-arch: unknown architecture"
expect_rc 2 "$AC_BIN" "${VAL[@]}" --hardware cpu-local --limit 1 --concurrency 1,0
expect_out "concurrency"
expect_rc 2 "$AC_BIN" "${VAL[@]}" --hardware cpu-local --limit 1 --prompts 128,x
expect_out "prompts"
expect_rc 2 "$AC_BIN" "${VAL[@]}" --hardware cpu-local --arch "$T/no-such-arch.json"
expect_out "no-such-arch.json"
echo PASS
