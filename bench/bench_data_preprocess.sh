#!/usr/bin/env bash
# Preprocessing throughput: `autocompress data preprocess` with 1 and 2 workers against the
# `tokenizers` library's batch encoding (all cores, and one thread) on the same text, in one
# run. Corpus: Debian's fortunes (scripts/data_make_corpus.py), repeated COPIES times.
#   bench/bench_data_preprocess.sh [BUILD_DIR=build] [COPIES=8]
# Needs: the Debian packages fortunes fortunes-min; pip install tokenizers (for the baseline).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
COPIES=${2:-8}
AC_BIN=$BUILD/autocompress
TOK=$ROOT/tests/fixtures/data/tokenizer/gpt2.tokenizer.json
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

python3 "$ROOT/scripts/data_make_corpus.py" --output "$T/one.jsonl" >/dev/null
for _ in $(seq "$COPIES"); do cat "$T/one.jsonl"; done > "$T/corpus.jsonl"

# C++: whole pipeline (read JSONL, parse, tokenize, append EOS, write .idx/.bin).
# Wall-clock rates suffer on a shared machine; CPU time (user + sys) is reported too.
declare -A TPS
TIMEFORMAT='%U %S'
for w in 1 2; do
  cpu=$( { time "$AC_BIN" data preprocess --input "$T/corpus.jsonl" --tokenizer "$TOK" --output "$T/w$w" \
             --workers "$w" --quiet > "$T/out$w"; } 2>&1 )
  out=$(cat "$T/out$w")
  echo "autocompress, $w worker(s): $out"
  tokens=$(echo "$out" | sed -E 's/.* ([0-9]+) tokens \(.*/\1/')
  echo "  CPU time $(echo "$cpu" | awk '{print $1 + $2}') s: $(echo "$cpu $tokens" | awk '{printf "%.0f", $3 / ($1 + $2)}') tokens per CPU-second"
  TPS[$w]=$(echo "$out" | sed -E 's/.*MB\/s, ([0-9.]+) tokens\/s.*/\1/')
  rm -f "$T/w$w".*
done

# Python baseline: the same documents, tokenizers' encode_batch (no JSON parsing, no writing).
python3 - "$T/corpus.jsonl" "$TOK" "${TPS[1]}" "${TPS[2]}" <<'PY'
import json, os, subprocess, sys, time
corpus, tok_path, cpp1, cpp2 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
code = r'''
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[2])
texts = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
nbytes = sum(len(t.encode("utf-8")) for t in texts)
c0, t0 = time.process_time(), time.perf_counter()
enc = tok.encode_batch(texts, add_special_tokens=False)
dt, dc = time.perf_counter() - t0, time.process_time() - c0
ntok = sum(len(e.ids) for e in enc) + len(texts)  # + one EOS per document, as preprocess counts
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "tokens": ntok, "text_bytes": nbytes}))
'''
res = {}
for name, env in (("all cores", {}), ("1 thread", {"RAYON_NUM_THREADS": "1"})):
    e = dict(os.environ, **env)
    out = subprocess.check_output([sys.executable, "-c", code, corpus, tok_path], env=e, text=True)
    r = json.loads(out.strip().splitlines()[-1])
    res[name] = r
    print(f"tokenizers encode_batch, {name}: {r['tokens']/r['seconds']:.0f} tokens/s, "
          f"{r['text_bytes']/r['seconds']/1e6:.2f} MB/s of text, {r['seconds']:.2f} s; "
          f"CPU time {r['cpu_seconds']:.2f} s: {r['tokens']/r['cpu_seconds']:.0f} tokens per CPU-second")
all_c, one = res["all cores"], res["1 thread"]
print(f"ratio autocompress/tokenizers tokens/s: 1 worker vs 1 thread {cpp1/(one['tokens']/one['seconds']):.2f}, "
      f"2 workers vs all cores {cpp2/(all_c['tokens']/all_c['seconds']):.2f}")
PY
