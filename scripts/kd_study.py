#!/usr/bin/env python3
"""The AutoCompress-vs-Minitron ranking as distillation grows (issue 32): one long KD run per
student, scored at several points of that run on the eight zero-shot benchmarks and the LM
metrics, and a page with the plot.

    python3 scripts/kd_study.py [--target cpu-local] [--seeds 1,2] [--steps 160] [--points 10,40]
        [--limit 50] [--out runs/study] [--results docs/kd_study.md] [--ac build/autocompress]
        [--mpi "mpiexec -n 2"] [--set SECTION.KEY=VALUE ...] [--dry-run] [--report-only]

Per seed, one cell: `autocompress run --config CONFIGS/<target>.cfg --seed S --out
OUT/<target>-s<S>` with `[distill] steps = STEPS, save-steps = POINTS, keep-last = 0` set on top
of the config (scripts/run_grid.py's runner: logged to OUT/<cell>.log, a finished cell is never
rerun, an interrupted one continues). Both methods of a cell get the same teacher, data, seed,
budget, KD tokens and steps; every point is a checkpoint of that one run (step_<N>.h5), so the
learning-rate schedule is the long run's (cosine to STEPS), not a short run's.

Then per method and point (the pruned student before distillation, each POINT and STEPS):
    eval --model CKPT --data D --teacher T --seq-len 512 --samples N --json   (loss, KL)
    eval --model CKPT --tasks core8 --limit L --json                           (accuracies)
each written to OUT/<cell>/study/<method>-<point>.json (atomically, with the scoring settings:
--limit, --tasks, --eval-samples, --eval-seq-len; a point done is never recomputed, and a run or
report asking other settings of it exits 2 naming the file). The teacher's task scores are
computed once per study (OUT/teacher-tasks.json).

RESULTS (docs/kd_study.md) and the plot beside it (.png: mean accuracy and eval loss against KD
tokens, both methods, each seed and the mean) are written from those files alone.
Exit codes: 0 done; 1 a command failed; 2 bad usage; 75 interrupted (rerun to continue).
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plotting  # noqa: E402
import run_grid  # noqa: E402

PROG = "kd_study"
REPO = run_grid.REPO
METHODS = run_grid.METHODS
TITLE = run_grid.TITLE
SEARCH_DIR = {"autocompress": "search", "minitron": "minitron"}
NOTES_MARK = "<!-- notes: kept by kd_study.py -->"


def command_line(a):
    """The study's command as run: every setting that decides its numbers (the overrides too)."""
    words = ["python3", "scripts/kd_study.py", "--target", a.target, "--seeds", a.seeds, "--steps", str(a.steps),
             "--points", ",".join(str(p) for p in a.point_list[:-1]), "--limit", str(a.limit),
             "--out", os.path.relpath(a.out, REPO) if os.path.isabs(a.out) else a.out,
             "--results", os.path.relpath(a.results, REPO) if os.path.isabs(a.results) else a.results]
    for kv in a.set or []:
        words += ["--set", kv]
    return " ".join(shlex.quote(w) for w in words)


def die(msg, rc=2):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(rc)


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="cpu-local")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--steps", type=int, default=160, help="optimizer steps of each student's one KD run")
    p.add_argument("--points", default="10,40", help="steps scored before the last (comma list)")
    p.add_argument("--limit", type=int, default=50, help="documents per task (eval --limit)")
    p.add_argument("--tasks", default="core8")
    p.add_argument("--eval-samples", type=int, default=32, help="samples of the eval split for loss and KL")
    p.add_argument("--eval-seq-len", type=int, default=512, help="tokens per eval sample")
    p.add_argument("--out", default="runs/study")
    p.add_argument("--configs", default=os.path.join(REPO, "configs", "experiments"))
    p.add_argument("--results", default=os.path.join(REPO, "docs", "kd_study.md"))
    p.add_argument("--ac", default=os.path.join(REPO, "build", "autocompress"))
    p.add_argument("--mpi", default="")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args(argv)
    try:
        a.seed_list = [int(s) for s in a.seeds.split(",") if s]
        a.point_list = sorted({int(s) for s in a.points.split(",") if s} | {a.steps})
    except ValueError:
        die("--seeds and --points take comma lists of integers")
    if not a.seed_list or a.steps <= 0 or any(p <= 0 or p > a.steps for p in a.point_list):
        die(f"--points must lie in 1..--steps ({a.steps}) and --seeds must name at least one seed")
    if a.limit <= 0:
        die("--limit must be positive (the full tasks take hours on a CPU)")
    if not os.path.exists(os.path.join(a.configs, a.target + ".cfg")):
        die(f"{os.path.join(a.configs, a.target + '.cfg')}: no such config")
    # Checkpoints only at the points (and on signals): keep-last 0 keeps every one of them.
    a.study_set = [f"distill.steps={a.steps}", "distill.save-interval=0", "distill.keep-last=0"]
    if len(a.point_list) > 1:
        a.study_set.append("distill.save-steps=" + ",".join(str(p) for p in a.point_list[:-1]))
    return a


class Cell(run_grid.Cell):
    def __init__(self, seed, a):
        grid_args = argparse.Namespace(out=a.out, configs=a.configs, set=a.study_set + a.set, mpi=a.mpi, ac=a.ac)
        super().__init__(a.target, seed, grid_args)


def checkpoint_of(cell, method, point):
    if point == 0:
        return os.path.join(cell.dir, SEARCH_DIR[method], "student")
    return os.path.join(cell.dir, f"distill-{method}", "checkpoints", f"step_{point}.h5")


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def run_json(cmd, log):
    """Runs an `eval --json` command; returns its last JSON line (None on failure)."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"# {datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} UTC: {shlex.join(cmd)}\n")
        f.flush()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, start_new_session=False)
        f.write(p.stdout)
    if p.returncode != 0:
        return None, p.returncode
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), 0
    return None, 1


def tokens_at(cell, method, step):
    """KD tokens seen at `step`, from the run's metrics.jsonl (None when not logged)."""
    path = os.path.join(cell.dir, f"distill-{method}", "metrics.jsonl")
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = json.loads(line)
                if m.get("step") == step and "tokens" in m:
                    return m["tokens"]
    except (OSError, ValueError):
        pass
    return None


def wiring(cell):
    """Teacher, tokenizer, data prefix, split and dtype the cell's run used (its manifest)."""
    man = run_grid.read_json(os.path.join(cell.dir, "manifest.json")) or {}
    conf = {k: (v or {}).get("value") for k, v in (man.get("config") or {}).items()}
    teacher = man.get("teacher") or {}
    data = ((man.get("sections") or {}).get("data") or {}).get("prefix") or os.path.join(cell.dir, "data", "corpus")
    return {"teacher": teacher.get("checkpoint") or os.path.join(cell.dir, "teacher"),
            "tokenizer": teacher.get("tokenizer"), "data": data, "split": conf.get("split") or "98,1,1",
            "dtype": conf.get("dtype") or "auto"}


def eval_cmd(a, w, model):
    cmd = [a.ac, "eval", "--model", model, "--quiet", "--json", "--dtype", w["dtype"]]
    return cmd + (["--tokenizer", w["tokenizer"]] if w["tokenizer"] else [])


def scoring_settings(a):
    """What decides a point's numbers besides its checkpoint (recorded in every point file)."""
    return {"limit": a.limit, "tasks": a.tasks, "eval_samples": a.eval_samples, "eval_seq_len": a.eval_seq_len}


def reusable(path, a):
    """True when `path` holds a point (or the teacher's scores) made with this run's settings;
    exit 2 naming the file and the setting when it was made with others: a finished point is
    never recomputed, and never passed off as scored another way."""
    if not os.path.exists(path):
        return False
    with open(path) as f:
        rec = json.load(f)
    # Files from before `settings` was recorded hold `limit` only (tasks core8, 32 x 512 tokens).
    have = rec.get("settings", {"limit": rec.get("limit")})
    for key, want in scoring_settings(a).items():
        if key in have and have[key] != want:
            die(f"{path}: scored with --{key.replace('_', '-')} {have[key]}, this run asks {want}; "
                f"use another --out (or remove the file to score it again)")
    return True


def score_point(cell, method, point, a):
    out = os.path.join(cell.dir, "study", f"{method}-{point}.json")
    if reusable(out, a):
        return 0
    ck = checkpoint_of(cell, method, point)
    if not os.path.exists(ck):
        print(f"  {cell.name} {method} step {point}: {ck} missing", flush=True)
        return 1
    w = wiring(cell)
    log = os.path.join(a.out, cell.name + ".study.log")
    t0 = time.time()
    lm, rc = run_json(eval_cmd(a, w, ck) + ["--data", w["data"], "--split", w["split"], "--teacher", w["teacher"],
                                           "--seq-len", str(a.eval_seq_len), "--samples", str(a.eval_samples),
                                           "--last-word-docs", "0"], log)
    if lm is None:
        return rc or 1
    tasks, rc = run_json(eval_cmd(a, w, ck) + ["--tasks", a.tasks, "--limit", str(a.limit)], log)
    if tasks is None:
        return rc or 1
    rec = {"cell": cell.name, "seed": cell.seed, "method": method, "step": point, "checkpoint": ck,
           "tokens": 0 if point == 0 else tokens_at(cell, method, point), "lm": lm, "tasks": tasks.get("tasks", tasks),
           "limit": a.limit, "settings": scoring_settings(a), "seconds": round(time.time() - t0, 1)}
    write_json(out, rec)
    print(f"  {cell.name} {TITLE[method]} step {point}: loss {lm.get('loss')}, mean acc "
          f"{rec['tasks'].get('mean')} ({rec['seconds']:.0f} s)", flush=True)
    return 0


def teacher_tasks(cell, a):
    out = os.path.join(a.out, "teacher-tasks.json")
    if reusable(out, a):
        return 0
    w = wiring(cell)
    res, rc = run_json(eval_cmd(a, w, w["teacher"]) + ["--tasks", a.tasks, "--limit", str(a.limit)],
                       os.path.join(a.out, "teacher.study.log"))
    if res is None:
        return rc or 1
    write_json(out, {"limit": a.limit, "settings": scoring_settings(a), "tasks": res.get("tasks", res)})
    print(f"  teacher: mean acc {res.get('tasks', res).get('mean')}", flush=True)
    return 0


def run_study(cells, a):
    child, stop = run_grid.forward_signals()
    points = [0] + a.point_list
    for i, c in enumerate(cells, 1):
        complete, done, plan = run_grid.cell_state(c.dir)
        print(f"[{i}/{len(cells)}] {c.name}: " + ("run complete" if complete else
              f"running ({len(done)} of {len(plan)} stages done): {shlex.join(c.cmd)}"), flush=True)
        if a.dry_run:
            continue
        if not complete:
            rc, wall = run_grid.run_cell(c, child)
            if stop[0] is not None or rc == 75:
                print(f"{c.name}: interrupted (exit {rc}); rerun to continue", flush=True)
                return 75
            if rc != 0:
                print(f"{c.name}: FAILED (exit {rc}); see {c.log}", flush=True)
                return 1
        if teacher_tasks(c, a) != 0:
            return 1
        for m in METHODS:
            for p in points:
                if stop[0] is not None:
                    return 75
                rc = score_point(c, m, p, a)
                if stop[0] is not None:
                    return 75
                if rc != 0:
                    print(f"{c.name}: scoring {m} step {p} failed (exit {rc}); see {a.out}/{c.name}.study.log", flush=True)
                    return 1
    return 0


# ---------------------------------------------------------------- the page

def collect(cells, a):
    """{(method, point): [record per seed]} of the points scored so far."""
    data = {}
    for c in cells:
        for m in METHODS:
            for p in [0] + a.point_list:
                path = os.path.join(c.dir, "study", f"{m}-{p}.json")
                rec = run_grid.read_json(path) if reusable(path, a) else None
                if rec:
                    data.setdefault((m, p), []).append(rec)
    return data


def metric(rec, name):
    if name == "mean_acc":
        v = rec["tasks"].get("mean")
        return None if v is None else 100.0 * v
    return rec["lm"].get(name)


def fmt_ms(xs, digits=4):
    xs = [x for x in xs if run_grid.num(x)]
    if not xs:
        return "-"
    m, sd, n = run_grid.mean_sd(xs)
    return f"{m:.{digits}g} ± {sd:.2g}" if n > 1 else f"{m:.{digits}g}"


def point_label(p, recs):
    toks = [r.get("tokens") for r in recs if run_grid.num(r.get("tokens"))]
    if p == 0:
        return "0 (pruned)"
    if not toks:
        return f"step {p}"
    return (f"{toks[0] / 1000:.0f}K" if toks[0] >= 10000 else f"{toks[0]:,}") + f" (step {p})"


def diff_rows(data, a):
    """AutoCompress - Minitron per point, paired by seed."""
    rows = []
    for p in [0] + a.point_list:
        ac = {r["seed"]: r for r in data.get(("autocompress", p), [])}
        mt = {r["seed"]: r for r in data.get(("minitron", p), [])}
        seeds = sorted(set(ac) & set(mt))
        if not seeds:
            continue
        cols = [point_label(p, list(ac.values()))]
        for name, lower in (("mean_acc", False), ("loss", True), ("kl_to_teacher", True)):
            d = [metric(ac[s], name) - metric(mt[s], name) for s in seeds
                 if run_grid.num(metric(ac[s], name)) and run_grid.num(metric(mt[s], name))]
            cols.append(fmt_ms(d, 3) + " (" + ", ".join(f"{x:+.3g}" for x in d) + ")" if d else "-")
            cols.append(run_grid.verdict(d, lower) if len(d) > 1 else "one seed")
        rows.append(cols)
    return rows


def build_page(cells, data, teacher, a, plot_name):
    now = datetime.datetime.now(datetime.timezone.utc)
    done = sum(len(v) for v in data.values())
    want = len(cells) * len(METHODS) * (len(a.point_list) + 1)
    lines = [f"# The ranking as distillation grows: AutoCompress vs Minitron on {a.target} (issue 32)", "",
             f"Written by `scripts/kd_study.py` at {now:%Y-%m-%d %H:%M} UTC from `{a.out}`. "
             f"Points scored: {done} of {want}. Each student is distilled in one run of {a.steps} steps; "
             f"the points are that run's checkpoints (the learning rate follows the long run's cosine, so the "
             f"early points are not what a short run would reach). Accuracies are the mean over `{a.tasks}` "
             f"(rc_0shot, lm-eval scoring, the first {a.limit} documents of each task by doc_id); eval loss and KL "
             f"on {a.eval_samples} samples of {a.eval_seq_len} tokens of the run's eval split. Mean ± sample standard "
             f"deviation over the seeds.", "",
             f"Command: `{command_line(a)}`", ""]
    if teacher:
        tm = teacher["tasks"].get("mean")
        lines += [f"Teacher: mean accuracy {100 * tm:.1f}% on the same documents." if tm else "", ""]
    lines += ["| method | KD tokens | seeds | mean accuracy % | retention | eval loss | KL to teacher |",
              "|---|---|---:|---:|---:|---:|---:|"]
    tmean = teacher["tasks"].get("mean") if teacher else None
    for m in METHODS:
        for p in [0] + a.point_list:
            recs = data.get((m, p), [])
            if not recs:
                continue
            acc = [metric(r, "mean_acc") for r in recs]
            ret = [x / (100 * tmean) for x in acc if run_grid.num(x)] if tmean else []
            lines.append(f"| {TITLE[m]} | {point_label(p, recs)} | {len(recs)} | {fmt_ms(acc, 3)} | "
                         f"{fmt_ms(ret, 3)} | {fmt_ms([metric(r, 'loss') for r in recs])} | "
                         f"{fmt_ms([metric(r, 'kl_to_teacher') for r in recs])} |")
    lines += ["", "AutoCompress − Minitron, paired by seed (per seed in brackets); the verdict compares the mean "
              "difference with the seed spread:", ""]
    lines += run_grid.table(["KD tokens", "mean accuracy (points)", "verdict", "eval loss", "verdict",
                             "KL to teacher", "verdict"], diff_rows(data, a)) + [""]
    if plot_name:
        lines += [f"![mean accuracy and eval loss against KD tokens]({plot_name})", ""]
    return "\n".join(lines)


def make_plot(plt, data, a, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    pts = [0] + a.point_list
    xs = list(range(len(pts)))
    labels = []
    for p in pts:
        recs = data.get(("autocompress", p), []) + data.get(("minitron", p), [])
        labels.append(point_label(p, recs).replace(" (", "\n("))
    colors = {"autocompress": "tab:blue", "minitron": "tab:orange"}
    for ax, (name, ylabel) in zip(axes, (("mean_acc", "mean accuracy over the tasks (%)"), ("loss", "eval loss"))):
        for m in METHODS:
            seeds = sorted({r["seed"] for p in pts for r in data.get((m, p), [])})
            for s in seeds:
                ys = [next((metric(r, name) for r in data.get((m, p), []) if r["seed"] == s), None) for p in pts]
                xy = [(x, y) for x, y in zip(xs, ys) if run_grid.num(y)]
                if xy:
                    ax.plot(*zip(*xy), color=colors[m], alpha=0.35, lw=1, marker=".")
            means = [(x, run_grid.mean_sd([metric(r, name) for r in data.get((m, p), [])])[0])
                     for x, p in zip(xs, pts) if data.get((m, p))]
            if means:
                ax.plot(*zip(*means), color=colors[m], lw=2.2, marker="o", label=f"{TITLE[m]} (mean of seeds)")
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_xlabel("KD tokens (checkpoints of one run per student)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{a.target}: AutoCompress vs Minitron as distillation grows (thin lines: seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(cells, a, plt):
    data = collect(cells, a)
    path = os.path.join(a.out, "teacher-tasks.json")
    teacher = run_grid.read_json(path) if reusable(path, a) else None
    png = os.path.splitext(a.results)[0] + ".png"
    plot_name = None
    if plt is not None and data:
        make_plot(plt, data, a, png)
        plot_name = os.path.basename(png)
    page = build_page(cells, data, teacher, a, plot_name)
    # Hand-written reading below NOTES_MARK in the existing page is kept as it is.
    try:
        with open(a.results, encoding="utf-8") as f:
            old = f.read()
        if NOTES_MARK in old:
            page += "\n" + old[old.index(NOTES_MARK):]
    except OSError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
    with open(a.results + ".tmp", "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(a.results + ".tmp", a.results)
    print(f"{PROG}: wrote {a.results}" + (f" and {png}" if plot_name else ""), flush=True)


def main(argv):
    a = parse_args(argv)
    cells = [Cell(s, a) for s in a.seed_list]
    # Before any work: this may rerun the script under Debian's python3 (which has matplotlib).
    plt = None if a.dry_run else plotting.import_matplotlib(PROG, __file__, "AC_KD_STUDY_REEXEC", "plot")
    rc = 0
    if not a.report_only:
        rc = run_study(cells, a)
    if not a.dry_run:
        write_results(cells, a, plt)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
