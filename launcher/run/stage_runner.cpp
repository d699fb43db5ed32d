// `autocompress run`'s stage runner: stage keys, markers, skip / resume / rerun, the manifest
// (launcher/run/stage_runner.h).
#include "launcher/run/stage_runner.h"

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "dist/error.h"
#include "dist/runtime.h"
#include "job/signals.h"
#include "launcher/config_file.h"

namespace ac::launcher::run {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex16(uint64_t h) {
  std::ostringstream o;
  o << std::hex << std::setw(16) << std::setfill('0') << h;
  return o.str();
}

std::string fmt_secs(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(s < 100 ? 1 : 0) << s << " s";
  return o.str();
}

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Waits for every rank without spinning a core: the ranks that have nothing to do while rank 0
// works alone (a measurement, a Python step) sleep between polls of a non-blocking barrier.
void quiet_barrier(MPI_Comm world) {
  MPI_Request req;
  MPI_Ibarrier(world, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Run-dir-relative text of a call for its stage key (a run directory may be moved).
json call_for_key(const Call& c, const std::string& run_dir) {
  json a = json::array();
  for (std::string w : c.args()) {
    if (w.rfind(run_dir, 0) == 0) w = "$RUN" + w.substr(run_dir.size());
    a.push_back(w);
  }
  return a;
}

// One stage's record: RUN/stages/<name>.json {key, status: started|done, wall_s, ...}.
fs::path marker_path(const RunPlan& p, const Stage& s) { return fs::path(p.out) / "stages" / (s.name + ".json"); }

json read_marker(const fs::path& path) {
  std::ifstream f(path);
  if (!f) return json();
  try {
    return json::parse(f);
  } catch (const std::exception&) {
    return json();  // a torn record counts as none: the stage reruns
  }
}

int run_call(RunContext& ctx, const Call& c) {
  dist::Runtime& rt = ctx.runtime;
  const int threads = torch::get_num_threads();
  int rc = 0;
  if (c.root_only && rt.world_size() > 1) {
    if (rt.is_root()) {
      dist::Runtime self(dist::Runtime::SelfView{}, rt);
      rc = invoke_subcommand(self, c.args());
    }
    quiet_barrier(rt.world());
    MPI_Bcast(&rc, 1, MPI_INT, 0, rt.world());
  } else {
    rc = invoke_subcommand(rt, c.args());
    MPI_Barrier(rt.world());  // a command whose rank 0 works alone (export) returns early elsewhere
  }
  torch::set_num_threads(threads);  // a stage may change it (scorecard --threads)
  return rc;
}

enum Action : int { kSkip = 0, kFresh = 1, kContinue = 2 };

// What to do with a stage, by its marker (rank 0 decides, and clears the directory of a stage
// whose key changed).
Action stage_action(const RunPlan& plan, const Stage& s, dist::Runtime& rt) {
  int action = kSkip;
  if (rt.is_root()) {
    const json m = read_marker(marker_path(plan, s));
    const bool same = m.is_object() && m.value("key", "") == s.key;
    action = same && m.value("status", "") == "done" ? kSkip : same ? kContinue : kFresh;
    if (action == kFresh && !s.dir.empty() && fs::exists(fs::path(plan.out) / s.dir)) {
      std::cout << "[run] " << s.name << ": its inputs or options changed (key "
                << (m.is_object() ? m.value("key", "none") : std::string("none")) << " -> " << s.key
                << "): clearing " << (fs::path(plan.out) / s.dir).string() << std::endl;
      fs::remove_all(fs::path(plan.out) / s.dir);
    }
  }
  MPI_Bcast(&action, 1, MPI_INT, 0, rt.world());
  return Action(action);
}

// The shell steps (rank 0), the calls, the finish step; 0 or job::kExitRequeue.
int run_stage(RunContext& ctx, const Stage& s) {
  dist::Runtime& rt = ctx.runtime;
  const bool root = rt.is_root();
  if (!s.shell.empty()) {
    if (root)
      for (const auto& cmd : s.shell) run_shell(cmd, "stage " + s.name);
    quiet_barrier(rt.world());
  }
  for (const auto& c : s.calls) {
    if (root) std::cout << "[run]   $ " << c.text() << std::endl;
    const int rc = run_call(ctx, c);
    if (rc == job::kExitRequeue) {
      if (root) std::cout << "[run] " << s.name << " stopped on a signal (exit 75): rerun the same command to continue" << std::endl;
      return rc;
    }
    if (rc != 0) throw std::runtime_error("stage " + s.name + ": '" + c.text() + "' exited with " + std::to_string(rc));
  }
  if (root && s.finish) s.finish();
  MPI_Barrier(rt.world());
  return 0;
}

// The run so far: for the progress lines and the last one.
struct Progress {
  clock_type::time_point start = clock_type::now();
  int done_before = 0, ran = 0;
  double ran_s = 0;
};

void add_stage_record(json& manifest, const RunPlan& plan, const json& rec) {
  manifest["stages"].push_back(rec);
  write_json_atomic((fs::path(plan.out) / "manifest.json").string(), manifest);
}

void print_starting(const Stage& s, int i, int n, Action action, const Progress& p) {
  std::cout << "\n[run] stage " << i + 1 << "/" << n << " " << s.name << (action == kContinue ? ": continuing" : ": starting")
            << " (run elapsed " << fmt_secs(seconds_since(p.start));
  if (p.ran > 0) std::cout << ", " << p.ran << " stages run at " << fmt_secs(p.ran_s / p.ran) << " each on average";
  std::cout << ")" << std::endl;
}

}  // namespace

void assign_stage_keys(RunPlan& plan) {
  const std::string& R = plan.out;
  std::map<std::string, std::string> key_of;
  for (auto& s : plan.stages) {
    json k = {{"stage", s.name}, {"inputs", s.inputs}, {"extra", s.extra}, {"shell", json::array()}, {"calls", json::array()}};
    for (const auto& c : s.calls) k["calls"].push_back(call_for_key(c, R));
    for (auto sh : s.shell) {
      for (size_t p; (p = sh.find(R)) != std::string::npos;) sh.replace(p, R.size(), "$RUN");
      k["shell"].push_back(sh);
    }
    for (const auto& a : s.after) k["after"][a] = key_of.at(a);
    s.key = hex16(fnv1a(k.dump()));
    key_of[s.name] = s.key;
  }
}

json run_manifest(const RunContext& ctx, const RunConfig& cfg, const TeacherSource& teacher, const RunPlan& plan) {
  const RunOptions& t = cfg.options;
  const int world = ctx.runtime.world_size();
  json manifest = {{"format", "autocompress.run"}, {"format_version", 1}, {"config_path", cfg.path}, {"argv", ctx.argv},
                   {"config", ctx.config}, {"out", t.out}, {"budgets", plan.budgets},
                   {"teacher", {{"kind", teacher.kind}, {"source", teacher.source}, {"checkpoint", teacher.checkpoint},
                                {"tokenizer", teacher.tokenizer}}},
                   {"world", {{"size", world}, {"tp", t.tp}, {"dp", world / std::max(1, t.tp)}}},
                   {"plan", json::array()}};
  json sections = json::object();
  for (const auto& [sec, kv] : cfg.keys.by_section)
    for (const auto& [k, v] : kv) sections[sec][k] = v;
  manifest["sections"] = sections;
  for (const auto& s : plan.stages) {
    json calls = json::array();
    for (const auto& c : s.calls) calls.push_back(c.text());
    manifest["plan"].push_back({{"name", s.name}, {"key", s.key}, {"dir", s.dir}, {"after", s.after}, {"shell", s.shell}, {"calls", calls}});
  }
  return manifest;
}

int run_plan(RunContext& ctx, const RunPlan& plan, const json& manifest_base) {
  dist::Runtime& rt = ctx.runtime;
  const bool root = rt.is_root();
  job::StopSignals signals;  // between stages; each stage catches its own
  Progress progress;
  json manifest = manifest_base;
  manifest["stages"] = json::array();
  const int n = int(plan.stages.size());
  for (int i = 0; i < n; ++i) {
    const Stage& s = plan.stages[size_t(i)];
    if (const int sig = signals.agree(rt.world())) {
      if (root) {
        std::cout << "[run] " << job::signal_name(sig) << ": stopping before stage " << s.name << " (exit 75: rerun to continue)"
                  << std::endl;
        job::requeue_after_signal(sig);
      }
      return job::kExitRequeue;
    }
    const fs::path mpath = marker_path(plan, s);
    const Action action = stage_action(plan, s, rt);
    json rec = {{"name", s.name}, {"key", s.key}, {"dir", s.dir}, {"after", s.after}};
    if (action == kSkip) {
      if (root) {
        std::cout << "[run] stage " << i + 1 << "/" << n << " " << s.name << ": done earlier (key " << s.key << "), skipped" << std::endl;
        rec["status"] = "skipped";
        rec["wall_s"] = read_marker(mpath).value("wall_s", 0.0);
        add_stage_record(manifest, plan, rec);
      }
      ++progress.done_before;
      continue;
    }
    if (root) {
      print_starting(s, i, n, action, progress);
      write_json_atomic(mpath.string(), {{"name", s.name}, {"key", s.key}, {"status", "started"}, {"started_at_unix", int64_t(std::time(nullptr))}});
      if (!s.dir.empty()) fs::create_directories(fs::path(plan.out) / s.dir);
    }
    const auto t0 = clock_type::now();
    if (const int rc = run_stage(ctx, s); rc != 0) return rc;
    const double wall = seconds_since(t0);
    ++progress.ran;
    progress.ran_s += wall;
    if (root) {
      write_json_atomic(mpath.string(), {{"name", s.name}, {"key", s.key}, {"status", "done"}, {"wall_s", wall},
                                {"finished_at_unix", int64_t(std::time(nullptr))}});
      rec["status"] = "done";
      rec["wall_s"] = wall;
      add_stage_record(manifest, plan, rec);
      std::cout << "[run] stage " << s.name << " done in " << fmt_secs(wall) << std::endl;
    }
  }
  if (root)
    std::cout << "\n[run] finished in " << fmt_secs(seconds_since(progress.start)) << ": " << progress.ran << " stages run, "
              << progress.done_before << " done earlier; report: " << (fs::path(plan.out) / "report.md").string() << std::endl;
  return kExitOk;
}

void run_shell(const std::string& cmd, const std::string& what) {
  std::cout << "[run]   $ " << cmd << std::endl;
  const std::string guarded = "trap '' USR1 TERM; " + cmd;
  const int rc = std::system(guarded.c_str());
  if (rc != 0) throw std::runtime_error(what + ": '" + cmd + "' failed (status " + std::to_string(rc) + ")");
}

}  // namespace ac::launcher::run
