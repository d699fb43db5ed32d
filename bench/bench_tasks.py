#!/usr/bin/env python3
"""Zero-shot benchmark scoring speed (issue 31), ratios in one run on the same requests, threads
and dtype (float32):

  ours (shared contexts: `autocompress eval --tasks`)  vs  the plain forward over the same token
  sequences (goal >= 1.5x), both by build/bench/bench_tasks;
  ours                                                 vs  transformers scoring the same requests
  one by one, from the teacher's converted HF directory (goal >= 1.0x).

  scripts/bench_venv.sh .venv-bench
  .venv-bench/bin/python bench/bench_tasks.py --model teachers/smollm2-135m --hf teachers/smollm2-135m/hf \\
      --tasks-dir DIR [--tasks hellaswag,arc_easy,piqa,winogrande] [--limit 10] [--threads 1] [--rounds 1]

Scored tokens: each request's context + continuation tokens (the same count for every path).
Prints one JSON line with the tokens/s of each path and the ratios.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def transformers_one_by_one(hf, requests, threads, rounds):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # the same CPU mode as autocompress (FTZ + DAZ, dist/omp_env.h)
    torch.set_grad_enabled(False)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    best, total = 1e30, 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        total = 0.0
        for r in requests:
            ctx, cont = r["context"], r["continuation"]
            ids = torch.tensor([ctx + cont[:-1]])
            logp = torch.log_softmax(model(ids).logits[0, len(ctx) - 1:].float(), dim=-1)
            total += float(logp.gather(1, torch.tensor(cont)[:, None]).sum())
        best = min(best, time.perf_counter() - t0)
    return best, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the teacher checkpoint (autocompress)")
    ap.add_argument("--hf", required=True, help="its converted HF directory (transformers; tokenizer.json)")
    ap.add_argument("--tasks-dir", required=True)
    ap.add_argument("--tasks", default="hellaswag,arc_easy,piqa,winogrande")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_tasks"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        req_path = os.path.join(tmp, "requests.json")
        cmd = [args.bench, "--model", args.model, "--tokenizer", os.path.join(args.hf, "tokenizer.json"),
               "--tasks-dir", args.tasks_dir, "--tasks", args.tasks, "--limit", str(args.limit),
               "--threads", str(args.threads), "--rounds", str(args.rounds), "--dtype", "f32", "--requests", req_path]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1])
        requests = json.load(open(req_path))["requests"]
    secs, hf_sum = transformers_one_by_one(args.hf, requests, args.threads, args.rounds)
    scored = ours["scored_tokens"]
    out = {"requests": len(requests), "scored_tokens": scored, "threads": args.threads, "tasks": args.tasks,
           "limit": args.limit, "tokens_per_second": dict(ours["tokens_per_second"], transformers=scored / secs),
           "logprob_sum": dict(ours["logprob_sum"], transformers=hf_sum),
           "ratio_shared_vs_plain": ours["ratio_shared_vs_plain"],
           "ratio_shared_vs_transformers": secs / ours["seconds"]["shared"]}
    print(json.dumps(out))
    print(f"bench_tasks: {len(requests)} requests, {scored} scored tokens, {args.threads} thread(s): ours (shared contexts) "
          f"{out['tokens_per_second']['shared']:.1f} tokens/s, plain forward {out['tokens_per_second']['plain']:.1f} "
          f"(ratio {out['ratio_shared_vs_plain']:.2f}, goal >= 1.5), transformers one by one "
          f"{out['tokens_per_second']['transformers']:.1f} (ratio {out['ratio_shared_vs_transformers']:.2f}, goal >= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
