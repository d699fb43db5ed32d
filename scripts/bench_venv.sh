#!/usr/bin/env bash
# The Python side of the benchmarks that compare with PyTorch / transformers (bench/bench_model.py,
# bench/bench_distill.py, bench/bench_generate.py): a virtual environment with pinned versions.
# Run by hand, never by CI or setup.sh (the torch wheel is large).
#
#   scripts/bench_venv.sh [VENV]      # default VENV: .venv-bench (git-ignored), then
#   VENV/bin/python bench/bench_generate.py ...
#
# torch comes from the CPU wheel index (download.pytorch.org/whl/cpu) when it is reachable, else
# from PyPI (the PyPI Linux wheel pulls the CUDA runtime packages too; they are not used here).
set -euo pipefail
VENV=${1:-.venv-bench}
PYTHON=${PYTHON:-python3}
TORCH=torch==2.15.0
PINS="transformers==5.23.0 safetensors==0.8.0 tokenizers==0.23.3 numpy==2.4.6"
die() { echo "bench_venv: error: $*" >&2; exit 2; }
command -v "$PYTHON" >/dev/null || die "$PYTHON: no such interpreter (set PYTHON)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || die "$VENV: python -m venv failed"
"$VENV/bin/python" -m pip install -q --upgrade pip
CPU_INDEX=https://download.pytorch.org/whl/cpu
if "$VENV/bin/python" -c "import urllib.request as u; u.urlopen('$CPU_INDEX/torch/', timeout=10)" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --index-url "$CPU_INDEX" "$TORCH"
else
  echo "bench_venv: download.pytorch.org not reachable: torch from PyPI" >&2
  "$VENV/bin/python" -m pip install -q "$TORCH"
fi
"$VENV/bin/python" -m pip install -q $PINS
"$VENV/bin/python" -c 'import torch, transformers; print(f"bench_venv: torch {torch.__version__}, transformers {transformers.__version__}")'
