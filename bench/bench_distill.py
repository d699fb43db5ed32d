#!/usr/bin/env python3
"""KD step throughput: `autocompress distill` vs the same KD step in PyTorch eager, one run.

  python3 bench/bench_distill.py --bin build/autocompress [--threads 2] [--steps 12]

Models (Llama layout, vocabulary 8192, random weights): a ~19M-parameter teacher (hidden
384, 8 layers) and a ~9M student (hidden 256, 6 layers). Both sides run the same step on the
same batch (micro-batch x seq tokens, random token ids), same threads, one process:
teacher forward (no grad), student forward + backward, forward KL over the full
vocabulary (T = 1), AdamW with fp32 state, gradient clipping at 1.0.
Both sides in one dtype (--dtype auto: bf16 where the CPU has native bf16, else fp32).
  - autocompress: `autocompress distill` (parameters in that dtype, fp32 ZeRO-1 masters), data
    from a Megatron dataset, checkpointing off; tokens/s = median of the logged steps after
    the first two.
  - PyTorch eager: transformers LlamaForCausalLM; the student in fp32 under
    torch.autocast(bfloat16) in bf16 (the standard mixed-precision recipe), the teacher in the dtype;
    log_softmax + kl_div(log_target=True) in fp32; torch.optim.AdamW (foreach).
Prints tokens/s for both, the ratio, MFU against the hardware profile's peak (--hardware,
e.g. cpu-local: this machine's profile once `autocompress cost calibrate` made it), and ZeRO-1 optimizer
bytes per rank against replicated AdamW from a 2-rank run (--dp2).
On a GPU (--device cuda, scripts/gpu_check.sh): both sides on cuda:0 in bf16 (eager: the
student in fp32 under torch.autocast, the standard recipe), --size gpu: a ~200M-parameter
teacher (hidden 1024, 12 layers) and a ~100M student (hidden 768, 8 layers), vocabulary 32000;
--peak: the GPU's measured bf16 GEMM FLOP/s, against which both sides' MFU is printed (6 x
student params + 2 x teacher params FLOPs per token, plus attention).
--size smollm2: the real pair of the demo and the grid: the SmolLM2-135M-Instruct teacher (our
checkpoint from scripts/teacher_smollm2.sh, --teacher-ckpt, default teachers/smollm2-135m; eager
loads its Hugging Face files from <ckpt>/hf) and a pruned-shape student (--student-config, default
a SmolLM2 with 18 of 30 layers and FFN 1024, ~76M parameters, the shape a 0.6x-TPOT target
prunes to), vocabulary 49,152, random init for the student. Three sides:
  - autocompress, teacher online (full KL, as the eager step),
  - autocompress with the teacher cache (`autocompress teacher-cache` made once in this run,
    its time printed; the step reads the teacher's top --top-k logits: KL over those K),
  - PyTorch eager, teacher online (full KL).
Needs pip torch + transformers (not used by CI).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers

VOCAB = 8192
# (hidden, ffn, layers, heads, kv heads) of the teacher and the student per --size.
SIZES = {"small": {"vocab": 8192, "teacher": (384, 1024, 8, 6, 2), "student": (256, 768, 6, 4, 2)},
         "gpu": {"vocab": 32000, "teacher": (1024, 2816, 12, 16, 4), "student": (768, 2048, 8, 12, 4)},
         "smollm2": {"vocab": 49152}}
SIZE = "small"
# --size smollm2: the teacher's Hugging Face directory and the student's config.json (set in main).
HF_TEACHER, STUDENT_CONFIG = "", ""
SMOLLM2_STUDENT = {"num_hidden_layers": 18, "intermediate_size": 1024}


def llama_config(which):
    if SIZE == "smollm2":
        if which == "teacher":
            return transformers.LlamaConfig.from_pretrained(HF_TEACHER)
        return transformers.LlamaConfig.from_pretrained(os.path.dirname(STUDENT_CONFIG))
    h, ffn, layers, heads, kv = SIZES[SIZE][which]
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=kv, head_dim=64,
                                    max_position_embeddings=4096, tie_word_embeddings=False)


def teacher_config():
    return llama_config("teacher")


def student_config():
    return llama_config("student")


def params_of(cfg):
    h, f, n, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return (1 if cfg.tie_word_embeddings else 2) * v * h + n * (h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h) + h


def flops_per_token(seq):
    """Model FLOPs of one KD token: student forward + backward (6 N), teacher forward (2 N), plus
    causal attention scores and values (forward 2 x 2 x seq/2 x q-width per layer, x3 with backward)."""
    s, t = student_config(), teacher_config()
    attn = lambda c: 2 * 2 * (seq / 2) * c.num_attention_heads * c.head_dim * c.num_hidden_layers
    return 6 * params_of(s) + 3 * attn(s) + 2 * params_of(t) + attn(t)


def write_megatron(prefix, tokens, doc_len):
    """A Megatron .bin/.idx (uint16) of documents of doc_len tokens."""
    tokens = tokens.astype(np.uint16)
    n_docs = len(tokens) // doc_len
    tokens = tokens[: n_docs * doc_len]
    tokens.tofile(prefix + ".bin")
    lengths = np.full(n_docs, doc_len, dtype=np.int32)
    pointers = np.arange(n_docs, dtype=np.int64) * doc_len * 2
    docs = np.arange(n_docs + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype=np.uint64).tobytes())
        f.write(np.array([8], dtype=np.uint8).tobytes())
        f.write(np.array([n_docs], dtype=np.uint64).tobytes())
        f.write(np.array([n_docs + 1], dtype=np.uint64).tobytes())
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(docs.tobytes())


def run(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def ours(args, work, env, ranks, tag, extra=()):
    out = os.path.join(work, tag)
    cmd = ([] if ranks == 1 else ["mpiexec", "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                                  "-n", str(ranks)]) + [
        args.bin, "distill", "--student", os.path.join(work, "student", "config.json"),
        "--teacher", args.teacher_path, "--data", os.path.join(work, "tokens"),
        "--seq-len", str(args.seq), "--micro-batch", str(args.batch // ranks), "--steps", str(args.steps),
        "--warmup", "2", "--lr", "1e-3", "--log-interval", "1", "--eval-interval", "0", "--save-interval", "0",
        "--split", "100,0,0", "--dtype", args.dtype, "--device", args.device, "--out", out] + list(extra)
    # The final checkpoint is written after the last logged step; it is not timed.
    if args.hardware:
        cmd += ["--hardware", args.hardware]
    log = run(cmd, env)
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"tokens_per_s"' in l]
    tps = statistics.median(r["tokens_per_s"] for r in recs[2:])
    mfu = statistics.median(r["mfu"] for r in recs[2:]) if "mfu" in recs[-1] else None
    opt_line = [l for l in log.splitlines() if "optimizer state" in l]
    return tps, mfu, (opt_line[0] if opt_line else ""), log


def native_bf16():
    """The choice `--dtype auto` makes in autocompress (dist/cpu_features.h): bf16 only where
    the CPU computes it natively (AVX512_BF16 or AMX-BF16), else fp32 on both sides."""
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def eager(args, tokens):
    torch.manual_seed(0)
    bf16 = args.dtype == "bf16"
    dev = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    t_dtype = torch.bfloat16 if bf16 else torch.float32
    if SIZE == "smollm2":
        teacher = transformers.LlamaForCausalLM.from_pretrained(HF_TEACHER, dtype=t_dtype).to(dev).eval()
    else:
        teacher = transformers.LlamaForCausalLM(teacher_config()).to(t_dtype).to(dev).eval()
    student = transformers.LlamaForCausalLM(student_config()).to(dev)
    for p in teacher.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    seq, b = args.seq, args.batch
    samples = torch.from_numpy(tokens[: (len(tokens) // (seq + 1)) * (seq + 1)].astype(np.int64)).view(-1, seq + 1)

    def step(i):
        batch = samples[(i * b) % (len(samples) - b):][:b]
        ids = batch[:, :-1].to(dev)
        with torch.no_grad():
            t_logits = teacher(input_ids=ids).logits
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            s_logits = student(input_ids=ids).logits
        s = F.log_softmax(s_logits.float().view(-1, VOCAB), dim=-1)
        t = F.log_softmax(t_logits.float().view(-1, VOCAB), dim=-1)
        loss = F.kl_div(s, t, log_target=True, reduction="batchmean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for i in range(2):
        step(i)
    times = []
    for i in range(2, args.steps):
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    return seq * b / statistics.median(times)


def prepare_smollm2(args, work):
    """The teacher checkpoint and its HF files, and the student's config.json (written here
    unless --student-config names one)."""
    global HF_TEACHER, STUDENT_CONFIG
    ckpt = args.teacher_ckpt
    HF_TEACHER = os.path.join(ckpt, "hf")
    if not os.path.isfile(os.path.join(HF_TEACHER, "config.json")):
        sys.exit(f"{HF_TEACHER}: no Hugging Face files (make the teacher with scripts/teacher_smollm2.sh)")
    args.teacher_path = ckpt
    if args.student_config:
        STUDENT_CONFIG = args.student_config
    else:
        cfg = json.load(open(os.path.join(HF_TEACHER, "config.json")))
        cfg.update(SMOLLM2_STUDENT)
        os.makedirs(os.path.join(work, "student"), exist_ok=True)
        STUDENT_CONFIG = os.path.join(work, "student", "config.json")
        json.dump(cfg, open(STUDENT_CONFIG, "w"), indent=1)


def make_cache(args, work, env):
    """`autocompress teacher-cache` over the samples the timed runs read; returns its tokens/s."""
    path = os.path.join(work, "teacher_cache.h5")
    t0 = time.perf_counter()
    run([args.bin, "teacher-cache", "--teacher", args.teacher_path, "--data", os.path.join(work, "tokens"),
         "--split", "100,0,0", "--seq-len", str(args.seq), "--samples", str(args.steps * args.batch),
         "--top-k", str(args.top_k), "--micro-batch", str(args.batch), "--dtype", args.dtype, "--device", args.device,
         "--out", path], env)
    return path, args.steps * args.batch * args.seq / (time.perf_counter() - t0)


def report_header(args):
    where = (torch.cuda.get_device_name(0) if args.device == "cuda" else
             next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"))
    print(f"threads {args.threads}, {args.dtype} on {where}, batch {args.batch} x seq {args.seq} tokens, "
          f"teacher {params_of(teacher_config()) / 1e6:.0f}M, student {params_of(student_config()) / 1e6:.0f}M "
          f"(vocab {VOCAB})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/autocompress")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4, help="samples per step (all ranks)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hardware", default="")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "f32"],
                    help="both sides (auto: bf16 where the CPU has native bf16, else f32, as autocompress picks)")
    ap.add_argument("--dp2", action="store_true", help="also run 2 ranks x threads/2 and report ZeRO-1 memory")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="both sides on this device (cuda: cuda:0)")
    ap.add_argument("--size", default="small", choices=sorted(SIZES),
                    help="the model pair (gpu: ~200M teacher, ~100M student; smollm2: the SmolLM2-135M teacher and a pruned-shape student)")
    ap.add_argument("--peak", type=float, default=0.0, help="peak FLOP/s (e.g. the GPU's measured bf16 GEMM) for MFU")
    ap.add_argument("--teacher-ckpt", default="teachers/smollm2-135m",
                    help="--size smollm2: our checkpoint of the teacher (scripts/teacher_smollm2.sh), with its HF files in <dir>/hf")
    ap.add_argument("--student-config", default="", help="--size smollm2: the student's Hugging Face config.json (default: 18 layers, FFN 1024)")
    ap.add_argument("--top-k", type=int, default=64, help="--size smollm2: teacher logits per token in the cache")
    args = ap.parse_args()
    global SIZE, VOCAB
    SIZE, VOCAB = args.size, SIZES[args.size]["vocab"]
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: this torch sees no GPU")
    if args.dtype == "auto":
        args.dtype = "bf16" if args.device == "cuda" or native_bf16() else "f32"
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # the same CPU mode as autocompress (FTZ + DAZ, dist/omp_env.h)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as work:
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, VOCAB, size=max(400_000, 2 * args.steps * args.batch * (args.seq + 1)))
        write_megatron(os.path.join(work, "tokens"), tokens, 2048)
        if SIZE == "smollm2":
            prepare_smollm2(args, work)
            cache, cache_tps = make_cache(args, work, env)
            cached = lambda tag: ours(args, work, env, 1, tag, ["--teacher-cache", cache])
        else:
            for name, cfg in (("teacher", teacher_config()), ("student", student_config())):
                cfg.save_pretrained(os.path.join(work, name))
            # A teacher checkpoint in our format (random weights; one pretraining step).
            run([args.bin, "pretrain", "--arch", os.path.join(work, "teacher", "config.json"), "--data",
                 os.path.join(work, "tokens"), "--seq-len", "32", "--micro-batch", "1", "--steps", "1",
                 "--eval-interval", "0", "--split", "100,0,0", "--device", args.device,
                 "--out", os.path.join(work, "teacher_ckpt")], env)
            args.teacher_path = os.path.join(work, "teacher_ckpt", "checkpoints")
        # Alternate so every side sees the same machine load.
        t_ours, mfu, opt_line, _ = ours(args, work, env, 1, "ours")
        t_eager = eager(args, tokens)
        t_ours2, mfu2, _, _ = ours(args, work, env, 1, "ours2")
        if SIZE == "smollm2":
            t_cached = cached("cached")[0]
        t_eager2 = eager(args, tokens)
        if SIZE == "smollm2":
            t_cached2 = cached("cached2")[0]
        a, e = max(t_ours, t_ours2), max(t_eager, t_eager2)
        report_header(args)
        print(f"  autocompress distill : {t_ours:8.0f} / {t_ours2:8.0f} tokens/s" +
              (f"  (MFU {100 * max(mfu, mfu2):.1f}% of the profile's peak)" if mfu else ""))
        print(f"  PyTorch eager KD step: {t_eager:8.0f} / {t_eager2:8.0f} tokens/s")
        print(f"  ratio (best of 2 each): {a / e:.2f}x")
        if SIZE == "smollm2":
            c = max(t_cached, t_cached2)
            print(f"  autocompress distill --teacher-cache (top {args.top_k}): {t_cached:8.0f} / {t_cached2:8.0f} tokens/s, "
                  f"{c / e:.2f}x eager, {c / a:.2f}x ours online")
            print(f"  teacher-cache made at {cache_tps:.0f} tokens/s (once per teacher, data and seed; every student reuses it)")
        if mfu:
            print(f"  eager MFU (same FLOPs per token): {100 * max(mfu, mfu2) * e / a:.1f}%")
        if args.peak > 0:
            fpt = flops_per_token(args.seq)
            print(f"  MFU against the measured peak {args.peak / 1e12:.1f} TFLOP/s ({fpt / 1e9:.2f} GFLOP per token): "
                  f"autocompress {100 * a * fpt / args.peak:.1f}%, eager {100 * e * fpt / args.peak:.1f}%")
        if opt_line:
            print("  " + opt_line.strip())
        if args.dp2:
            env2 = dict(os.environ, OMP_NUM_THREADS=str(max(1, args.threads // 2)))
            t2, _, opt2, _ = ours(args, work, env2, 2, "ours_dp2")
            print(f"  2 ranks (DP 2) x {max(1, args.threads // 2)} thread(s): {t2:8.0f} tokens/s")
            if opt2:
                print("  " + opt2.strip())


if __name__ == "__main__":
    main()
