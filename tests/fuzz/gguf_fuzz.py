#!/usr/bin/env python3
"""The GGUF teacher converter (scripts/gguf_to_hf.py) on hostile files (issue 35): the contract
of tests/fuzz/ in Python. `convert` must return or raise ConvertError (exit 2 with a message
naming the file and field); any other exception, more than 10 s or more than 3 GB is a finding.

  gguf_fuzz.py --seed OUT.gguf          a tiny valid Llama GGUF (1 layer, hidden 8, 4 tokens)
  gguf_fuzz.py --case NAME OUT.gguf     the seed with one metadata field made hostile (CASES)
  gguf_fuzz.py --replay FILE...         each file once; FIELD@anything.gguf must be refused
                                        naming FIELD, seed*.gguf must convert
  gguf_fuzz.py --fuzz N [RNG]           N byte-level mutations of the seed's header and
                                        metadata; each new finding is kept as ./finding_K.gguf
Needs the gguf package (scripts/setup.sh installs it): exit 77 without it.
"""
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import traceback

try:
    import numpy as np
    import gguf
except ImportError:
    print("gguf_fuzz: SKIP: the gguf package is not installed (scripts/setup.sh installs gguf==0.19.0)")
    sys.exit(77)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import gguf_to_hf  # noqa: E402

H, FFN, HEADS = 8, 16, 2
TOKENS = ["a", "b", "ab", "<s>"]


def seed_fields():
    return {"llama.context_length": ("u32", 64), "llama.embedding_length": ("u32", H), "llama.block_count": ("u32", 1),
            "llama.feed_forward_length": ("u32", FFN), "llama.attention.head_count": ("u32", HEADS),
            "llama.attention.head_count_kv": ("u32", HEADS), "llama.attention.layer_norm_rms_epsilon": ("f32", 1e-5),
            "tokenizer.ggml.model": ("str", "gpt2"), "tokenizer.ggml.pre": ("str", "gpt-2"),
            "tokenizer.ggml.tokens": ("arr", TOKENS), "tokenizer.ggml.token_type": ("arr", [1, 1, 1, 3]),
            "tokenizer.ggml.merges": ("arr", ["a b"])}


# Each input that found a bug (all fixed): the field set to a hostile value.
CASES = {
    "llama.block_count@1e9": ("llama.block_count", "u64", 10**9),  # expected_shapes looped for minutes
    "llama.attention.head_count@0": ("llama.attention.head_count", "u32", 0),  # ZeroDivisionError
    "llama.embedding_length@string": ("llama.embedding_length", "str", "eight"),  # ValueError from int()
    "llama.attention.layer_norm_rms_epsilon@string": ("llama.attention.layer_norm_rms_epsilon", "str", "tiny"),
    "llama.attention.layer_norm_rms_epsilon@nan": ("llama.attention.layer_norm_rms_epsilon", "f32", float("nan")),  # NaN in config.json
    "general.alignment@0": ("general.alignment", "u32", 0),  # ZeroDivisionError in the header walk
    "tokenizer.ggml.unknown_token_id@9999": ("tokenizer.ggml.unknown_token_id", "u32", 9999),  # IndexError
    "tokenizer.ggml.merges@ints": ("tokenizer.ggml.merges", "arr", [1, 2]),  # AttributeError ('int'.split)
    "tokenizer.ggml.bos_token_id@string": ("tokenizer.ggml.bos_token_id", "str", "one"),  # ValueError from int()
    "llama.context_length@-5": ("llama.context_length", "i32", -5),  # accepted: a negative max_position_embeddings
    # Found by --fuzz 100000 2 (execution 85181): 8 heads of hidden 8, head size 1: ValueError from unpermute_rope_rows.
    "llama.attention.head_count@8": ("llama.attention.head_count", "u32", 8),
}


def write(path, fields):
    w = gguf.GGUFWriter(path, "llama")
    add = {"u32": w.add_uint32, "u64": w.add_uint64, "i32": w.add_int32, "f32": w.add_float32, "str": w.add_string,
           "arr": w.add_array}
    for key, (kind, value) in fields.items():
        add[kind](key, value)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (len(TOKENS), H), "output_norm.weight": (H,), "blk.0.attn_norm.weight": (H,),
              "blk.0.attn_q.weight": (H, H), "blk.0.attn_k.weight": (H, H), "blk.0.attn_v.weight": (H, H),
              "blk.0.attn_output.weight": (H, H), "blk.0.ffn_norm.weight": (H,), "blk.0.ffn_gate.weight": (FFN, H),
              "blk.0.ffn_up.weight": (FFN, H), "blk.0.ffn_down.weight": (H, FFN)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def outcome(path):
    """None when the contract holds, else the finding: the exception's kind and place."""
    out = tempfile.mkdtemp()
    signal.alarm(10)
    try:
        gguf_to_hf.convert(path, out)
        return None
    except gguf_to_hf.ConvertError as e:
        return e
    except TimeoutError:
        return "more than 10 s"
    except BaseException as e:  # noqa: B902 - MemoryError, RecursionError, ... are findings too
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return f"{type(e).__name__} at {os.path.basename(tb.filename)}:{tb.lineno}: {str(e)[:120]}"
    finally:
        signal.alarm(0)
        shutil.rmtree(out, ignore_errors=True)


def replay(files):
    bad = 0
    for f in files:
        name = os.path.basename(f)
        r = outcome(f)
        field = name.split("@")[0] if "@" in name else None
        if field is None:
            ok = r is None
        else:
            ok = isinstance(r, gguf_to_hf.ConvertError) and f"{f}: {field}: " in str(r)
        print(f"gguf_fuzz: {name}: {'ok' if ok else 'FAILED'}: {r if r is not None else 'converted'}")
        bad += not ok
    return 1 if bad else 0


def fuzz(n, rng_seed):
    seed_path = os.path.abspath("seed.gguf")
    write(seed_path, seed_fields())
    seed = open(seed_path, "rb").read()
    head = min(2048, len(seed) - 16)  # header, metadata and tensor infos
    values = [0, 1, 2, 3, 7, 8, 9, 0xff, 0xffff, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63, 2**64 - 1]
    rng, found = random.Random(rng_seed), {}
    for it in range(n):
        b = bytearray(seed)
        for _ in range(rng.choice([1, 1, 2, 3])):
            k, span = rng.random(), min(head, len(b) - 8)
            if span <= 0:
                break
            if k < 0.4:
                b[rng.randrange(span)] ^= 1 << rng.randrange(8)
            elif k < 0.85:
                p, w = rng.randrange(span), rng.choice([1, 2, 4, 8])
                b[p:p + w] = (rng.choice(values) % (1 << 8 * w)).to_bytes(w, "little")
            else:  # anywhere, the header included
                del b[rng.randrange(len(b)):]
        open("input.gguf", "wb").write(b)
        r = outcome("input.gguf")
        if r is None or isinstance(r, gguf_to_hf.ConvertError):
            continue
        key = r.split(":")[0] + (r.split(":")[1] if ":" in r else "")
        if key not in found:
            found[key] = f"finding_{len(found) + 1}.gguf"
            shutil.copy("input.gguf", found[key])
            print(f"gguf_fuzz: execution {it}: {r} -> {found[key]}", flush=True)
    print(f"gguf_fuzz: {n} executions, {len(found)} findings")
    return 1 if found else 0


def main(argv):
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError()))
    if argv[:1] == ["--seed"] and len(argv) == 2:
        write(argv[1], seed_fields())
    elif argv[:1] == ["--case"] and len(argv) == 3:
        key, kind, value = CASES[argv[1]]
        fields = seed_fields()
        fields[key] = (kind, value)
        write(argv[2], fields)
    elif argv[:1] == ["--replay"]:
        return replay(argv[1:])
    elif argv[:1] == ["--fuzz"] and len(argv) in (2, 3):
        return fuzz(int(argv[1]), int(argv[2]) if len(argv) == 3 else 1)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
