#!/usr/bin/env bash
# `checkpoint import` under 2 MPI ranks at TP 2, `export` to safetensors and to a bf16 HDF5
# file, `checkpoint verify` (checksums and shapes against the ArchSpec), and bad input: exit
# code 2 with a message naming the file.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
FIX=$AC_SOURCE_DIR/tests/fixtures/model
rm -rf "$T"/*

expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" checkpoint import --hf "$FIX/nemotron_h" --out "$T/imp" --tp 2 --dtype f32
expect_out "at TP 2 x DP 1"
expect_out "imp/step_0.h5"
[ -f "$T/imp/latest" ] && [ -f "$T/imp/manifest.json" ] || fail "import left no latest/manifest.json"
expect_rc 0 "$AC_BIN" checkpoint verify "$T/imp"
expect_out "checksums match, shapes match the ArchSpec"
expect_rc 0 "$AC_BIN" checkpoint inspect "$T/imp"
expect_out "arch_spec"
expect_out "model/layers.0.mamba.in_proj.weight *float32"

# Hugging Face layout, then back in (default --tp: the world size; --dtype: config.json's).
expect_rc 0 "$AC_BIN" export --checkpoint "$T/imp" --format safetensors --dtype f32 --out "$T/hf"
[ -f "$T/hf/config.json" ] && [ -f "$T/hf/model.safetensors" ] || fail "safetensors export incomplete"
grep -q '"NemotronHForCausalLM"' "$T/hf/config.json" || fail "config.json lacks the architecture"
expect_out "hf layout: plain (NemotronHForCausalLM, --hf-layout auto)"
grep -q '"hf_layout": "plain"' "$T/hf/manifest.json" || fail "manifest.json lacks the chosen hf_layout"
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" checkpoint import --hf "$T/hf" --out "$T/imp2"
expect_out "float32) at TP 2 x DP 1"

# --hf-layout: block_configs asked for on a uniform student; a student the layout cannot
# express (the Llama fixture's FFN width 96 is no DeciLM width) exits 2 naming the layer and
# field, and leaves the directory's earlier export as it was.
expect_rc 0 "$AC_BIN" export --checkpoint "$T/imp" --format safetensors --dtype f32 --out "$T/puzzle" --hf-layout block-configs
expect_out "hf layout: block-configs (NemotronHPuzzleForCausalLM"
grep -q '"nemotron_h_puzzle"' "$T/puzzle/config.json" || fail "block-configs export is not nemotron_h_puzzle"
expect_rc 0 $MPIEXEC -n 2 "$AC_BIN" checkpoint import --hf "$T/puzzle" --out "$T/imp3"
expect_rc 0 "$AC_BIN" checkpoint import --hf "$FIX/llama" --out "$T/llama" --dtype f32
expect_rc 0 "$AC_BIN" export --checkpoint "$T/llama" --format safetensors --out "$T/hfl"
expect_out "hf layout: plain (LlamaForCausalLM"
cp "$T/hfl/config.json" "$T/hfl-config.json"
expect_rc 2 "$AC_BIN" export --checkpoint "$T/llama" --format safetensors --out "$T/hfl" --hf-layout block-configs
expect_out "layers\[0\].mlp.ffn_size: 96 is not a DeciLM FFN width"
expect_out "export it with --hf-layout per-layer-config"
cmp -s "$T/hfl/config.json" "$T/hfl-config.json" || fail "a refused export changed the earlier config.json"
grep -q '"hf_layout": "plain"' "$T/hfl/manifest.json" || fail "a refused export changed the earlier manifest"
expect_rc 2 "$AC_BIN" export --checkpoint "$T/llama" --format safetensors --out "$T/bad6" --hf-layout decilm
expect_out "\-\-hf-layout: 'decilm' is not auto, per-layer-config or block-configs"
[ ! -e "$T/bad6" ] || fail "a refused export created its directory"

# Single-file bf16 HDF5 for serving.
expect_rc 0 "$AC_BIN" export --checkpoint "$T/imp/step_0.h5" --format hdf5 --dtype bf16 --out "$T/serve"
expect_out "serve/step_0.h5"
expect_rc 0 "$AC_BIN" checkpoint verify "$T/serve"
expect_out "shapes match the ArchSpec"
expect_rc 0 "$AC_BIN" checkpoint inspect "$T/serve/step_0.h5"
expect_out "model/layers.0.mamba.in_proj.weight *bfloat16"

# Bad input.
mkdir -p "$T/no-config" "$T/truncated"
cp "$FIX/llama/model.safetensors" "$T/no-config/"
cp "$FIX/llama/config.json" "$T/truncated/"
head -c 20000 "$FIX/llama/model.safetensors" >"$T/truncated/model.safetensors"
expect_rc 2 "$AC_BIN" checkpoint import --hf "$T/no-config" --out "$T/bad1"
expect_out "no-config/config.json"
expect_rc 2 $MPIEXEC -n 2 "$AC_BIN" checkpoint import --hf "$T/truncated" --out "$T/bad2"
expect_out "truncated/model.safetensors"
[ ! -e "$T/bad2/latest" ] || fail "a failed import left a latest pointer"
expect_rc 2 "$AC_BIN" export --checkpoint "$T/imp" --format onnx --out "$T/bad3"
expect_out "\-\-format: unknown format 'onnx'"
expect_rc 2 "$AC_BIN" export --checkpoint "$T/nothing" --format hdf5 --out "$T/bad4"
expect_out "nothing: file: no such checkpoint"
expect_rc 2 "$AC_BIN" export --checkpoint "$T/imp" --format hdf5 --out "$T/imp"
expect_out "source checkpoint's directory"
expect_rc 2 "$AC_BIN" export --checkpoint "$T/imp" --format hdf5 --dtype int8 --out "$T/bad5"
expect_out "\-\-dtype"

# A shape that does not match the ArchSpec (the stored ArchSpec edited with h5py).
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  cp "$T/imp/step_0.h5" "$T/edited.h5"
  /usr/bin/python3 - "$T/edited.h5" <<'EOF' || fail "h5py edit"
import json, sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    a = json.loads(f.attrs["arch_spec"])
    a["layers"][2]["mlp"]["ffn_size"] = 128
    f.attrs["arch_spec"] = json.dumps(a)
EOF
  expect_rc 2 "$AC_BIN" checkpoint verify "$T/edited.h5"
  expect_out "edited.h5: model/layers.2.mlp.up_proj.weight: has shape \[96, 64\], the ArchSpec wants \[128, 64\]"
else
  echo "h5py not installed: skipped the edited-ArchSpec verify"
fi
echo PASS
