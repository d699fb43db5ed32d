# `autocompress importance` end to end on the Nemotron-H fixture (Mamba, attention, MLP, MoE
# with a shared expert) imported as a checkpoint: a TP 2 run under mpiexec and a TP 1 run
# give the same file read back by h5py (shapes from the stored ArchSpec, provenance
# attributes, manifest), `importance inspect` checks the teacher's fingerprint, and bad
# input (another teacher, wrong shapes, a truncated file, bad options) exits 2 naming the
# file or option, leaving nothing half-written.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
rm -rf "$T" && mkdir -p "$T"
PY=/usr/bin/python3

# Calibration tokens in the fixture's 96-token vocabulary, as a Megatron .bin/.idx.
$PY - "$T/calib" <<'PYEOF' || fail "writing the dataset"
import struct, sys
import numpy as np
rng = np.random.default_rng(5)
docs = [rng.integers(0, 96, size=40 + i % 9, dtype=np.uint16) for i in range(24)]
with open(sys.argv[1] + ".bin", "wb") as f:
    for d in docs: f.write(d.tobytes())
lens = np.array([len(d) for d in docs], dtype=np.int32)
offs = np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * 2)]).astype(np.int64)
with open(sys.argv[1] + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
    f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
    f.write(lens.tobytes() + offs.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())
PYEOF

expect_rc 0 "$AC_BIN" checkpoint import --hf "$AC_SOURCE_DIR/tests/fixtures/model/nemotron_h" --out "$T/teacher" --dtype f32
expect_rc 0 "$AC_BIN" checkpoint import --hf "$AC_SOURCE_DIR/tests/fixtures/model/llama" --out "$T/other" --dtype f32

DATA="--data $T/calib --split 0,1,0 --calib-samples 6 --seq-len 16 --micro-batch 2 --seed 9 --dtype f32"
COMMON="--teacher $T/teacher $DATA"
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" importance $COMMON --tp 2 --out "$T/scores_tp2.h5"
expect_out "samples/s"
expect_out "ETA"
expect_out "wrote $T/scores_tp2.h5"
[ -f "$T/scores_tp2.h5.manifest.json" ] || fail "no manifest next to the scores"
expect_rc 0 "$AC_BIN" importance $COMMON --out "$T/scores_tp1.h5"
[ -f "$T/scores_tp1.h5.tmp" ] && fail "temporary file left behind"

$PY - "$T/scores_tp1.h5" "$T/scores_tp2.h5" "$T/teacher" <<'PYEOF' || fail "h5py checks"
import json, sys
import h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
def attr(f, k):  # fixed-length UTF-8 string attributes come back as bytes
    v = f.attrs[k]
    return v.decode() if isinstance(v, bytes) else v
assert attr(a, "format") == "autocompress.importance", attr(a, "format")
assert int(a.attrs["version"]) == 1
assert attr(a, "teacher_checkpoint") == sys.argv[3]
assert len(attr(a, "teacher_fingerprint")) == 16
assert attr(a, "teacher_fingerprint") == attr(b, "teacher_fingerprint")
assert int(a.attrs["calib_samples"]) == 6 and int(a.attrs["seq_len"]) == 16 and int(a.attrs["seed"]) == 9
assert attr(a, "data").endswith("calib")
spec = json.loads(attr(a, "arch_spec"))
# Layers store what differs from the defaults: merge them back.
layers = [{k: {**spec["defaults"].get(k, {}), **v} for k, v in l.items() if k != "kind"} for l in spec["layers"]]
H = spec["hidden_size"]
assert a["hidden"].shape == (H,)
assert a["depth/cosine"].shape == (len(layers),) and a["depth/loss_increase"].shape == (len(layers),)
want = {}
for i, l in enumerate(layers):
    p = f"layers/{i}/"
    if "attention" in l:
        want[p + "attn_heads"] = (l["attention"]["num_heads"],)
        want[p + "attn_kv_groups"] = (l["attention"]["num_kv_heads"],)
    if "mamba" in l:
        want[p + "mamba_heads"] = (l["mamba"]["num_heads"],)
        want[p + "mamba_head_dim"] = (l["mamba"]["head_dim"],)
    if "mlp" in l:
        want[p + "mlp_neurons"] = (l["mlp"]["ffn_size"],)
    if "moe" in l:
        m = l["moe"]
        want[p + "moe_experts"] = (m["num_experts"],)
        want[p + "moe_expert_tokens"] = (m["num_experts"],)
        want[p + "moe_expert_neurons"] = (m["num_experts"], m["expert_ffn"])
        if m.get("shared_ffn", 0): want[p + "moe_shared_neurons"] = (m["shared_ffn"],)
        assert a[p + "moe_expert_tokens"][()].sum() == 6 * 16 * m["top_k"]
kinds = set(k for l in layers for k in l)
assert {"attention", "mamba", "mlp", "moe"} <= kinds, kinds
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert set(names) == set(want) | {"hidden", "depth/cosine", "depth/loss_increase"}, sorted(set(names) ^ set(want))
for n in names:
    if n in want: assert a[n].shape == want[n], (n, a[n].shape, want[n])
    x, y = a[n][()], b[n][()]
    assert x.dtype == np.float64 and np.all(np.isfinite(x)), n
    if n == "depth/loss_increase":  # a difference of two float32 losses
        assert np.allclose(x, y, rtol=0, atol=1e-5 * float(a.attrs["base_loss"])), (n, x, y)
    else:  # f32 sums in another order: up to 1.23e-5 measured (expert neurons, AMD Zen 4 / AVX-512)
        assert np.allclose(x, y, rtol=5e-5, atol=0), (n, np.max(np.abs(x - y) / np.maximum(np.abs(x), 1e-300)))
assert float(a.attrs["base_loss"]) > 1.0
print("h5py: ok,", len(names), "datasets")
PYEOF

# inspect: the file's own teacher passes, another teacher is refused naming the file.
expect_rc 0 "$AC_BIN" importance inspect "$T/scores_tp2.h5" --teacher "$T/teacher"
expect_out "matches --teacher"
expect_out "attn_heads"
expect_rc 2 "$AC_BIN" importance inspect "$T/scores_tp2.h5" --teacher "$T/other"
expect_out "$T/scores_tp2.h5"
expect_out "teacher_fingerprint"

# A dataset of the wrong shape.
cp "$T/scores_tp1.h5" "$T/wrong_shape.h5"
$PY - "$T/wrong_shape.h5" <<'PYEOF' || fail "editing the file"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    del f["hidden"]
    f["hidden"] = np.ones(7)
PYEOF
expect_rc 2 "$AC_BIN" importance inspect "$T/wrong_shape.h5"
expect_out "$T/wrong_shape.h5: dataset hidden"
expect_out "\[64\]"

# Truncated.
head -c 3000 "$T/scores_tp1.h5" > "$T/truncated.h5"
expect_rc 2 "$AC_BIN" importance inspect "$T/truncated.h5"
expect_out "$T/truncated.h5"

# Bad options and inputs: exit 2 naming what is wrong, no output file.
expect_rc 2 "$AC_BIN" importance $COMMON --calib-samples 0 --out "$T/bad.h5"
expect_out "calib-samples"
expect_rc 2 "$AC_BIN" importance --teacher "$T/nowhere" $DATA --out "$T/bad.h5"
expect_out "$T/nowhere"
expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" importance $COMMON --tp 3 --out "$T/bad.h5"
expect_out "tp"
expect_rc 2 "$AC_BIN" importance --teacher "$T/teacher" --data "$T/calib" --split 0,1,0 --seq-len 4096 --out "$T/bad.h5"
expect_out "$T/calib"
# Tokens outside the teacher's vocabulary (data tokenized for another model).
$PY - "$T/calib" "$T/wide" <<'PYEOF' || fail "writing the wide-vocabulary dataset"
import sys, numpy as np
src, dst = sys.argv[1], sys.argv[2]
tok = np.fromfile(src + ".bin", dtype=np.uint16)
tok[::5] = 500
tok.tofile(dst + ".bin")
open(dst + ".idx", "wb").write(open(src + ".idx", "rb").read())
PYEOF
expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" importance --teacher "$T/teacher" --data "$T/wide" --split 0,1,0 --calib-samples 6 \
  --seq-len 16 --micro-batch 2 --tp 2 --out "$T/bad.h5"
expect_out "$T/wide"
expect_out "token id"
[ -e "$T/bad.h5" ] && fail "a failed run left $T/bad.h5"
ls "$T"/bad.h5* >/dev/null 2>&1 && fail "a failed run left a temporary"
echo "PASS"
