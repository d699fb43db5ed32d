#!/usr/bin/env python3
"""GGUF (llama.cpp) Llama checkpoint -> Hugging Face directory that `autocompress checkpoint
import --hf` reads: config.json, model.safetensors (F32, dequantised), tokenizer.json,
tokenizer_config.json (chat template) and generation_config.json.

  python3 scripts/gguf_to_hf.py --gguf MODEL.gguf --out HF_DIR

Needs only the `gguf` package (numpy); safetensors is written here (8-byte little-endian
header length, JSON header, raw tensor bytes). What is undone on the way:
- quantisation: every tensor is dequantised to float32 by gguf.quants (Q4_0/Q4_1/Q8_0/K-quants,
  F16/BF16/F32); the values are exactly those llama.cpp multiplies with;
- llama.cpp's RoPE row order: its converter interleaves the two halves of every head's rows of
  attn_q / attn_k (GGML rotates adjacent pairs, transformers rotates halves); we put them back;
- names: blk.N.attn_q -> model.layers.N.self_attn.q_proj, ... (table below);
- the tokenizer: vocabulary, merges and token types from tokenizer.ggml.*, the pre-tokenizer
  that tokenizer.ggml.pre names, control tokens as special added tokens.
Bad input (missing file, not GGUF, another architecture, a missing field, a tensor type the
gguf package cannot dequantise, a shape that disagrees with the metadata) ends with one
message naming the file and the field or tensor, and exit code 2. Nothing is left half
written: files are written under .tmp names and renamed.
"""
import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import gguf
    from gguf import quants as gguf_quants
except ImportError as e:  # pragma: no cover - setup.sh installs them
    sys.exit(f"gguf_to_hf: error: {e.name} is not installed (scripts/setup.sh installs gguf==0.19.0)")


class ConvertError(Exception):
    pass


# GGUF tensor name (after "blk.N.") -> Hugging Face Llama name (after "model.layers.N.").
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# tokenizer.ggml.pre -> the pre-tokenizer of the original tokenizer.json. llama.cpp picks the
# name by hashing the original tokenizer's output on a test text; its regex lists say what
# each one is. "smollm" (SmolLM / SmolLM2, also StarCoder, Refact, ...): every digit on its
# own, then GPT-2's byte-level regex, i.e. tokenizers' Digits(individual_digits) + ByteLevel.
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "starcoder": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "gpt-2": BYTE_LEVEL,
    "default": BYTE_LEVEL,
}

TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4  # llama.cpp's token types (1 normal, 3 control, 4 user-defined)
# The bounds autocompress puts on any config.json (model::kMaxLayers, model::kMaxDim): checked
# here before anything is sized by them (block_count 1e9 looped for minutes).
MAX_LAYERS, MAX_DIM = 4096, 1 << 24


def prescan(path):
    """Walks the GGUF header (spec: ggml's docs/gguf.md) before gguf.GGUFReader does, so that
    a truncated file or an unknown tensor type is reported with the tensor it concerns (the
    reader's own errors name neither)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        buf = f.read(min(size, 64 << 20))  # header + metadata; tokenizers keep this well below 64 MiB
    pos = 0

    def take(n, what):
        nonlocal pos
        if pos + n > len(buf):
            raise ConvertError(f"{path}: {what}: the file ends at byte {size} inside the header (truncated?)")
        pos += n
        return buf[pos - n:pos]

    def u(n, what):
        return int.from_bytes(take(n, what), "little")

    def string(what):
        return take(u(8, what), what).decode("utf-8", "replace")

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(vtype, what):
        if vtype in sizes:
            take(sizes[vtype], what)
        elif vtype == 8:
            string(what)
        elif vtype == 9:
            etype, n = u(4, what), u(8, what)
            if etype in sizes:
                take(sizes[etype] * n, what)
            else:
                for _ in range(n):
                    skip_value(etype, what)
        else:
            raise ConvertError(f"{path}: {what}: unknown metadata value type {vtype}")

    if take(4, "magic") != b"GGUF":
        raise ConvertError(f"{path}: magic: not a GGUF file (the first 4 bytes are not 'GGUF')")
    version = u(4, "version")
    if version not in (2, 3):
        raise ConvertError(f"{path}: version: {version}; GGUF versions 2 and 3 are read")
    n_tensors, n_kv = u(8, "tensor_count"), u(8, "metadata_kv_count")
    alignment = 32
    for _ in range(n_kv):
        key = string("metadata key")
        vtype = u(4, key)
        if key == "general.alignment" and vtype == 4:
            alignment = u(4, key)
            if alignment == 0 or alignment % 8:
                raise ConvertError(f"{path}: general.alignment: {alignment} is not a positive multiple of 8")
        else:
            skip_value(vtype, key)
    infos = []
    for i in range(n_tensors):
        name = string(f"tensor_info[{i}].name")
        n_dims = u(4, name)
        if n_dims > 4:  # GGML_MAX_DIMS
            raise ConvertError(f"{path}: tensor {name}: {n_dims} dimensions; GGUF tensors have at most 4")
        dims = [u(8, name) for _ in range(n_dims)]
        qtype, offset = u(4, name), u(8, name)
        try:
            q = gguf.GGMLQuantizationType(qtype)
            block, nbytes = gguf.GGML_QUANT_SIZES[q]
        except (ValueError, KeyError):
            raise ConvertError(f"{path}: tensor {name}: type {qtype} is not a GGML tensor type") from None
        n = math.prod(dims)  # exact: numpy's product of uint64 dimensions wraps
        if dims and dims[0] % block:
            raise ConvertError(f"{path}: tensor {name}: {dims[0]} values per row is not a multiple of {q.name}'s block of {block}")
        infos.append((name, offset, n // block * nbytes))
    data_start = -(-pos // alignment) * alignment
    for name, offset, nbytes in infos:
        if data_start + offset + nbytes > size:
            raise ConvertError(f"{path}: tensor {name}: data [{data_start + offset}, {data_start + offset + nbytes}) "
                               f"past the end of the {size}-byte file (truncated?)")


class Gguf:
    """A GGUF file's metadata fields, read with context for the error messages."""

    def __init__(self, path):
        self.path = path
        if not os.path.isfile(path):
            raise ConvertError(f"{path}: file: no such file")
        prescan(path)
        try:
            self.reader = gguf.GGUFReader(path, "r")
        except Exception as e:  # the reader raises ValueError/struct errors on bad files
            raise ConvertError(f"{path}: header: not a readable GGUF file ({type(e).__name__}: {e})") from None

    def has(self, key):
        return key in self.reader.fields

    def get(self, key, default=None, required=True):
        f = self.reader.fields.get(key)
        if f is None:
            if required and default is None:
                raise ConvertError(f"{self.path}: {key}: missing metadata field")
            return default
        try:
            return f.contents()
        except Exception as e:
            raise ConvertError(f"{self.path}: {key}: unreadable metadata ({e})") from None

    def integer(self, key, lo, hi, default=None):
        """An integer field in [lo, hi]; a string, float, bool or array is named, not cast."""
        v = self.get(key, default=default, required=default is None)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ConvertError(f"{self.path}: {key}: {str(v)[:60]!r} is not an integer")
        if not lo <= int(v) <= hi:
            raise ConvertError(f"{self.path}: {key}: {int(v)} is not in [{lo}, {hi}]")
        return int(v)

    def number(self, key, default=None):
        """A finite number (config.json cannot hold NaN or infinity)."""
        v = self.get(key, default=default, required=default is None)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise ConvertError(f"{self.path}: {key}: {str(v)[:60]!r} is not a finite number")
        return float(v)

    def strings(self, key):
        v = self.get(key)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConvertError(f"{self.path}: {key}: is not an array of strings")
        return v

    def tensors(self):
        return self.reader.tensors


def llama_config(g):
    arch = g.get("general.architecture")
    if arch != "llama":
        raise ConvertError(f"{g.path}: general.architecture: is '{arch}'; only 'llama' is converted")
    p = "llama."
    hidden = g.integer(p + "embedding_length", 1, MAX_DIM)
    heads = g.integer(p + "attention.head_count", 1, MAX_DIM)
    kv_heads = g.integer(p + "attention.head_count_kv", 1, MAX_DIM, default=heads)
    layers = g.integer(p + "block_count", 1, MAX_LAYERS)
    ffn = g.integer(p + "feed_forward_length", 1, MAX_DIM)
    head_dim = g.integer(p + "attention.key_length", 1, MAX_DIM, default=max(hidden // heads, 1))
    if head_dim % 2:  # unpermute_rope_rows takes each head's rows in pairs
        key = p + ("attention.key_length" if g.has(p + "attention.key_length") else "attention.head_count")
        raise ConvertError(f"{g.path}: {key}: head size {head_dim} is odd; RoPE rotates pairs of it")
    rope_dim = g.integer(p + "rope.dimension_count", 0, MAX_DIM, default=head_dim)
    if rope_dim != head_dim:
        raise ConvertError(f"{g.path}: {p}rope.dimension_count: is {rope_dim}, head size {head_dim}: partial RoPE is not supported")
    if g.has(p + "rope.scaling.type") and g.get(p + "rope.scaling.type") not in ("none", ""):
        raise ConvertError(f"{g.path}: {p}rope.scaling.type: '{g.get(p + 'rope.scaling.type')}' is not supported")
    tokens = g.strings("tokenizer.ggml.tokens")
    vocab = g.integer(p + "vocab_size", 1, MAX_DIM, default=max(len(tokens), 1))
    if vocab != len(tokens):
        raise ConvertError(f"{g.path}: {p}vocab_size: is {vocab} but tokenizer.ggml.tokens has {len(tokens)} entries")
    names = {t.name for t in g.tensors()}
    tied = "output.weight" not in names
    eps = g.number(p + "attention.layer_norm_rms_epsilon")
    theta = g.number(p + "rope.freq_base", default=10000.0)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": g.integer(p + "context_length", 1, 2**31 - 1, default=4096),
        "rms_norm_eps": float(np.float32(eps)),
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    for key, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id"),
                      ("pad_token_id", "tokenizer.ggml.padding_token_id")):
        if g.has(name):
            cfg[key] = g.integer(name, 0, vocab - 1)
    return cfg


def hf_name(path, gguf_name):
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    raise ConvertError(f"{path}: tensor {gguf_name}: no Hugging Face Llama name for it")


def unpermute_rope_rows(w, n_heads):
    """Inverse of llama.cpp's row order for q/k: within each head its converter takes rows
    (h, half, i) to (h, i, half), so that GGML's adjacent-pair rotation sees (x_i, x_{i+d/2});
    transformers rotates halves, so we take (h, i, half) back to (h, half, i)."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of pairs")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_shapes(cfg):
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [v, h]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        shapes.update({
            pre + "input_layernorm.weight": [h], pre + "post_attention_layernorm.weight": [h],
            pre + "self_attn.q_proj.weight": [q, h], pre + "self_attn.k_proj.weight": [kv, h],
            pre + "self_attn.v_proj.weight": [kv, h], pre + "self_attn.o_proj.weight": [h, q],
            pre + "mlp.gate_proj.weight": [f, h], pre + "mlp.up_proj.weight": [f, h], pre + "mlp.down_proj.weight": [h, f],
        })
    return shapes


def dequantized(path, t):
    qtype = gguf.GGMLQuantizationType(t.tensor_type)
    try:
        a = gguf_quants.dequantize(t.data, qtype)
    except NotImplementedError:
        raise ConvertError(f"{path}: tensor {t.name}: type {qtype.name}: the gguf package cannot dequantise it") from None
    except Exception as e:
        raise ConvertError(f"{path}: tensor {t.name}: type {qtype.name}: data unreadable ({e})") from None
    shape = [int(d) for d in reversed(list(t.shape))]  # GGUF lists ne0 (the fastest dim) first
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.size != int(np.prod(shape)):
        raise ConvertError(f"{path}: tensor {t.name}: {a.size} values, its shape {shape} wants {int(np.prod(shape))}")
    return a.reshape(shape), qtype.name


def convert_weights(g, cfg):
    """(hf_name, float32 array) in Hugging Face order, checked against the config."""
    want = expected_shapes(cfg)
    out, types = {}, {}
    for t in g.tensors():
        if t.name == "rope_freqs.weight":
            raise ConvertError(f"{g.path}: tensor rope_freqs.weight: Llama-3 RoPE scaling factors are not supported")
        name = hf_name(g.path, t.name)
        a, qname = dequantized(g.path, t)
        types[qname] = types.get(qname, 0) + 1
        if name not in want:
            raise ConvertError(f"{g.path}: tensor {t.name}: {name} is not part of a {cfg['num_hidden_layers']}-layer model")
        if list(a.shape) != want[name]:
            raise ConvertError(f"{g.path}: tensor {t.name}: has shape {list(a.shape)}, the metadata wants {want[name]}")
        if name.endswith("q_proj.weight"):
            a = unpermute_rope_rows(a, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            a = unpermute_rope_rows(a, cfg["num_key_value_heads"])
        out[name] = np.ascontiguousarray(a)
    missing = [n for n in want if n not in out]
    if missing:
        raise ConvertError(f"{g.path}: tensors: {len(missing)} missing, first {missing[0]}")
    return [(n, out[n]) for n in want], types


def write_safetensors(path, tensors, metadata):
    header, offset = {"__metadata__": metadata}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, a in tensors:
            f.write(a.astype("<f4", copy=False).tobytes())
    os.replace(tmp, path)


def tokenizer_json(g):
    model = g.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ConvertError(f"{g.path}: tokenizer.ggml.model: is '{model}'; only byte-level BPE ('gpt2') is converted")
    pre = g.get("tokenizer.ggml.pre", default="default", required=False)
    if pre not in PRE_TOKENIZERS:
        raise ConvertError(f"{g.path}: tokenizer.ggml.pre: '{pre}' is not known here (known: {', '.join(sorted(PRE_TOKENIZERS))})")
    tokens = g.strings("tokenizer.ggml.tokens")
    types = list(g.get("tokenizer.ggml.token_type"))
    merges = g.strings("tokenizer.ggml.merges")
    if len(types) != len(tokens):
        raise ConvertError(f"{g.path}: tokenizer.ggml.token_type: {len(types)} entries for {len(tokens)} tokens")
    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise ConvertError(f"{g.path}: tokenizer.ggml.tokens: token {i} {t!r} repeats token {vocab[t]}")
        vocab[t] = i
    for k, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2 or parts[0] + parts[1] not in vocab:
            raise ConvertError(f"{g.path}: tokenizer.ggml.merges: entry {k} {m!r} is not two tokens whose join is a token")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": types[i] != TOKEN_CONTROL, "special": types[i] == TOKEN_CONTROL}
             for i, t in enumerate(tokens) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
    if g.get("tokenizer.ggml.add_bos_token", default=False, required=False):
        raise ConvertError(f"{g.path}: tokenizer.ggml.add_bos_token: true is not supported (the post-processor would add it)")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def tokenizer_config(g, cfg):
    tokens = g.strings("tokenizer.ggml.tokens")

    def tok(key):
        return tokens[cfg[key]] if key in cfg and 0 <= cfg[key] < len(tokens) else None

    c = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg["max_position_embeddings"],
         "add_bos_token": False, "add_prefix_space": False, "clean_up_tokenization_spaces": False,
         "bos_token": tok("bos_token_id"), "eos_token": tok("eos_token_id"), "pad_token": tok("pad_token_id")}
    if g.has("tokenizer.ggml.unknown_token_id"):
        c["unk_token"] = tokens[g.integer("tokenizer.ggml.unknown_token_id", 0, len(tokens) - 1)]
    if g.has("tokenizer.chat_template"):
        c["chat_template"] = g.get("tokenizer.chat_template")
    return c


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1 if os.path.basename(path) != "tokenizer.json" else None)
        f.write("\n")
    os.replace(tmp, path)


def convert(gguf_path, out_dir):
    g = Gguf(gguf_path)
    cfg = llama_config(g)
    tok = tokenizer_json(g)
    tensors, types = convert_weights(g, cfg)
    os.makedirs(out_dir, exist_ok=True)
    n_params = sum(a.size for _, a in tensors)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors,
                      {"format": "pt", "source": os.path.basename(gguf_path)})
    write_json(os.path.join(out_dir, "tokenizer.json"), tok)
    write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config(g, cfg))
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    write_json(os.path.join(out_dir, "generation_config.json"), gen)
    write_json(os.path.join(out_dir, "config.json"), cfg)  # last: its presence means the directory is complete
    return cfg, n_params, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, help="GGUF file (llama architecture, byte-level BPE tokenizer)")
    ap.add_argument("--out", required=True, help="output directory (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--config-only", action="store_true",
                    help="write only OUT/config.json (reads the metadata, not the weights): a quick look at the architecture")
    a = ap.parse_args()
    try:
        if a.config_only:
            cfg = llama_config(Gguf(a.gguf))
            os.makedirs(a.out, exist_ok=True)
            write_json(os.path.join(a.out, "config.json"), cfg)
            print(f"gguf_to_hf: {a.gguf} -> {a.out}/config.json")
            return 0
        cfg, n, types = convert(a.gguf, a.out)
    except ConvertError as e:
        print(f"gguf_to_hf: error: {e}", file=sys.stderr)
        return 2
    kinds = ", ".join(f"{v} {k}" for k, v in sorted(types.items()))
    print(f"gguf_to_hf: {a.gguf} -> {a.out}: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}, {n:,} parameters (dequantised to float32 from {kinds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
