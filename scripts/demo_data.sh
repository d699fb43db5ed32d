#!/usr/bin/env bash
# Makes the demo dataset: the Debian fortunes corpus (scripts/data_make_corpus.py), tokenized
# with the GPT-2 tokenizer into demo/fortunes.{bin,idx} (Megatron format). Used by
# configs/tiny-pretrain.cfg and configs/tiny-distill.cfg.
#   scripts/demo_data.sh [AUTOCOMPRESS_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/autocompress}
mkdir -p demo
if [ ! -f demo/fortunes.jsonl ]; then
  python3 scripts/data_make_corpus.py --output demo/fortunes.jsonl
fi
"$bin" data preprocess --input demo/fortunes.jsonl \
  --tokenizer tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json --output demo/fortunes
"$bin" data inspect demo/fortunes | head -3
