#!/usr/bin/env python3
"""Derives tests/fixtures/data/tokenizer/gpt2-4k.tokenizer.json from gpt2.tokenizer.json.

GPT-2's byte-level BPE with only its first 3,839 merges: ids 0-255 are the byte tokens, id
256 + i is the token merge i makes (true of GPT-2's files: checked below), and
<|endoftext|> moves from 50256 to 4095. A BPE cut after its first N merges is still an exact
BPE tokenizer (merges apply in rank order; a word just stops merging earlier), so text round
trips and `tokenizers` would give the same ids from this file.

Why: the tiny test teacher (configs/models/tiny-teacher.json) spent 93% of its parameters on
GPT-2's 50,257-row embedding, and the tests that pretrain, distil, search and run it paid for
that in every step. With 4,096 rows the same tests run in about 60% of the CPU time (docs/
status.md, issue 13). The real-teacher tests keep SmolLM2's own 49,152-token vocabulary, and
the tokenizer tests keep the full GPT-2 file.

  python3 scripts/make_gpt2_4k_tokenizer.py           # (re)write the file
  python3 scripts/make_gpt2_4k_tokenizer.py --check   # exit 1 unless the committed file is this
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "tests", "fixtures", "data", "tokenizer")
SRC = os.path.join(DIR, "gpt2.tokenizer.json")
OUT = os.path.join(DIR, "gpt2-4k.tokenizer.json")
VOCAB = 4096
EOS = "<|endoftext|>"


def derive():
    with open(SRC, encoding="utf-8") as f:
        t = json.load(f)
    model = t["model"]
    vocab, merges = model["vocab"], model["merges"]
    keep = VOCAB - 1 - 256  # merges kept: ids 256 .. VOCAB-2; VOCAB-1 is EOS
    for i, m in enumerate(merges[:keep]):
        a, b = m.split(" ") if isinstance(m, str) else m
        if vocab.get(a + b) != 256 + i:
            sys.exit(f"{SRC}: merge {i} ({a!r} + {b!r}) does not make id {256 + i}; cannot cut by rank")
    if sorted(i for i in vocab.values() if i < 256) != list(range(256)):
        sys.exit(f"{SRC}: ids 0-255 are not the 256 byte tokens")
    model["vocab"] = {tok: i for tok, i in vocab.items() if i < VOCAB - 1}
    model["vocab"][EOS] = VOCAB - 1
    model["merges"] = merges[:keep]
    added = [a for a in t["added_tokens"] if a["content"] == EOS]
    if len(added) != 1:
        sys.exit(f"{SRC}: expected one added token {EOS}")
    added[0]["id"] = VOCAB - 1
    t["added_tokens"] = added
    return json.dumps(t, ensure_ascii=False, separators=(",", ":")) + "\n"


def main():
    text = derive()
    if sys.argv[1:] == ["--check"]:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{OUT} differs from what {os.path.basename(__file__)} derives; rerun it")
        print(f"{OUT}: as derived")
        return
    tmp = OUT + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, OUT)
    print(f"wrote {OUT}: {VOCAB} ids")


if __name__ == "__main__":
    main()
