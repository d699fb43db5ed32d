#!/usr/bin/env bash
# `autocompress model info` and `autocompress cost predict|calibrate`: tables, JSON with the
# known answers, and exit code 2 with a message naming the field on bad input.
source "$AC_SOURCE_DIR/tests/cli/lib.sh"
T=$AC_TEST_TMP
M=$AC_SOURCE_DIR/configs/models

expect_rc 0 "$AC_BIN" model info "$M/nemotron-3-super.json"
expect_out "total 120.669B, active per token 12.770B; MTP 2.942B (total with MTP 123.611B)"
expect_out "moe 512e top22 ffn2688 shared5376 latent1024"
expect_rc 0 "$AC_BIN" model info --arch "$M/tiny-hybrid.json" --json
python3 - "$T/out" <<'PY' || fail "model info json"
import json, sys
j = json.load(open(sys.argv[1]))
assert [l["kind"] for l in j["layers"]] == ["M", "*", "-", "E", "M", "-", "E", "."], j["layers"]
assert j["params"]["total"] == sum(l["params"] for l in j["layers"]) + j["params"]["embedding"] + j["params"]["head"] + 256
print("model info json ok")
PY

expect_rc 0 "$AC_BIN" cost predict --arch "$M/nemotron-3-super.json" --hardware b200 --engine vllm --workload long-context-128k --json
python3 - "$T/out" <<'PY' || fail "super json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["engine"] == "vllm" and j["hardware"] == "b200"
assert j["fits"] is False and abs(j["weight_bytes"] / 1e9 - 241.3) < 0.5, j
assert j["kv_bytes_per_token"] == 8192
print("super ok")
PY
expect_rc 0 "$AC_BIN" cost predict --arch "$M/nemotron-3-super-74b.json" --hardware b200 --workload long-context-128k --per-layer
expect_out "fits                       yes"
expect_out "max concurrency            7"
expect_out "layer kind"

expect_rc 2 "$AC_BIN" cost predict --arch "$M/llama-3-8b.json" --hardware tpu9 --workload in-game
expect_out "--hardware: tpu9: unknown hardware id"
expect_rc 2 "$AC_BIN" cost predict --arch "$M/llama-3-8b.json" --hardware h100
expect_out "missing --workload"
echo '{"format": "autocompress.archspec", "version": 1, "hidden_size": 64, "vocab_size": 10, "layers": [{"attention": {"num_heads": 4, "num_kv_heads": 3, "head_dim": 16}}]}' > "$T/bad.json"
expect_rc 2 "$AC_BIN" model info "$T/bad.json"
expect_out "bad.json: layers\[0\].attention.num_kv_heads: 3 does not divide num_heads 4"

rm -f "$T/cpu.json"
expect_rc 0 "$AC_BIN" cost calibrate --quick --out "$T/cpu.json"
expect_out "fit MAPE"
expect_rc 0 "$AC_BIN" cost predict --arch "$M/tiny-hybrid.json" --hardware "$T/cpu.json" --engine trtllm --workload in-game
expect_out "on cpu-local"
echo PASS
