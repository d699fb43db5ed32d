#!/usr/bin/env python3
"""Golden fixtures for the model/ tests, made with the real `transformers`.

Creates tiny random-initialised models (LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM
(softmax router, SwiGLU experts), NemotronH with
all four layer kinds M * - E, and NemotronH with a latent MoE), saves each with
save_pretrained (safetensors + config.json) under tests/fixtures/model/<name>/ together with
golden.safetensors (fixed input ids and the fp32 logits transformers computes) and meta.json
(parameter count, versions).

  python3 scripts/make_model_fixtures.py                  # (re)generate fixtures
  python3 scripts/make_model_fixtures.py --check-export build/tests/model/export [--only NAME...]
      # load what the C++ exporter wrote back into transformers and compare logits

Needs: pip install torch transformers safetensors. CI does not run this script.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "model")
BATCH, SEQ = 2, 11  # 11 is not a multiple of the Mamba chunk (4): exercises padding


def perturb(model, seed):
    """Random values everywhere (norm weights, biases, router bias too) so that every
    parameter influences the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 4 + 0.5))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) - 2.0)
                p[0] = -10.0  # softplus < time_step_min: exercises the dt clamp
            elif name.endswith(".D"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))


def llama():
    cfg = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=128, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg)


def qwen3():
    cfg = transformers.Qwen3Config(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=1000000.0, max_position_embeddings=128, tie_word_embeddings=True)
    return transformers.Qwen3ForCausalLM(cfg)


def qwen3_moe():
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=128,
        tie_word_embeddings=False)
    return transformers.Qwen3MoeForCausalLM(cfg)


def nemotron_h(latent):
    cfg = transformers.NemotronHConfig(
        vocab_size=96, hidden_size=64, hybrid_override_pattern="M*-EM-E" if not latent else "ME*E",
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16, n_groups=2, conv_kernel=4,
        chunk_size=4, intermediate_size=96, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
        moe_latent_size=32 if latent else None, routed_scaling_factor=2.5, norm_topk_prob=True,
        n_group=1, topk_group=1, layer_norm_epsilon=1e-5, max_position_embeddings=128,
        time_step_min=0.001, time_step_max=0.1, time_step_limit=(0.001, float("inf")),
        tie_word_embeddings=False)
    return transformers.NemotronHForCausalLM(cfg)


FIXTURES = {
    "llama": (llama, 1),
    "qwen3": (qwen3, 2),
    "qwen3_moe": (qwen3_moe, 5),
    "nemotron_h": (lambda: nemotron_h(False), 3),
    "nemotron_h_latent": (lambda: nemotron_h(True), 4),
}


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def make(name):
    build, seed = FIXTURES[name]
    torch.manual_seed(seed)
    model = build().float().eval()
    perturb(model, seed)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))
    logits = logits_of(model, ids)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, os.path.join(d, "golden.safetensors"))
    meta = {
        "num_parameters": model.num_parameters(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "batch": BATCH, "seq": SEQ,
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"{name}: {meta['num_parameters']} parameters, logits {tuple(logits.shape)}")


def check_export(export_root, names):
    """Each <export_root>/<name>/ holds what the C++ exporter wrote (safetensors + config.json)."""
    worst = 0.0
    for name in names:
        d = os.path.join(export_root, name)
        if not os.path.isdir(d):
            print(f"{name}: no export at {d}")
            return 1
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        golden = load_file(os.path.join(OUT, name, "golden.safetensors"))
        err = (logits_of(model, golden["input_ids"]) - golden["logits"]).abs().max().item()
        worst = max(worst, err)
        print(f"{name}: {type(model).__name__} loaded from the C++ export, max |logits diff| = {err:.3g}")
    ok = worst <= 1e-4
    print("export check:", "PASS" if ok else "FAIL", f"(transformers {transformers.__version__}, torch {torch.__version__})")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-export", metavar="DIR")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    if a.check_export:
        return check_export(a.check_export, a.only or list(FIXTURES))
    torch.set_num_threads(1)
    for name in a.only or FIXTURES:
        make(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
