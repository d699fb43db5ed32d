#!/usr/bin/env python3
"""C++ CausalLM vs PyTorch eager (transformers) on the same Hugging Face model, weights,
threads and input ids, measured in one run; prints tokens/s and the ratio C++ / PyTorch.

  python3 bench/bench_model.py --bench build/bench/bench_model [--threads 1] [--seq 256]

Models (random weights, created here with transformers): ~21M dense LlamaForCausalLM and a
~21M NemotronH hybrid (Mamba-2, attention, squared-ReLU MLP, MoE). dtypes float32, bfloat16.
Needs pip torch + transformers + safetensors (not used by CI).
bench_model, like the autocompress launcher, re-executes itself with GOMP_SPINCOUNT=1000 when
neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set (dist/omp_env.h); AC_NO_REEXEC=1 measures
libgomp's default instead. Those variables are the C++ side's only: the PyTorch side runs with
this process's environment.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from safetensors.torch import save_file


def dense():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096))


def hybrid():
    return transformers.NemotronHForCausalLM(transformers.NemotronHConfig(
        vocab_size=8192, hidden_size=512, hybrid_override_pattern="M-M*ME",
        num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        mamba_num_heads=16, mamba_head_dim=64, ssm_state_size=64, n_groups=2, chunk_size=128,
        intermediate_size=1536, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=512, moe_shared_expert_intermediate_size=1024,
        time_step_limit=(0.001, float("inf")), max_position_embeddings=4096))


def time_torch(model, ids, iters, warmup):
    with torch.no_grad():
        for _ in range(warmup):
            model(input_ids=ids)
        t0 = time.perf_counter()
        for _ in range(iters):
            model(input_ids=ids)
        fwd = (time.perf_counter() - t0) / iters

    def step():
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids.reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return fwd, (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="path of the bench_model executable")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; best of each is kept")
    ap.add_argument("--models", nargs="*", default=["dense", "hybrid"])
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    a = ap.parse_args()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {cpu} (figures are of this CPU only; bf16 is slow where it has no AVX512_BF16/AMX)")
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)  # the same CPU mode as autocompress (FTZ + DAZ, dist/omp_env.h)
    rows = []
    wait_policy = "?"
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            torch.manual_seed(0)
            model = (dense if name == "dense" else hybrid)().eval()
            d = os.path.join(tmp, name)
            model.save_pretrained(d)
            ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))
            save_file({"input_ids": ids}, os.path.join(d, "ids.safetensors"))
            nparams = model.num_parameters()
            for dtype in a.dtypes:
                m = model.to(getattr(torch, dtype))
                cmd = [a.bench, "--model", d, "--dtype", dtype, "--threads", str(a.threads),
                       "--iters", str(a.iters), "--warmup", str(a.warmup), "--ids", os.path.join(d, "ids.safetensors")]
                # Same thread count for every pool the C++ side may use (ATen, OpenMP, OpenBLAS).
                env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
                tok = ids.numel()
                best = dict(torch_fwd=0.0, torch_fwdbwd=0.0, cpp_fwd=0.0, cpp_fwdbwd=0.0)
                # Alternate the two implementations and keep each one's best round: on a shared
                # machine this cancels most of the load that either run happens to meet.
                for _ in range(a.rounds):
                    fwd, fb = time_torch(m, ids, a.iters, a.warmup)
                    best["torch_fwd"] = max(best["torch_fwd"], tok / fwd)
                    best["torch_fwdbwd"] = max(best["torch_fwdbwd"], tok / fb)
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
                    res = json.loads(out.strip().splitlines()[-1])
                    best["cpp_fwd"] = max(best["cpp_fwd"], res["fwd_tokens_per_s"])
                    best["cpp_fwdbwd"] = max(best["cpp_fwdbwd"], res["fwdbwd_tokens_per_s"])
                    wait_policy = res.get("omp_wait", "?")
                row = dict(model=name, params=nparams, dtype=dtype, tokens=tok, **best)
                row["ratio_fwd"] = row["cpp_fwd"] / row["torch_fwd"]
                row["ratio_fwdbwd"] = row["cpp_fwdbwd"] / row["torch_fwdbwd"]
                rows.append(row)
                print(f"{name:6s} {nparams/1e6:5.1f}M {dtype:8s} fwd tok/s: torch {row['torch_fwd']:8.0f} "
                      f"C++ {row['cpp_fwd']:8.0f} ratio {row['ratio_fwd']:.2f} | fwd+bwd tok/s: torch "
                      f"{row['torch_fwdbwd']:8.0f} C++ {row['cpp_fwdbwd']:8.0f} ratio {row['ratio_fwdbwd']:.2f}", flush=True)
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}, threads {a.threads}, "
          f"batch {a.batch} x seq {a.seq}; OpenMP waiting: PyTorch process "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} GOMP_SPINCOUNT="
          f"{os.environ.get('GOMP_SPINCOUNT', 'unset')}, bench_model {wait_policy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
