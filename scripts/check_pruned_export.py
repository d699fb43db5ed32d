#!/usr/bin/env python3
"""By-hand check (issue 14): a uniformly pruned Llama and Nemotron-H, exported to the Hugging
Face layout, load in transformers and give our logits; and the golden fixture that CI checks
our export against (tests/fixtures/pruned/<name>/, test search.pruned_export, no torch).

  python3 scripts/check_pruned_export.py [--ac build/autocompress] [--test build/tests/search/test_pruned_export]
                                         [--work DIR] [--write-golden]

For each fixture teacher (tests/fixtures/model/llama, tests/fixtures/model/nemotron_h, made by
scripts/make_model_fixtures.py), through the `autocompress` command line:
  1. `checkpoint import --dtype f32` of the fixture,
  2. `importance` on seeded calibration tokens of its 96-token vocabulary,
  3. `prune` to a uniform student (every layer the same: hidden, heads, FFN, Mamba heads,
     experts, expert / shared FFN; the Nemotron-H student also drops one layer),
  4. `export --format safetensors --dtype f32`,
  5. transformers' AutoModelForCausalLM loads the export (LlamaForCausalLM /
     NemotronHForCausalLM) and computes the logits of the fixture's input ids.
Then the C++ test binary (built with the tree) prunes and exports the same student from the
same importance file, computes our logits of its export and of the pruned checkpoint and
compares them with transformers' (it prints max |diff|). --write-golden copies student.json,
importance.h5, the export's config.json and transformers' logits (golden.safetensors) into
tests/fixtures/pruned/<name>/.

Needs (by hand only, not in CI): pip install torch transformers safetensors numpy.
Recorded in docs/pruning.md ("Pruned exports in transformers").
"""
import argparse
import copy
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FIXTURES = os.path.join(ROOT, "tests", "fixtures", "model")
OUT = os.path.join(ROOT, "tests", "fixtures", "pruned")
NAMES = ["llama", "nemotron_h"]
TOL = 1e-4


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed (exit {r.returncode}):\n{r.stdout}")
    return r.stdout


def write_calib(prefix):
    """Calibration tokens of the fixtures' 96-token vocabulary as a Megatron .bin/.idx."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 96, size=40 + i % 9, dtype=np.uint16) for i in range(24)]
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(d.tobytes())
    lens = np.array([len(d) for d in docs], dtype=np.int32)
    offs = np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * 2)]).astype(np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(lens.tobytes() + offs.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def uniform_student(teacher, name):
    """The teacher's ArchSpec (as stored in its checkpoint) with one value per axis for all
    layers, as Minitron prunes: every width axis the family has is cut."""
    s = copy.deepcopy(teacher)
    s["name"] = f"{name}-pruned"
    s["hidden_size"] = 48
    cut = {
        "attention": {"num_heads": 2},                 # 4 -> 2 (1 per KV group; KV groups stay 2)
        "mlp": {"ffn_size": 64},                       # 96 -> 64
        "mamba": {"num_heads": 4, "head_dim": 6},      # 8 -> 4 heads (2 per B/C group), head dim 8 -> 6
        "moe": {"num_experts": 4, "expert_ffn": 16, "shared_ffn": 32},  # 8 -> 4, 32 -> 16, 48 -> 32
    }
    for kind, values in cut.items():
        if kind in s.get("defaults", {}):
            s["defaults"][kind].update(values)
    if "layers" in s:
        for layer in s["layers"]:
            for kind, values in cut.items():
                if isinstance(layer.get(kind), dict):
                    layer[kind].update({k: v for k, v in values.items() if k in layer[kind]})
    if name == "nemotron_h":
        # Depth: drop the second dense MLP layer (M*-EM-E -> M*-EM.E); the export leaves it
        # out and renumbers the later layers.
        if "pattern" in s:
            p = list(s["pattern"])
            assert p[5] == "-", s["pattern"]
            p[5] = "."
            s["pattern"] = "".join(p)
        else:
            assert s["layers"][5].get("kind") == "-", s["layers"][5]
            s["layers"][5] = {"kind": "."}
    return s


def teacher_arch(ac, ckpt):
    j = json.loads(run([ac, "checkpoint", "inspect", ckpt, "--json"]))
    a = j["attributes"]["arch_spec"]
    return json.loads(a) if isinstance(a, str) else a


def transformers_logits(hf_dir, ids):
    import torch
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = m(input_ids=ids).logits.float()
    return type(m).__name__, m.num_parameters(), logits


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ac", default=os.path.join(ROOT, "build", "autocompress"))
    ap.add_argument("--test", default=os.path.join(ROOT, "build", "tests", "search", "test_pruned_export"))
    ap.add_argument("--work", help="scratch directory (default: a new temporary one)")
    ap.add_argument("--write-golden", action="store_true", help="copy the results into tests/fixtures/pruned/")
    a = ap.parse_args()

    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for cls in ("LlamaForCausalLM", "NemotronHForCausalLM"):
        if not hasattr(transformers, cls):
            sys.exit(f"this transformers ({transformers.__version__}) has no {cls}")

    work = a.work or tempfile.mkdtemp(prefix="ac_pruned_export_")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    calib = os.path.join(work, "calib")
    write_calib(calib)
    results = {}
    for name in NAMES:
        w = os.path.join(work, name)
        shutil.rmtree(w, ignore_errors=True)
        os.makedirs(w)
        teacher = os.path.join(w, "teacher")
        run([a.ac, "checkpoint", "import", "--hf", os.path.join(MODEL_FIXTURES, name), "--out", teacher, "--dtype", "f32"], env=env)
        run([a.ac, "importance", "--teacher", teacher, "--data", calib, "--split", "0,1,0", "--calib-samples", "8",
             "--seq-len", "16", "--micro-batch", "2", "--seed", "3", "--dtype", "f32",
             "--out", os.path.join(w, "importance.h5")], env=env)
        student = uniform_student(teacher_arch(a.ac, teacher), name)
        with open(os.path.join(w, "student.json"), "w") as f:
            json.dump(student, f, indent=2)
            f.write("\n")
        print(run([a.ac, "prune", "--teacher", teacher, "--importance", os.path.join(w, "importance.h5"),
                   "--arch", os.path.join(w, "student.json"), "--out", os.path.join(w, "student")], env=env).strip())
        run([a.ac, "export", "--checkpoint", os.path.join(w, "student"), "--format", "safetensors", "--dtype", "f32",
             "--out", os.path.join(w, "hf")], env=env)
        ids = load_file(os.path.join(MODEL_FIXTURES, name, "golden.safetensors"))["input_ids"]
        cls, params, logits = transformers_logits(os.path.join(w, "hf"), ids)
        teacher_params = transformers_logits(os.path.join(MODEL_FIXTURES, name), ids)[1]
        print(f"{name}: transformers {cls} loaded the pruned export: {params} parameters (teacher {teacher_params}), "
              f"logits {tuple(logits.shape)}")
        save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, os.path.join(w, "golden.safetensors"))
        shutil.copy(os.path.join(w, "hf", "config.json"), os.path.join(w, "config.json"))
        with open(os.path.join(w, "meta.json"), "w") as f:
            json.dump({"class": cls, "num_parameters": params, "teacher_num_parameters": teacher_params,
                       "transformers": transformers.__version__, "torch": torch.__version__}, f, indent=2)
            f.write("\n")
        results[name] = (cls, params)

    # Our logits: the C++ test prunes + exports the same student from the same importance file
    # and compares its logits (of the export and of the pruned checkpoint) with transformers'.
    if not os.path.exists(a.test):
        sys.exit(f"{a.test}: no test binary (cmake --build build --target test_pruned_export)")
    r = subprocess.run([a.test], env=dict(env, AC_PRUNED_FIXTURES=work, AC_TEST_TMP=os.path.join(work, "ctest")),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print("\n".join(l for l in r.stdout.splitlines() if "max |" in l or "PASSED" in l or "FAILED" in l or "Failure" in l))
    if r.returncode != 0:
        print(r.stdout)
        sys.exit("our logits differ from transformers' (see above)")
    if a.write_golden:
        for name in NAMES:
            d = os.path.join(OUT, name)
            os.makedirs(d, exist_ok=True)
            for f in ("student.json", "importance.h5", "config.json", "golden.safetensors", "meta.json"):
                shutil.copy(os.path.join(work, name, f), os.path.join(d, f))
            print(f"wrote {d}")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
