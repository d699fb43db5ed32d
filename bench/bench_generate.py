#!/usr/bin/env python3
"""Decode tokens/s of the local engine against Hugging Face transformers `generate`, and eval
tokens/s of `autocompress eval` against the plain forward, on the real teacher, in one run.

  .venv-bench/bin/python bench/bench_generate.py --bench build/bench/bench_generate \\
      --bin build/autocompress [--teacher teachers/smollm2-135m] [--threads 1]

- Same teacher: the HDF5 checkpoint (ours) and the Hugging Face directory it was imported from
  (TEACHER/hf, scripts/teacher_smollm2.sh); both f32.
- Same prompts: C documents of the fortunes sample, tokenized with the teacher's tokenizer.json
  (the `tokenizers` library; our BPE gives the same ids) and cut to --prompt-tokens each.
- Same threads: OMP_NUM_THREADS / torch.set_num_threads(--threads) on both sides.
- Greedy, --new-tokens per sequence on both sides (HF: min_new_tokens = max_new_tokens, so an
  end-of-sequence token does not stop it early; ours never stops early).
- Decode tokens/s: tokens of the decode steps after the first token over their time. Ours from
  generate_static_batch's per-step timings; HF as (C x (N - 1)) / (t(N) - t(1)), t(n) the wall
  time of `generate` with n new tokens (the prefill and the first token cancel). Best of --rounds.
- Eval: `autocompress eval --seq-len S --samples K --micro-batch 1 --last-word-docs 0` on the
  fortunes sample's eval split, run with K and with 1 sample; its tokens/s is (K - 1) x S over
  the difference of the two runs' `seconds` (which include loading the checkpoint; the
  difference leaves the scoring of K - 1 samples: forward, cross-entropy, accuracy, data).
  Against bench_generate --forward: logits of [1, S] ids, best of --rounds x K forwards, same
  checkpoint, threads and dtype. The transformers forward of the same shape is printed beside
  it. `seconds` of one eval run (with the load) is printed too.
- --clock cpu: every time above is CPU time instead (bench_generate's std::clock, the Python
  process's process_time, the eval runs' user + sys from getrusage), so a machine shared with
  other work does not make either side look slow; at 1 thread CPU time is the work done.
Needs torch + transformers + tokenizers (scripts/bench_venv.sh; not used by CI).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def die(msg):
    print(f"bench_generate: error: {msg}", file=sys.stderr)
    sys.exit(2)


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_json(cmd, env):
    """The command's last JSON line, with "cpu_seconds": its CPU time (user + sys)."""
    c0 = children_cpu()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    j = json.loads(p.stdout.strip().splitlines()[-1])
    j["cpu_seconds"] = children_cpu() - c0
    return j


def make_prompts(corpus, tokenizer, count, length):
    """The first `count` documents of at least `length` tokens, each cut to `length` ids."""
    out = []
    with open(corpus) as f:
        for line in f:
            text = json.loads(line)["text"]
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) >= length:
                out.append(ids[:length])
            if len(out) == count:
                return out
    die(f"{corpus}: fewer than {count} documents of {length} tokens")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=os.path.join(root, "build/bench/bench_generate"))
    ap.add_argument("--bin", default=os.path.join(root, "build/autocompress"))
    ap.add_argument("--teacher", default=os.path.join(root, "teachers/smollm2-135m"))
    ap.add_argument("--hf", help="Hugging Face directory of the teacher (default TEACHER/hf)")
    ap.add_argument("--corpus", default=os.path.join(root, "tests/fixtures/data/corpus/fortunes_sample.jsonl"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--eval-seq", type=int, default=512)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time both sides by CPU time (process time), which a machine shared with other "
                         "work does not distort the way it distorts wall time")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: decode,eval")
    a = ap.parse_args()
    hf = a.hf or os.path.join(a.teacher, "hf")
    for p, what in ((a.bench, "--bench"), (a.bin, "--bin")):
        if not os.access(p, os.X_OK):
            die(f"{p}: {what}: not an executable (cmake --build build --target bench_generate autocompress)")
    if not os.path.isfile(os.path.join(a.teacher, "latest")):
        die(f"{a.teacher}: --teacher: no checkpoint (scripts/teacher_smollm2.sh makes it)")
    for f in ("config.json", "tokenizer.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(hf, f)):
            die(f"{hf}: --hf: no {f} (scripts/teacher_smollm2.sh makes it)")
    if a.new_tokens < 2:
        die("--new-tokens: must be at least 2")
    conc = [int(c) for c in a.concurrency.split(",")]
    skip = set(filter(None, a.skip.split(",")))

    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import transformers
    from tokenizers import Tokenizer

    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)  # the same CPU mode as autocompress (FTZ + DAZ, dist/omp_env.h)
    transformers.logging.disable_progress_bar()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"# {cpu}; {a.threads} thread(s); f32; {a.clock} clock; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")
    tok = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    model.eval()
    results = {"cpu": cpu, "threads": a.threads, "clock": a.clock, "torch": torch.__version__, "transformers": transformers.__version__}

    if "decode" not in skip:
        prompts = make_prompts(a.corpus, tok, max(conc), a.prompt_tokens)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"prompts": prompts}, f)
            pfile = f.name
        eos = model.config.eos_token_id

        now = time.process_time if a.clock == "cpu" else time.perf_counter

        def hf_generate(ids, n):
            t0 = now()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                                     max_new_tokens=n, min_new_tokens=n, pad_token_id=eos, use_cache=True,
                                     temperature=None, top_p=None, top_k=None)
            return now() - t0, out[:, ids.shape[1]:].tolist()

        print("| concurrency | prompt | new | ours decode tok/s | HF decode tok/s | ratio | ours e2e tok/s | HF e2e tok/s "
              "| greedy ids equal |")
        print("|---|---|---|---|---|---|---|---|---|")
        for c in conc:
            ours = run_json([a.bench, "--model", a.teacher, "--prompts", pfile, "--concurrency", str(c), "--new-tokens",
                             str(a.new_tokens), "--threads", str(a.threads), "--rounds", str(a.rounds), "--clock", a.clock], env)
            ids = torch.tensor(prompts[:c], dtype=torch.long)
            hf_generate(ids, 4)  # warm-up
            t1 = min(hf_generate(ids, 1)[0] for _ in range(a.rounds))
            runs = [hf_generate(ids, a.new_tokens) for _ in range(a.rounds)]
            tn = min(r[0] for r in runs)
            hf_ids = runs[0][1]
            hf_decode = c * (a.new_tokens - 1) / max(tn - t1, 1e-9)
            hf_e2e = c * a.new_tokens / tn
            same = sum(x == y for x, y in zip(ours["ids"], hf_ids))
            ratio = ours["decode_tokens_per_s"] / hf_decode
            print(f"| {c} | {a.prompt_tokens} | {a.new_tokens} | {ours['decode_tokens_per_s']:.1f} | {hf_decode:.1f} | "
                  f"**{ratio:.2f}** | {ours['e2e_tokens_per_s']:.1f} | {hf_e2e:.1f} | {same}/{c} sequences |", flush=True)
            results[f"decode_c{c}"] = {"ours": ours["decode_tokens_per_s"], "hf": hf_decode, "ratio": ratio,
                                       "ours_e2e": ours["e2e_tokens_per_s"], "hf_e2e": hf_e2e, "ids_equal": same}
        os.unlink(pfile)

    if "eval" not in skip:
        with tempfile.TemporaryDirectory() as d:
            prefix = os.path.join(d, "fortunes")
            subprocess.run([a.bin, "data", "preprocess", "--input", a.corpus, "--tokenizer",
                            os.path.join(hf, "tokenizer.json"), "--output", prefix, "--quiet"], env=env, check=True,
                           capture_output=True)
            def ev_run(k):
                return run_json([a.bin, "eval", "--model", a.teacher, "--data", prefix, "--split", "80,0,20",
                                 "--seq-len", str(a.eval_seq), "--samples", str(k), "--micro-batch", "1",
                                 "--last-word-docs", "0", "--dtype", "f32", "--json", "--quiet"], env)
            key = "cpu_seconds" if a.clock == "cpu" else "seconds"
            ev1 = min((ev_run(1) for _ in range(a.rounds)), key=lambda j: j[key])
            evk = min((ev_run(a.eval_samples) for _ in range(a.rounds)), key=lambda j: j[key])
        if evk["tokens"] != a.eval_samples * a.eval_seq:
            die(f"eval scored {evk['tokens']} tokens, not {a.eval_samples} x {a.eval_seq} (a smaller eval split?)")
        ev_tps = (a.eval_samples - 1) * a.eval_seq / max(evk[key] - ev1[key], 1e-9)
        fw = run_json([a.bench, "--model", a.teacher, "--forward", "--seq", str(a.eval_seq), "--batch", "1", "--iters",
                       str(a.eval_samples), "--threads", str(a.threads), "--rounds", str(a.rounds), "--clock", a.clock],
                      env)
        ids = torch.randint(0, model.config.vocab_size, (1, a.eval_seq))
        now = time.process_time if a.clock == "cpu" else time.perf_counter
        with torch.no_grad():
            model(input_ids=ids)
            t0 = now()
            for _ in range(a.eval_samples):
                model(input_ids=ids)
            hf_fwd = a.eval_samples * a.eval_seq / (now() - t0)
        ratio = ev_tps / fw["forward_tokens_per_s"]
        with_load = evk["tokens"] / evk[key]  # the whole eval run (wall: load + scoring; cpu: the process)
        print(f"\n| eval tok/s ({a.eval_samples} - 1 samples x {a.eval_seq}) | eval tok/s with the load "
              f"({evk[key]:.1f} s) | plain forward tok/s | ratio | transformers forward tok/s |")
        print("|---|---|---|---|---|")
        print(f"| {ev_tps:.1f} | {with_load:.1f} | {fw['forward_tokens_per_s']:.1f} | "
              f"**{ratio:.2f}** | {hf_fwd:.1f} |")
        results["eval"] = {"eval": ev_tps, "with_load": with_load, "forward": fw["forward_tokens_per_s"],
                           "ratio": ratio, "hf_forward": hf_fwd}
    print("json: " + json.dumps(results))


if __name__ == "__main__":
    main()
