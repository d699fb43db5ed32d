#!/usr/bin/env python3
"""Runs the AutoCompress-vs-Minitron grid of issue 18 and writes its results page.

    python3 scripts/run_grid.py [--targets a,b] [--seeds 1,2] [--out runs/grid]
        [--configs configs/experiments] [--results docs/results.md] [--ac build/autocompress]
        [--mpi "mpiexec -n 2"] [--set SECTION.KEY=VALUE ...] [--dry-run] [--report-only]

For every target (one `autocompress run` config, CONFIGS/<target>.cfg, `method = both`) and
every seed, one cell, one at a time:

    [MPI...] AC run --config CONFIGS/<target>.cfg --seed S --out OUT/<target>-s<S> [--set ...]

logged (appended) to OUT/<target>-s<S>.log, the command to OUT/<target>-s<S>.cmd. A cell whose
run directory records every stage of its plan done (manifest.json `plan`, stages/<name>.json
`status`) is skipped and never rerun; an interrupted cell is rerun with the same command, and
`run` itself skips its done stages and resumes the started one. The configs of one grid must
agree on everything but the target (hardware, engine, workload, target-* budgets, out): the
script exits 2 naming the first key where they differ.

Then, from the run directories alone, RESULTS (docs/results.md, written atomically) and the
plot beside it (RESULTS with .png: eval loss and KL to the teacher per target, both methods,
before and after distillation, error bars = the sample standard deviation over seeds). A cell
that is not complete is listed as such and left out of every number.

--eval-limit N scores the benchmarks again on the first N documents per task (the configs'
`[eval] limit` is what a cell's own run scored; more documents shrink the accuracy's sampling
error without rerunning a cell): each complete cell's two distilled students
(OUT/<cell>/eval-limit<N>/<method>/eval.json) and the teacher once for the grid (every cell
shares it: OUT/teacher-limit<N>/eval.json), by `autocompress eval --tasks ... --limit N`, logged
to OUT/eval-limit<N>.log; a file already written for the same N and tasks is not recomputed. The
page's accuracy columns then come from these files (a cell without them shows none).

--dry-run prints each cell's command and whether it would run or be skipped, and writes
nothing. --report-only runs no cell and writes the results page.
If the python3 running this lacks matplotlib, it reruns itself once under /usr/bin/python3
(Debian's python3-matplotlib, scripts/setup.sh); without matplotlib it writes no plot.

Exit codes: 0 every cell ran or was skipped; 1 a cell failed (the others still ran and the page
is written); 2 bad usage or configs that differ outside the target; 75 interrupted (SIGTERM /
SIGINT / SIGUSR1 forwarded to the running cell, which checkpoints; rerun to continue).
"""
import argparse
import datetime
import glob
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plotting  # noqa: E402

PROG = "run_grid"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("autocompress", "minitron")
TITLE = {"autocompress": "AutoCompress", "minitron": "Minitron", "teacher": "teacher"}
# Top-level config keys that may differ between the targets of one grid.
TARGET_KEYS = ("hardware", "engine", "workload", "out")
# Quality metrics of eval.json: (key, label, lower is better).
QUALITY = (("loss", "eval loss", True), ("bits_per_byte", "bits/byte", True),
           ("last_word_accuracy", "last-word acc", False), ("kl_to_teacher", "KL to teacher", True))
UNIT = {"tpot_ms": "ms", "ttft_ms": "ms", "memory_gb": "GB", "throughput": "tok/s", "throughput_tok_s": "tok/s",
        "params": "", "active_params": ""}


def die(msg, rc=2):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(rc)


def import_matplotlib():
    return plotting.import_matplotlib(PROG, __file__, "AC_RUN_GRID_REEXEC", "plot")


# ---------------------------------------------------------------- configs

def read_ini(path):
    """{section: {key: value}} of an `autocompress run` config; top-level keys under ''."""
    out, sec = {"": {}}, ""
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                sec = line[1:-1].strip()
                out.setdefault(sec, {})
                continue
            if "=" not in line:
                die(f"{path}:{n}: expected KEY = VALUE, got {line!r}")
            k, v = line.split("=", 1)
            out[sec][k.strip()] = v.strip()
    return out


def shared_part(ini):
    """What every target of a grid must share: all but the target and budget keys."""
    return {(s, k): v for s, kv in ini.items() for k, v in kv.items()
            if not (s == "" and (k in TARGET_KEYS or k.startswith("target-")))}


def check_shared(configs):
    names = list(configs)
    if len(names) < 2:
        return
    base_name, base = names[0], shared_part(configs[names[0]])
    for n in names[1:]:
        other = shared_part(configs[n])
        for key in sorted(set(base) | set(other)):
            if base.get(key) != other.get(key):
                s, k = key
                where = f"[{s}] {k}" if s else k
                die(f"configs differ outside the target: {where} is {base.get(key, '(unset)')!r} in "
                    f"{base_name}.cfg, {other.get(key, '(unset)')!r} in {n}.cfg")


# ---------------------------------------------------------------- cells

def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cell_state(run_dir):
    """(complete, done stage names, plan stage names) from the run directory."""
    man = read_json(os.path.join(run_dir, "manifest.json"))
    plan = [s.get("name") for s in (man or {}).get("plan") or [] if isinstance(s, dict)]
    done = []
    for name in plan:
        st = read_json(os.path.join(run_dir, "stages", f"{name}.json"))
        if isinstance(st, dict) and st.get("status") == "done":
            done.append(name)
    return bool(plan) and len(done) == len(plan), done, plan


class Cell:
    def __init__(self, target, seed, args):
        self.target, self.seed = target, seed
        self.name = f"{target}-s{seed}"
        self.dir = os.path.join(args.out, self.name)
        self.log = os.path.join(args.out, self.name + ".log")
        self.cmdfile = os.path.join(args.out, self.name + ".cmd")
        self.run_args = ["run", "--config", os.path.join(args.configs, target + ".cfg"), "--seed", str(seed),
                         "--out", self.dir] + [x for s in args.set for x in ("--set", s)]
        self.cmd = shlex.split(args.mpi) + [args.ac] + self.run_args


class Interrupted(Exception):
    pass


def run_logged(cmd, log_path, child):
    """Runs cmd in its own session with its output appended to log_path (child[0] holds it for
    the signal handler); returns (exit code, wall seconds)."""
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    t0 = time.time()
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC: {shlex.join(cmd)}\n")
        log.flush()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        child[0] = p
        rc = p.wait()
        child[0] = None
        log.write(f"# exit {rc} after {time.time() - t0:.1f} s\n")
    return rc, time.time() - t0


def run_cell(cell, child):
    os.makedirs(os.path.dirname(cell.log) or ".", exist_ok=True)
    with open(cell.cmdfile + ".tmp", "w", encoding="utf-8") as f:
        f.write(shlex.join(cell.cmd) + "\n")
    os.replace(cell.cmdfile + ".tmp", cell.cmdfile)
    return run_logged(cell.cmd, cell.log, child)


def forward_signals():
    """([child], [stop]): SIGTERM / SIGINT / SIGUSR1 set stop[0] and go on to the running cell
    child[0] (`run` checkpoints on SIGTERM / SIGUSR1; an interactive Ctrl-C becomes SIGTERM)."""
    child, stop = [None], [None]

    def on_signal(sig, _frame):
        stop[0] = sig
        if child[0] is not None and child[0].poll() is None:
            try:
                os.killpg(child[0].pid, signal.SIGTERM if sig == signal.SIGINT else sig)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    return child, stop


def run_grid(cells, args):
    """Runs the cells that are not complete; returns the exit code."""
    child, stop = forward_signals()
    failed = []
    for i, c in enumerate(cells, 1):
        complete, done, plan = cell_state(c.dir)
        head = f"[{i}/{len(cells)}] {c.name}"
        if complete:
            man = read_json(os.path.join(c.dir, "manifest.json")) or {}
            note = ""
            if (man.get("argv") or [None])[1:] != c.run_args:
                note = f"; note: it was run as {shlex.join(man.get('argv') or [])}"
            print(f"{head}: skipped (all {len(plan)} stages done){note}", flush=True)
            continue
        what = f"continuing ({len(done)} of {len(plan)} stages done)" if plan else "running"
        if args.dry_run:
            what = "would be " + what.replace("running", "run").replace("continuing", "continued")
        print(f"{head}: {what}: {shlex.join(c.cmd)}  (log {c.log})", flush=True)
        if args.dry_run:
            continue
        rc, wall = run_cell(c, child)
        if stop[0] is not None or rc == 75:
            print(f"{head}: interrupted (exit {rc}) after {wall:.0f} s; rerun the same command to continue",
                  flush=True)
            return 75
        if rc != 0:
            print(f"{head}: FAILED (exit {rc}) after {wall:.0f} s; see {c.log}", flush=True)
            failed.append(c.name)
        else:
            print(f"{head}: done in {wall:.0f} s", flush=True)
    if failed:
        print(f"{PROG}: failed cells: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- more documents per task

def rescore_dir(args, cell=None, method=None):
    """Where --eval-limit's scores go: OUT/<cell>/eval-limit<N>/<method>, or the teacher's
    OUT/teacher-limit<N> (cell None)."""
    if cell is None:
        return os.path.join(args.out, f"teacher-limit{args.eval_limit}")
    return os.path.join(cell.dir, f"eval-limit{args.eval_limit}", method)


def rescored(out_dir, limit, tasks):
    """The tasks block of out_dir/eval.json when it was scored at this limit on these tasks."""
    block = task_block(read_json(os.path.join(out_dir, "eval.json")))
    if not block or block.get("limit") != limit:
        return None
    return block if tasks is None or (block.get("tasks") or []) == tasks else None


def rescore_cmd(args, cell, model, out_dir, teacher_eval=None):
    """The cell's own teacher-tasks command (its manifest's argv: tokenizer, tasks, tasks-dir,
    dtype, layout as its run scored them) on another model (None: its own, the teacher), out dir
    and limit; None without it."""
    argv = (read_json(os.path.join(cell.dir, "teacher-tasks", "manifest.json")) or {}).get("argv")
    if not isinstance(argv, list) or len(argv) < 2 or argv[1] != "eval":
        return None
    set_to = {"--out": out_dir, "--limit": str(args.eval_limit),
              "--write-requests": os.path.join(out_dir, "requests.jsonl")}
    if model is not None:
        set_to["--model"] = model
    cmd, i = [args.ac, "eval"], 2
    while i < len(argv):
        opt = argv[i]
        has_value = i + 1 < len(argv) and not str(argv[i + 1]).startswith("--")
        if opt == "--teacher-tasks" or opt in set_to:
            i += 2 if has_value else 1
            continue
        cmd += argv[i:i + (2 if has_value else 1)]
        i += 2 if has_value else 1
    for opt, value in set_to.items():
        cmd += [opt, value]
    return cmd + (["--teacher-tasks", teacher_eval] if teacher_eval else [])


def rescore(cells, configs, args):
    """--eval-limit: the teacher (once) and each complete cell's distilled students on the first
    N documents per task; what is already scored at N is kept. Returns the exit code."""
    child, stop = forward_signals()
    log = os.path.join(args.out, f"eval-limit{args.eval_limit}.log")
    done = [c for c in cells if cell_state(c.dir)[0]]
    if not done:
        return 0
    failed = []
    teacher_dir = rescore_dir(args)
    jobs = [("teacher", done[0], None, teacher_dir)]
    jobs += [(f"{c.name} {m}", c, os.path.join(c.dir, f"distill-{m}", "checkpoints"), rescore_dir(args, c, m))
             for c in done for m in METHODS]
    for name, c, model, out_dir in jobs:
        if not (configs[c.target].get("eval") or {}).get("tasks"):
            die(f"--eval-limit: {c.target}.cfg has no [eval] tasks to score")
        tasks = None if name == "teacher" else (rescored(teacher_dir, args.eval_limit, None) or {}).get("tasks")
        if rescored(out_dir, args.eval_limit, tasks):
            print(f"eval-limit {args.eval_limit}: {name}: skipped (scored)", flush=True)
            continue
        if name != "teacher" and tasks is None:
            failed.append(name)
            continue  # the teacher's scores failed: no retention to score against
        cmd = rescore_cmd(args, c, model, out_dir, None if name == "teacher" else os.path.join(teacher_dir, "eval.json"))
        if not cmd:
            print(f"eval-limit {args.eval_limit}: {name}: no teacher-tasks command in {c.dir} to score it with", flush=True)
            failed.append(name)
            continue
        print(f"eval-limit {args.eval_limit}: {name}: {shlex.join(cmd)}  (log {log})", flush=True)
        rc, wall = run_logged(cmd, log, child)
        if stop[0] is not None:
            print(f"eval-limit {args.eval_limit}: interrupted; rerun the same command to continue", flush=True)
            return 75
        print(f"eval-limit {args.eval_limit}: {name}: " + ("done" if rc == 0 else f"FAILED (exit {rc})") + f" in {wall:.0f} s",
              flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"{PROG}: --eval-limit {args.eval_limit} failed for: {', '.join(failed)}; see {log}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- reading a finished cell

def num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_sd(xs):
    xs = [x for x in xs if num(x)]
    if not xs:
        return None, None, 0
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
    return m, sd, len(xs)


def fmt(x, digits=4):
    if not num(x):
        return "-"
    if x != 0 and abs(x) >= 1e5:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def fmt_ms(x, digits=4):
    return fmt(x, digits) if num(x) else "-"


def fmt_msd(xs, scale=1.0, digits=4):
    m, sd, n = mean_sd(xs)
    if m is None:
        return "-"
    return fmt(m * scale, digits) + (f" ± {fmt(sd * scale, 2)}" if sd is not None else "")


def metric_of_option(opt):
    """--target-tpot-ms -> tpot_ms (the cost model's and Minitron's field names)."""
    o = opt.replace("--target-", "").replace("-ratio", "")
    return {"tpot-ms": "tpot_ms", "ttft-ms": "ttft_ms", "memory-gb": "memory_gb", "throughput": "throughput",
            "params": "params", "active-params": "active_params"}.get(o, o.replace("-", "_"))


def minitron_value(cand, metric):
    if metric in cand:
        return cand.get(metric)
    return cand.get({"throughput": "throughput_tok_s"}.get(metric, metric))


def read_cell(cell, args):
    """Everything the page shows of one complete cell: {method: {...}, 'teacher': {...}, ...}.
    With --eval-limit, the benchmark scores are those of rescore()."""
    d = cell.dir
    man = read_json(os.path.join(d, "manifest.json")) or {}
    r = {"cell": cell, "manifest": man, "budgets": man.get("budgets") or [], "methods": {}}
    sr = read_json(os.path.join(d, "search", "search_report.json")) or {}
    mc = read_json(os.path.join(d, "minitron", "candidates.json")) or {}
    sc = read_json(os.path.join(d, "scorecard", "scorecard.json")) or {}
    r["teacher_eval"] = read_json(os.path.join(d, "eval", "teacher", "eval.json")) or {}
    r["teacher_tasks"] = task_block(read_json(os.path.join(d, "teacher-tasks", "eval.json")))
    if args.eval_limit:
        r["teacher_tasks"] = rescored(rescore_dir(args), args.eval_limit, None)
    rows = {}
    for row in sc.get("rows") or []:
        cand = str(row.get("candidate", ""))
        for m in METHODS:
            if f"distill-{m}" in cand or f"export/{m}" in cand:
                rows[m] = row
        if "distill-" not in cand and "export/" not in cand:
            rows.setdefault("teacher", row)
    r["scorecard_teacher"] = rows.get("teacher")
    stage_wall = {}
    for p in glob.glob(os.path.join(d, "stages", "*.json")):
        st = read_json(p) or {}
        if num(st.get("wall_s")):
            stage_wall[st.get("name", os.path.basename(p)[:-5])] = st["wall_s"]
    r["stage_wall"] = stage_wall
    budgets = {b.get("as"): b for b in r["budgets"] if isinstance(b, dict)}
    for m in METHODS:
        e = {"eval": read_json(os.path.join(d, "eval", m, "eval.json")) or {},
             "pruned": read_json(os.path.join(d, "eval", f"{m}-pruned", "eval.json")) or {},
             "scorecard": rows.get(m)}
        e["tasks"] = task_block(e["eval"])
        e["tasks_dir"] = os.path.join(d, "eval", m)
        if args.eval_limit:
            e["tasks_dir"] = rescore_dir(args, cell, m)
            e["tasks"] = rescored(e["tasks_dir"], args.eval_limit, (r["teacher_tasks"] or {}).get("tasks"))
        # the binding constraint and the student's exact predicted value of every budget
        costs = []
        if m == "autocompress":
            sb = {b.get("option"): b for b in (sr.get("student_cost") or {}).get("budgets") or []}
            for opt, b in sb.items():
                costs.append({"option": opt, "metric": metric_of_option(opt), "value": b.get("value"),
                              "limit": b.get("limit"), "meets": b.get("meets"),
                              "teacher": (budgets.get(opt) or {}).get("teacher")})
            e["binding"] = sr.get("binding")
            e["slack_reason"] = sr.get("slack_reason") or ""
            e["chosen"] = sr.get("chosen")
        else:
            chosen = next((c for c in mc.get("candidates") or [] if isinstance(c, dict) and c.get("chosen")), {})
            for metric, lim in (mc.get("constraints") or {}).items():
                v = minitron_value(chosen, metric)
                at_least = metric.startswith("throughput")
                opt = next((o for o in budgets if metric_of_option(o) == metric.replace("_tok_s", "")), metric)
                costs.append({"option": opt, "metric": metric, "value": v, "limit": lim,
                              "meets": (v >= lim if at_least else v <= lim) if num(v) and num(lim) else None,
                              "teacher": (budgets.get(opt) or {}).get("teacher")})
            e["chosen"] = chosen
            e["feasible"] = (mc.get("feasible"), mc.get("grid_size"))
        for c in costs:
            v, lim = c["value"], c["limit"]
            c["use"] = (lim / v if c["metric"].startswith("throughput") else v / lim) if num(v) and num(lim) and v and lim else None
        if m == "minitron":
            e["binding"] = max(costs, key=lambda c: c["use"] or -1)["option"] if costs else None
        e["costs"] = costs
        # KD: steps, micro-batch, seq-len, grad-accum, seed, DP from the distill manifest; tokens seen
        dm = read_json(os.path.join(d, f"distill-{m}", "manifest.json")) or {}
        cfg = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in (dm.get("config") or {}).items()}
        dp = (dm.get("layout") or {}).get("dp")
        kd = {k: cfg.get(k) for k in ("steps", "micro-batch", "seq-len", "grad-accum", "seed")}
        kd["dp"] = dp
        try:
            kd["planned"] = int(kd["steps"]) * int(kd["micro-batch"]) * int(kd["seq-len"]) * int(dp) * int(kd["grad-accum"] or 1)
        except (TypeError, ValueError):
            kd["planned"] = None
        seen = None
        try:
            with open(os.path.join(d, f"distill-{m}", "metrics.jsonl"), encoding="utf-8") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec, dict) and num(rec.get("tokens")):
                        seen = rec["tokens"]
        except OSError:
            pass
        kd["seen"] = seen
        e["kd"] = kd
        stage = "search" if m == "autocompress" else "minitron"
        e["wall"] = {"prune": stage_wall.get(stage), "distill": stage_wall.get(f"distill-{m}")}
        r["methods"][m] = e
    return r


# ---------------------------------------------------------------- the page

def table(header, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    return (["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def describe_budget(b):
    """'tpot_ms <= 0.85 x teacher (11.92 -> 10.13 ms)' from a manifest budget."""
    opt, t, lim = b.get("option", "?"), b.get("teacher"), b.get("limit")
    metric = metric_of_option(b.get("as") or opt)
    rel = "≥" if b.get("at_least") else "≤"
    ratio = lim / t if num(lim) and num(t) and t else None
    return (f"{metric} {rel} {fmt(ratio, 3)} × teacher ({fmt(t)} → {fmt(lim)} {UNIT.get(metric, '')})"
            if opt.endswith("-ratio") else f"{metric} {rel} {fmt(lim)} {UNIT.get(metric, '')}").strip()


def layer_summary(ls):
    if not ls:
        return "no plots/layers.json"
    return ", ".join(f"{k} {v}" for k, v in ls.items())


def layer_kept(layers, method):
    """{axis: kept %} + hidden + skipped layers from a cell's plots/layers.json, as run_report's
    per-layer summary."""
    student, teacher = (layers.get("students") or {}).get(method), layers.get("teacher")
    if not student or not teacher:
        return None
    labels = {a.get("id"): a.get("label", a.get("id")) for a in layers.get("axes") or [] if isinstance(a, dict)}
    out = {}
    for axis, vals in (teacher.get("values") or {}).items():
        tsum = sum(v for v in vals if v)
        ssum = sum(v for v in (student.get("values") or {}).get(axis) or [] if v)
        if tsum:
            out[labels.get(axis, axis)] = f"{100 * ssum / tsum:.0f}%"
    out["hidden"] = f"{student.get('hidden')}/{teacher.get('hidden')}"
    skipped = student.get("skipped") or []
    out["removed layers"] = f"{len(skipped)} ({', '.join(map(str, skipped))})" if skipped else "0"
    return out


def task_block(ev):
    """The `tasks` object of an `eval --tasks` eval.json (mean, retention, per_task), or None."""
    t = (ev or {}).get("tasks") if isinstance(ev, dict) else None
    return t if isinstance(t, dict) and num(t.get("mean")) else None


def per_task(block):
    """{task: (primary accuracy, chance)} of a task block."""
    return {t.get("task"): ((t.get("model") or {}).get("primary"), t.get("chance"))
            for t in (block or {}).get("per_task") or [] if isinstance(t, dict)}


def has_tasks(rs):
    return any(r["teacher_tasks"] or any(r["methods"][m]["tasks"] for m in METHODS) for r in rs)


def acc_points(rs, m):
    """Per seed: the method's mean benchmark accuracy in points (%)."""
    return [100 * r["methods"][m]["tasks"]["mean"] if r["methods"][m]["tasks"] else None for r in rs]


def retentions(rs, m):
    """Per seed: the student's mean / the teacher's (eval's own, else from the teacher's scores)."""
    out = []
    for r in rs:
        t, tt = r["methods"][m]["tasks"], r["teacher_tasks"]
        v = t.get("retention") if t else None
        if not num(v) and t and tt and tt.get("mean"):
            v = t["mean"] / tt["mean"]
        out.append(v if num(v) else None)
    return out


def accuracy_diff_row(rs):
    """[label, direction, mean ± sd, per seed, sd AC, sd MT, verdict] of AutoCompress − Minitron in points.
    The verdict weighs the difference against the seed spread and, where every seed kept its
    per-document scores, against twice the documents' paired standard error (the mean over the
    seeds: they answer the same documents, so averaging seeds does not shrink it)."""
    a, b = acc_points(rs, "autocompress"), acc_points(rs, "minitron")
    diffs = [x - y for x, y in zip(a, b) if num(x) and num(y)]
    dm, dsd, _ = mean_sd(diffs)
    _, sd_a, _ = mean_sd(a)
    _, sd_b, _ = mean_sd(b)
    v = verdict(diffs, False)
    paired = [cell_paired(r) for r in rs if all(r["methods"][m]["tasks"] for m in METHODS)]
    if dm is not None and paired and all(paired):
        doc_se = 100 * sum(p[1] for p in paired) / len(paired)
        v += ("; within" if abs(dm) <= 2 * doc_se else "; beyond") + f" twice the documents' paired standard error ({fmt(doc_se, 2)})"
    return ["mean benchmark accuracy (points)", "higher is better",
            (fmt(dm, 3) + (f" ± {fmt(dsd, 2)}" if dsd is not None else "")) if dm is not None else "-",
            ", ".join(fmt(x, 3) for x in diffs) or "-", fmt(sd_a, 2) if sd_a is not None else "-",
            fmt(sd_b, 2) if sd_b is not None else "-", v]


def tasks_table(rs):
    """Per task: chance, the teacher and each method (mean ± sd over seeds, %), AutoCompress − Minitron."""
    blocks = [r["teacher_tasks"] for r in rs] + [r["methods"][m]["tasks"] for r in rs for m in METHODS]
    tasks = []
    for b in blocks:
        tasks += [t for t in per_task(b) if t not in tasks]
    if not tasks:
        return []
    def col(get):
        return fmt_msd([100 * v if num(v) else None for v in (get(r) for r in rs)], 1.0, 3)
    rows = []
    for t in tasks:
        chance = next((per_task(b)[t][1] for b in blocks if b and t in per_task(b) and num(per_task(b)[t][1])), None)
        vals = {m: [per_task(r["methods"][m]["tasks"]).get(t, (None, None))[0] for r in rs] for m in METHODS}
        diffs = [100 * (x - y) for x, y in zip(vals["autocompress"], vals["minitron"]) if num(x) and num(y)]
        rows.append([t, fmt(100 * chance, 3) if num(chance) else "-",
                     col(lambda r: per_task(r["teacher_tasks"]).get(t, (None, None))[0]),
                     col(lambda r: per_task(r["methods"]["autocompress"]["tasks"]).get(t, (None, None))[0]),
                     col(lambda r: per_task(r["methods"]["minitron"]["tasks"]).get(t, (None, None))[0]),
                     fmt_msd(diffs, 1.0, 3)])
    rows.append(["**mean**", "-", fmt_msd([100 * r["teacher_tasks"]["mean"] if r["teacher_tasks"] else None for r in rs], 1.0, 3),
                 fmt_msd(acc_points(rs, "autocompress"), 1.0, 3), fmt_msd(acc_points(rs, "minitron"), 1.0, 3),
                 accuracy_diff_row(rs)[2]])
    b0 = next(b for b in blocks if b)
    return ["Zero-shot benchmarks per task (primary metric, %, mean ± sd over the seeds; "
            + (f"the first {b0['limit']} documents by doc_id of each task" if b0.get("limit") else "every document")
            + f", format {b0.get('format', '?')}; chance: a uniform guess over each document's choices; the teacher "
            "scored once per cell in `teacher-tasks/`):", ""] + \
        table(["task", "chance %", "teacher %", "AutoCompress %", "Minitron %", "AutoCompress − Minitron (points)"],
              rows, ["---"] + ["---:"] * 5) + [""]


def loss_gaps(rs, method, stage):
    """Per seed: the student's eval loss minus the teacher's on the same samples."""
    return [r["methods"][method][stage].get("loss") - r["teacher_eval"].get("loss")
            if num(r["methods"][method][stage].get("loss")) and num(r["teacher_eval"].get("loss")) else None
            for r in rs]


def verdict(diffs, lower_better):
    """Whether the mean paired difference exceeds its standard deviation over the seeds."""
    m, spread, n = mean_sd(diffs)
    if m is None:
        return "-"
    if n < 2:
        return "one seed: no spread"
    better = m < 0 if lower_better else m > 0
    if abs(m) <= spread:
        return f"within the seed spread ({fmt(spread, 2)})"
    return ("AutoCompress better" if better else "Minitron better") + f" by more than the spread ({fmt(spread, 2)})"


def show(path):
    """A path as the page shows it: relative to the repository when inside it."""
    r = os.path.relpath(os.path.abspath(path), REPO)
    return path if r.startswith("..") else r


def rel(path, start):
    return os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(start)))


def collect(cells, args):
    """({cell name: status}, {target: [read_cell of each complete cell]})."""
    status, data = {}, {}
    for c in cells:
        complete, done, plan = cell_state(c.dir)
        if complete:
            status[c.name] = "complete"
            data.setdefault(c.target, []).append(read_cell(c, args))
        elif plan:
            status[c.name] = f"incomplete: {len(done)} of {len(plan)} stages done (next: " + \
                             next(s for s in plan if s not in done) + "); left out of every number"
        else:
            status[c.name] = "not run"
    return status, data


def plot_points(targets, data):
    """[(target, its budgets as ratios to the teacher, [cells])] of the targets with a complete cell."""
    pts = []
    for t in targets:
        rs = data.get(t, [])
        if rs:
            # one short line per part: neighbouring targets' labels must not run into each other
            label = "\n".join(f"{metric_of_option(b.get('as') or '')}\n{'≥' if b.get('at_least') else '≤'} "
                               f"{fmt(b['limit'] / b['teacher'], 3)}× teacher" for b in rs[0]["budgets"]
                              if num(b.get("limit")) and num(b.get("teacher")) and b["teacher"])
            pts.append((t, label, rs))
    return pts


def build_page(targets, configs, cells, status, data, args, plot_name):
    now = datetime.datetime.now(datetime.timezone.utc)
    out = ["# Results: AutoCompress vs Minitron at equal hardware budget (issue 18)", "",
           f"Written by `scripts/run_grid.py` at {now:%Y-%m-%d %H:%M} UTC from the run directories under "
           f"`{show(args.out)}` (configs: `{show(args.configs)}`). Every number below is read from those files; a cell "
           "that is not complete is listed and left out. Mean ± sample standard deviation over the seeds "
           "(the seed spread); both methods of a cell share the teacher, data, importance, seed, budget and "
           "KD token count.", ""]
    out += ["Made by `" + shlex.join(["python3", "scripts/run_grid.py"] + sys.argv[1:]) + "`. To run the grid "
            "(each cell is one `autocompress run --config CONFIGS/<target>.cfg --seed S --out OUT/<target>-s<S>`; "
            "a finished cell is never rerun, an interrupted one continues): `python3 scripts/run_grid.py` "
            "(options: `--targets`, `--seeds`, `--mpi`, `--eval-limit`, `--dry-run`, `--report-only`; see its `--help`).", ""]
    n_done = sum(1 for s in status.values() if s == "complete")
    out += [f"Cells: {n_done} of {len(cells)} complete.", ""]
    out += table(["cell", "status", "report"],
                 [[f"`{c.name}`", status[c.name],
                   f"[report.md]({rel(os.path.join(c.dir, 'report.md'), args.results)})"
                   if os.path.exists(os.path.join(c.dir, "report.md")) else "-"] for c in cells],
                 ["---", "---", "---"]) + [""]
    # the verdict first
    summary_rows, sections = [], []
    for t in targets:
        top = configs[t][""]
        budgets_cfg = ", ".join(f"{k} = {v}" for k, v in top.items() if k.startswith("target-"))
        where = f"{top.get('hardware', '?')} / {top.get('engine', 'local-eager')} / {top.get('workload', '?')}"
        sec = [f"## {t}: {where}", "", f"Budget in `{t}.cfg`: `{budgets_cfg}`."]
        rs = data.get(t, [])
        if not rs:
            sec += ["", "No complete cell: not run.", ""]
            summary_rows.append([t, where, budgets_cfg, "-", "not run", "not run", "not run", "not run"])
            sections += sec
            continue
        seeds = [r["cell"].seed for r in rs]
        sec[-1] += (" Resolved on the teacher: " + "; ".join(describe_budget(b) for b in rs[0]["budgets"]) + "."
                    if rs[0]["budgets"] else "")
        sec += [f"Seeds: {', '.join(map(str, seeds))}.", ""]
        measured = top.get("hardware") == "cpu-local"
        hdr = ["method", "binding", "predicted vs budget", "meets (all seeds)"]
        if measured:
            hdr += ["measured TTFT ms", "measured TPOT ms"]
        hdr += ["params (M)"] + [lab for _, lab, _ in QUALITY[:1]] + ["loss − teacher's"] + \
               [lab for _, lab, _ in QUALITY[1:]] + ["loss before distill", "KL before distill"]
        bench = has_tasks(rs)
        if bench:
            hdr += ["mean accuracy %", "retention vs teacher"]
        rows = []
        tev = [r["teacher_eval"] for r in rs]
        trow = ["teacher", "-", "-", "-"]
        if measured:
            trow += [fmt_msd([(r["scorecard_teacher"] or {}).get(k, {}).get("p50") for r in rs], 1e3)
                     for k in ("ttft_s", "tpot_s")]
        trow += [fmt_msd([e.get("parameters") for e in tev], 1e-6), fmt_msd([e.get("loss") for e in tev]), "0"] + \
                [fmt_msd([e.get(k) for e in tev]) for k, _, _ in QUALITY[1:3]] + ["-", "-", "-"]
        if bench:
            trow += [fmt_msd([100 * r["teacher_tasks"]["mean"] if r["teacher_tasks"] else None for r in rs], 1.0, 3), "1"]
        rows.append(trow)
        for m in METHODS:
            es = [r["methods"][m] for r in rs]
            binding = sorted({e["binding"] or "-" for e in es})
            bc = [next((c for c in e["costs"] if c["option"] == e["binding"]), {}) for e in es]
            metric = (bc[0] or {}).get("metric", "")
            use = mean_sd([100 * c["use"] if num(c.get("use")) else None for c in bc])[0]
            pv = (f"{fmt_msd([c.get('value') for c in bc])} vs {fmt(bc[0].get('limit'))} {UNIT.get(metric, '')} "
                  f"({fmt(use, 3)}% of it)" if bc[0] else "-")
            meets = all(c.get("meets") for e in es for c in e["costs"]) and all(e["costs"] for e in es)
            row = [TITLE[m], ", ".join(f"`{b}`" for b in binding), pv, "yes" if meets else "**NO**"]
            if measured:
                row += [fmt_msd([(e["scorecard"] or {}).get(k, {}).get("p50") for e in es], 1e3)
                        for k in ("ttft_s", "tpot_s")]
            row += [fmt_msd([e["eval"].get("parameters") for e in es], 1e-6)]
            qual = [fmt_msd([e["eval"].get(k) for e in es]) for k, _, _ in QUALITY]
            row += qual[:1] + [fmt_msd(loss_gaps(rs, m, "eval"))] + qual[1:]
            row += [fmt_msd([e["pruned"].get("loss") for e in es]), fmt_msd([e["pruned"].get("kl_to_teacher") for e in es])]
            if bench:
                row += [fmt_msd(acc_points(rs, m), 1.0, 3), fmt_msd(retentions(rs, m), 1.0, 3)]
            rows.append(row)
        sec += table(hdr, rows, ["---"] * 4 + ["---:"] * (len(hdr) - 4)) + [""]
        if measured:
            sec += ["TTFT and TPOT measured by the scorecard on this machine (p50 over its requests), "
                    "one process; the predicted values are the cost model's.", ""]
        # AutoCompress minus Minitron, paired by seed
        drows, verdicts = [], {}
        for src, k, lab, lower in [("eval",) + q for q in QUALITY] + [
                ("pruned", "loss", "eval loss before distillation", True),
                ("pruned", "kl_to_teacher", "KL before distillation", True)]:
            a = [r["methods"]["autocompress"][src].get(k) for r in rs]
            b = [r["methods"]["minitron"][src].get(k) for r in rs]
            diffs = [x - y for x, y in zip(a, b) if num(x) and num(y)]
            _, sd_a, _ = mean_sd(a)
            _, sd_b, _ = mean_sd(b)
            v = verdict(diffs, lower)
            verdicts[(src, k)] = v
            dm, dsd, dn = mean_sd(diffs)
            drows.append([lab, ("lower" if lower else "higher") + " is better",
                          (fmt(dm) + (f" ± {fmt(dsd, 2)}" if dsd is not None else "")) if dm is not None else "-",
                          ", ".join(fmt(x) for x in diffs) or "-",
                          fmt(sd_a, 2) if sd_a is not None else "-", fmt(sd_b, 2) if sd_b is not None else "-", v])
        sec += ["AutoCompress minus Minitron, paired by seed (both methods of a cell are scored on the same "
                "eval samples, which differ between seeds: the teacher's own loss moves with them). The verdict "
                "compares the mean difference with the standard deviation of the per-seed differences (the seed "
                "spread); the two methods' own standard deviations are beside it. Mean accuracy's verdict also says whether "
                "the difference is beyond twice the documents' paired standard error (per-document differences of the "
                "two students on the same documents, the mean over the seeds), the error another sample of documents "
                "would bring.", ""]
        if bench:
            drows.insert(0, accuracy_diff_row(rs))
            verdicts["accuracy"] = drows[0][6]
        sec += table(["metric", "direction", "AutoCompress − Minitron", "per seed", "sd AutoCompress",
                      "sd Minitron", "verdict"], [r[:6] + [r[6]] for r in drows],
                     ["---", "---", "---:", "---:", "---:", "---:", "---"]) + [""]
        if bench:
            sec += tasks_table(rs)
        # what each method chose
        sec += ["What each method chose (seed by seed; the per-layer picture is in each cell's report):", ""]
        for r in rs:
            lay = (read_json(os.path.join(r["cell"].dir, "plots", "layers.json")) or {})
            rep = rel(os.path.join(r["cell"].dir, "report.md"), args.results)
            for m in METHODS:
                e = r["methods"][m]
                kept = layer_kept(lay, m)
                extra = ""
                if m == "autocompress":
                    extra = f"; chosen candidate: {e.get('chosen')}" + (
                        f"; budget left unused: {e['slack_reason']}" if e.get("slack_reason") else "")
                else:
                    ch = e.get("chosen") or {}
                    dims = ", ".join(f"{k} {v}" for k, v in (ch.get("dims") or {}).items())
                    extra = f"; uniform candidate {dims}" + (
                        f", dropped layers {ch['dropped_layers']}" if ch.get("dropped_layers") else "") + \
                        (f"; {e['feasible'][0]} of {e['feasible'][1]} grid points within the budget"
                         if e.get("feasible") and e["feasible"][0] is not None else "")
                sec.append(f"- seed {r['cell'].seed}, {TITLE[m]}: kept {layer_summary(kept)}{extra} "
                           f"([report]({rep}), [layers]({rel(os.path.join(r['cell'].dir, 'plots', 'layers.png'), args.results)}))")
        sec.append("")
        sections += sec
        summary_rows.append([t, where, budgets_cfg, str(len(rs)), verdicts.get("accuracy", "-"), verdicts[("eval", "loss")],
                             verdicts[("eval", "kl_to_teacher")], verdicts[("pruned", "loss")]])
    out += ["## Summary", ""]
    out += ["AutoCompress vs Minitron per target, after distillation (mean zero-shot benchmark accuracy where the "
            "configs give `[eval] tasks`, eval loss, KL to the teacher) and before it (eval loss of the pruned students):", ""]
    out += table(["target", "hardware / engine / workload", "budget", "seeds", "mean accuracy", "eval loss",
                  "KL to teacher", "eval loss before distillation"], summary_rows, ["---"] * 8) + [""]
    out += [f"![mean benchmark accuracy, eval loss minus the teacher's and KL to the teacher per target, both methods]"
            f"({os.path.basename(plot_name)})"
            if plot_name else "No plot (matplotlib missing or no complete cell).", ""]
    out += reading_notes(targets, data)
    out += sections
    out += ["## Commands, KD tokens and wall times", ""]
    rows = []
    for c in cells:
        if status[c.name] != "complete":
            continue
        r = next(x for t in data.values() for x in t if x["cell"] is c)
        cmd = None
        if os.path.exists(c.cmdfile):
            with open(c.cmdfile, encoding="utf-8") as f:
                cmd = f.read().strip()
        if not cmd:
            cmd = shlex.join(r["manifest"].get("argv") or [])
        kds = [r["methods"][m]["kd"] for m in METHODS]
        same = all(kds[0].get(k) == kds[1].get(k) for k in ("steps", "micro-batch", "seq-len", "grad-accum", "seed",
                                                              "dp", "seen"))
        kd = kds[0]
        kdtxt = (f"{kd.get('steps')} × {kd.get('micro-batch')} × {kd.get('seq-len')} × DP {kd.get('dp')}"
                 + (f" × accum {kd.get('grad-accum')}" if kd.get("grad-accum") not in (None, 1) else "")
                 + f" = {fmt(kd.get('planned'))}; seen: " + " / ".join(fmt(k.get("seen")) for k in kds))
        w = r["stage_wall"]
        tot = sum(w.values())
        ws = [r["methods"][m]["wall"] for m in METHODS]
        rows.append([f"`{c.name}`", f"`{cmd}`", kdtxt, "yes" if same else "**NO**",
                     " / ".join(fmt((x["prune"] or 0) + (x["distill"] or 0), 3) for x in ws), f"{tot / 60:.1f}"])
    out += (table(["cell", "command", "KD tokens per student: steps × micro-batch × seq-len × DP (AutoCompress / "
                   "Minitron seen)", "same KD tokens, steps, seed", "prune + distill s (AC / MT)", "cell wall min"],
                  rows, ["---", "---", "---", "---", "---:", "---:"]) if rows else ["No complete cell."]) + [""]
    out += ["Wall times are each stage's own `stages/<name>.json` `wall_s` (the run that did it), summed per cell; "
            "KD tokens seen are the last `tokens` of `distill-<method>/metrics.jsonl`.", ""]
    return "\n".join(out) + "\n"


def plot_accuracy(ax, pts, colours):
    """Mean benchmark accuracy per target: each method (mean ± sd over seeds) and the teacher's."""
    xs = list(range(len(pts)))
    for j, m in enumerate(METHODS):
        ms, sds = [], []
        for _, _, rs in pts:
            mm, sd, _ = mean_sd(acc_points(rs, m))
            ms.append(mm if mm is not None else float("nan"))
            sds.append(sd or 0.0)
        ax.errorbar([x + (-0.12 if j == 0 else 0.12) for x in xs], ms, yerr=sds, fmt="o", color=colours[m], capsize=4,
                    label=f"{TITLE[m]} (distilled)")
    for i, (_, _, rs) in enumerate(pts):
        tm, _, _ = mean_sd([100 * r["teacher_tasks"]["mean"] if r["teacher_tasks"] else None for r in rs])
        if tm is not None:
            ax.hlines(tm, i - 0.3, i + 0.3, colors="k", lw=1.2, label="teacher" if i == 0 else None)
    ax.set_ylabel("mean zero-shot accuracy %")


def make_plot(plt, pts, path):
    if not plt or not pts:
        return False
    bench = any(has_tasks(rs) for _, _, rs in pts)
    panels = (["accuracy"] if bench else []) + ["loss", "kl_to_teacher"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4))
    colours = {"autocompress": "tab:blue", "minitron": "tab:orange"}
    xs = list(range(len(pts)))
    labels = {"loss": "eval loss − the teacher's (same samples)", "kl_to_teacher": "KL to the teacher"}
    for ax, key in zip(axes, panels):
        if key == "accuracy":
            plot_accuracy(ax, pts, colours)
        for j, m in enumerate(METHODS if key != "accuracy" else ()):
            off = -0.12 if j == 0 else 0.12
            for stage, marker, fill in (("eval", "o", True), ("pruned", "x", False)):
                ms, sds = [], []
                for _, _, rs in pts:
                    vals = loss_gaps(rs, m, stage) if key == "loss" else [r["methods"][m][stage].get(key) for r in rs]
                    mm, sd, _ = mean_sd(vals)
                    ms.append(mm if mm is not None else float("nan"))
                    sds.append(sd or 0.0)
                ax.errorbar([x + off for x in xs], ms, yerr=sds, fmt=marker, color=colours[m], capsize=4,
                            alpha=1.0 if fill else 0.5,
                            label=f"{TITLE[m]}" + (" (distilled)" if fill else " (pruned, before distillation)"))
        if key == "loss":
            ax.axhline(0.0, color="k", lw=0.8, label="teacher")
        if key in ("accuracy", "loss"):  # below the axes: never over a point
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        if key != "accuracy":
            ax.set_ylabel(labels[key])
        ax.set_xticks(xs)
        ax.set_xlim(-0.6, len(xs) - 0.4)
        ax.set_xticklabels([f"{t}\n{label}" if label else t for t, label, _ in pts], fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("AutoCompress vs Minitron at equal budget (mean ± sd over seeds)", fontsize=10)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return True


def reading_notes(targets, data):
    """What the numbers do and do not say, from the cells themselves."""
    same, varied = [], []
    for t in targets:
        for m in METHODS:
            sizes = {(r["methods"][m]["eval"] or {}).get("parameters") for r in data.get(t, [])}
            if len(data.get(t, [])) > 1:
                (same if len(sizes) == 1 else varied).append(f"{t} {TITLE[m]}")
    out = ["## Reading these numbers", ""]
    if same:
        out += ["- **The seed spread is not an architecture spread.** The seed moves the data order, the eval samples, the Gumbel "
                "noise and the candidates. These chose the same student (the same parameter count) in every seed: "
                + ", ".join(same) + ". Their spread is that of the distillation and the evaluation for one architecture; "
                "a different search seed was not enough to change the architecture."]
    if varied:
        out += ["- Students that differed between seeds: " + ", ".join(varied) + "."]
    for t in targets:
        rs = data.get(t, [])
        pairs = [((r["methods"]["autocompress"]["eval"] or {}).get("loss"), (r["methods"]["minitron"]["eval"] or {}).get("loss"),
                  (r["methods"]["autocompress"]["pruned"] or {}).get("loss"), (r["methods"]["minitron"]["pruned"] or {}).get("loss"),
                  r["cell"].seed) for r in rs]
        pairs = [p for p in pairs if num(p[0]) and num(p[1])]
        if not pairs:
            continue
        diff, sd, _ = mean_sd([a - m for a, m, _, _, _ in pairs])
        if diff < 0 and (len(pairs) < 2 or (num(sd) and -diff > sd)):
            continue  # better by more than the spread (or one seed and better)
        flips = [str(seed) for a, m, ab, mb, seed in pairs if a >= m and num(ab) and num(mb) and ab < mb]
        per_seed = ", ".join(f"{fmt(a - m)} (seed {seed})" for a, m, _, _, seed in pairs)
        out += [f"- **{t}: AutoCompress is not better than Minitron by more than the seed spread after distillation.** "
                f"Eval loss AutoCompress − Minitron: {fmt(diff)}" + (f" ± {fmt(sd)}" if num(sd) else "") + f"; per seed {per_seed}."
                + (f" In seed(s) {', '.join(flips)} AutoCompress was better before distillation and worse after it: the ranking "
                   "flipped in retraining." if flips else "")
                + f" What each chose is in the {t} section below."]
    for t in targets:
        out += accuracy_note(t, data.get(t, []))
    out += ["- **Equal hardware budget, not equal size.** Both methods meet the same absolute budget on the same cost model, "
            "so their parameter counts differ. That is the claim being tested: parameters do not predict latency or memory "
            "on a given engine.",
            "- **Short distillation.** Each student gets the KD tokens in the last table. Model-Optimizer's "
            "Minitron-vs-Puzzletron study found rankings made before retraining flip after it (`../shared/SEARCH.md`). Compare "
            "the columns before and after distillation below. How the cpu-local ranking moves as one run per student "
            "distils to 164K tokens: [kd_study_scorekd.md](kd_study_scorekd.md) (both methods' candidates scored after a "
            "short KD, as here) and [kd_study.md](kd_study.md).", ""]
    return out


def mean_stderr(block):
    """The document-sample standard error of a task block's mean accuracy: sqrt(sum se_i^2) / n over
    its tasks (each task's primary_stderr, lm-eval's sample standard error of the mean)."""
    se = [(t.get("model") or {}).get("primary_stderr") for t in (block or {}).get("per_task") or [] if isinstance(t, dict)]
    if not se or not all(num(x) for x in se):
        return None
    return math.sqrt(sum(x * x for x in se)) / len(se)


def doc_correct(requests_path, block):
    """{task: {doc_id: 1.0 | 0.0}} from an eval's requests.jsonl, scored as `eval` scores it: a
    multiple-choice document by the first maximum of its choices' log-probabilities (raw, per
    character or per token: the task's primary metric), a gold-continuation document by its greedy
    flag. None when the file is missing or unreadable, or when a task's recount differs from the
    block's primary accuracy (the file is not this block's)."""
    reqs = {}
    try:
        with open(requests_path, encoding="utf-8") as f:
            for line in f:
                q = json.loads(line)
                reqs.setdefault(q["task"], {}).setdefault(q["doc_id"], []).append(q)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    out = {}
    for t in (block or {}).get("per_task") or []:
        name, metric = t.get("task"), t.get("primary_metric")
        docs = reqs.get(name)
        if not docs:
            return None
        norm = {"acc_per_char": "chars", "acc_per_token": "tokens"}.get(metric)
        hits = {}
        for doc, qs in docs.items():
            if t.get("type") != "multiple_choice":
                hits[doc] = float(bool(qs[0].get("greedy")))
                continue
            score = [q["logprob"] / max(1, q[norm]) if norm else q["logprob"] for q in qs]
            best = max(range(len(qs)), key=lambda i: (score[i], -i))
            hits[doc] = float(qs[best]["choice"] == qs[0]["label"])
        primary = (t.get("model") or {}).get("primary")
        if not num(primary) or abs(sum(hits.values()) / len(hits) - primary) > 1e-9:
            return None
        out[name] = hits
    return out


def paired_difference(a_dir, a_block, b_dir, b_block):
    """(A − B in mean accuracy, its paired standard error), both as fractions: per task the mean
    and standard error of the per-document differences (both students answer the same
    documents), over tasks the mean and sqrt(sum se_t^2) / T. None without both requests.jsonl
    files, or when they do not hold the same documents."""
    a = doc_correct(os.path.join(a_dir, "requests.jsonl"), a_block)
    b = doc_correct(os.path.join(b_dir, "requests.jsonl"), b_block)
    if not a or not b or sorted(a) != sorted(b):
        return None
    means, variances = [], []
    for task in a:
        if sorted(a[task]) != sorted(b[task]) or len(a[task]) < 2:
            return None
        d = [a[task][k] - b[task][k] for k in a[task]]
        m, sd, n = mean_sd(d)
        means.append(m)
        variances.append((sd or 0.0) ** 2 / n)
    return sum(means) / len(means), math.sqrt(sum(variances)) / len(means)


def cell_paired(r):
    """paired_difference() of a cell's two students, None unless it reproduces their means' difference;
    read once per cell (the verdict, the per-task table and the notes all ask)."""
    if "paired" not in r:
        ac, mt = r["methods"]["autocompress"], r["methods"]["minitron"]
        paired = paired_difference(ac["tasks_dir"], ac["tasks"], mt["tasks_dir"], mt["tasks"])
        ok = paired and abs(paired[0] - (ac["tasks"]["mean"] - mt["tasks"]["mean"])) < 1e-8
        r["paired"] = paired if ok else None
    return r["paired"]


def accuracy_note(target, rs):
    """A reading note for a target where AutoCompress's mean accuracy is not ahead by more than the
    seed spread: the difference per seed beside the document sample's standard error of it, and the
    task that moved it most."""
    cells = [r for r in rs if all(r["methods"][m]["tasks"] for m in METHODS)]
    if not cells:
        return []
    diffs = [100 * (r["methods"]["autocompress"]["tasks"]["mean"] - r["methods"]["minitron"]["tasks"]["mean"]) for r in cells]
    m, sd, n = mean_sd(diffs)
    if m > 0 and (n < 2 or (num(sd) and m > sd)):
        return []  # ahead by more than the spread (or one seed and ahead)
    per_seed, unpaired = [], False
    for r, d in zip(cells, diffs):
        ac, mt = r["methods"]["autocompress"], r["methods"]["minitron"]
        paired = cell_paired(r)
        if paired:
            se_text = f"; paired standard error of it ~{fmt(100 * paired[1], 2)}"
        else:  # no per-document scores: the bound from each student's own standard error
            se = [mean_stderr(x["tasks"]) for x in (ac, mt)]
            se_d = 100 * math.sqrt(se[0] ** 2 + se[1] ** 2) if all(num(x) for x in se) else None
            se_text = f"; documents' standard error of it ~{fmt(se_d, 2)}" if num(se_d) else ""
            unpaired = unpaired or bool(se_text)
        a, b = per_task(ac["tasks"]), per_task(mt["tasks"])
        moves = {k: a[k][0] - b[k][0] for k in a if k in b and num(a[k][0]) and num(b[k][0])}
        top = max(moves, key=lambda k: abs(moves[k])) if moves else None
        text = f"{fmt(d, 3)} (seed {r['cell'].seed}{se_text}"
        if top is not None:
            text += f"; most from {top}: {100 * moves[top]:+.0f} points of that task, {100 * moves[top] / len(a):+.2g} of the mean"
        per_seed.append(text + ")")
    head = "AutoCompress is not ahead of Minitron in mean accuracy" + ("" if n < 2 else " by more than the seed spread")
    return [f"- **{target}: {head}.** AutoCompress − Minitron in points: {fmt(m, 3)}"
            + (f" ± {fmt(sd, 2)}" if num(sd) else "") + "; per seed " + "; ".join(per_seed)
            + ". The paired standard error is that of the per-document differences (both students answer the same "
            "documents; per task, then sqrt(sum of squares) / tasks); a difference within about twice it is what "
            "another sample of documents could reverse"
            + (" (where no per-document scores were kept, the bound from each student's own standard error, larger "
               "than the paired one)" if unpaired else "") + "."]


def write_results(plt, targets, configs, cells, args):
    png = os.path.splitext(args.results)[0] + ".png"
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    status, data = collect(cells, args)
    made = make_plot(plt, plot_points(targets, data), png)
    if not made and os.path.exists(png):
        os.remove(png)  # a stale plot of an earlier grid
    text = build_page(targets, configs, cells, status, data, args, png if made else None)
    tmp = args.results + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.results)
    print(f"{PROG}: wrote {args.results}" + (f" and {png}" if made else " (no plot)"), flush=True)


def main():
    ap = argparse.ArgumentParser(prog="run_grid.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", help="comma-separated config names (default: every CONFIGS/*.cfg)")
    ap.add_argument("--seeds", default="1,2", help="comma-separated seeds (default 1,2)")
    ap.add_argument("--out", default="runs/grid", help="where the cells' run directories go (default runs/grid)")
    ap.add_argument("--configs", default=os.path.join(REPO, "configs", "experiments"),
                    help="directory of the target configs (default configs/experiments)")
    ap.add_argument("--results", default=os.path.join(REPO, "docs", "results.md"),
                    help="the results page; its plot goes beside it as .png (default docs/results.md)")
    ap.add_argument("--ac", default=os.path.join(REPO, "build", "autocompress"), help="the autocompress binary")
    ap.add_argument("--mpi", default="", help="launcher prefix of each cell, e.g. \"mpiexec -n 2\" (default: none)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="passed to every cell's `run --set` (repeatable)")
    ap.add_argument("--eval-limit", type=int, metavar="N",
                    help="score the benchmarks again on the first N documents per task (the students of every complete "
                         "cell and the teacher once) and show those scores; see above")
    ap.add_argument("--dry-run", action="store_true", help="print the cells and their commands; write nothing")
    ap.add_argument("--report-only", action="store_true", help="run no cell; write the results page")
    args = ap.parse_args()
    if args.dry_run and args.report_only:
        die("--dry-run and --report-only exclude each other")
    if args.eval_limit is not None and args.eval_limit < 1:
        die(f"--eval-limit: expected a positive number of documents, got {args.eval_limit}")
    if not os.path.isdir(args.configs):
        die(f"{args.configs}: no such configs directory")
    available = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(args.configs, "*.cfg")))
    targets = [t for t in (args.targets or "").split(",") if t] or available
    for t in targets:
        if t not in available:
            die(f"unknown target {t!r}: no {os.path.join(args.configs, t + '.cfg')} (have: {', '.join(available)})")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        die(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if not seeds or not targets:
        die("no cells: give at least one target and one seed")
    configs = {t: read_ini(os.path.join(args.configs, t + ".cfg")) for t in targets}
    check_shared(configs)
    for t, ini in configs.items():
        if ini[""].get("method", "both") != "both":
            die(f"{t}.cfg: method = {ini[''].get('method')}: the grid compares both methods (method = both)")
    if not args.report_only and not args.dry_run and not os.access(args.ac, os.X_OK):
        die(f"{args.ac}: not an executable autocompress binary (--ac)")
    cells = [Cell(t, s, args) for t in targets for s in seeds]
    plt = None if args.dry_run else import_matplotlib()  # before any cell: it may rerun this script
    rc = 0
    if not args.report_only:
        rc = run_grid(cells, args)
        if args.eval_limit and not args.dry_run and rc in (0, 1):
            rc = max(rc, rescore(cells, configs, args))
    if not args.dry_run:
        write_results(plt, targets, configs, cells, args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
