// `autocompress plan`: per-GPU memory, communication per step and a step-time estimate of a
// distillation (or importance / search) job on a named cluster, at a given layout or at the
// least-sharded layout that fits; exit 2 naming what does not fit (docs/plan.md).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "dist/error.h"
#include "dist/file_io.h"
#include "dist/runtime.h"
#include "launcher/command.h"
#include "model/arch_spec.h"
#include "search/costmodel/profiles.h"
#include "search/plan/plan.h"

namespace ac::launcher {
namespace {

void write_json(const std::string& out, const nlohmann::json& j) {
  write_file_atomic(out, j.dump(2) + "\n", "--json");
}

std::string layouts_line(const std::vector<search::Plan>& fit) {
  std::string s;
  for (const auto& p : fit) {
    char b[64];
    std::snprintf(b, sizeof b, " (%.1f GiB)", p.total_bytes / double(1 << 30));
    s += "\n  " + p.layout.to_string() + b;
  }
  return s;
}

int run_plan(const po::variables_map& vm, RunContext& ctx) {
  if (!ctx.runtime.is_root()) return kExitOk;
  search::PlanOptions o;
  o.stage = search::parse_stage(vm["stage"].as<std::string>());
  if (!vm.count("teacher")) throw InputError("autocompress plan: missing --teacher (see --help)");
  if (!vm.count("cluster")) throw InputError("autocompress plan: missing --cluster (see --help)");
  if (o.stage == search::PlanStage::Distill && !vm.count("student"))
    throw InputError("autocompress plan: missing --student (the distill stage needs one; see --help)");
  const search::Cluster cluster = search::parse_cluster(vm["cluster"].as<std::string>());
  search::HardwareProfile hw;
  try {
    hw = search::load_hardware(cluster.kind, vm["configs-dir"].as<std::string>());
  } catch (const InputError& e) {  // name the option the user typed (load_hardware says --hardware)
    throw InputError("--cluster", vm["cluster"].as<std::string>(), std::string("KIND: ") + e.what());
  }
  const model::ArchSpec teacher = model::load_arch(vm["teacher"].as<std::string>());
  std::optional<model::ArchSpec> student;
  if (vm.count("student")) student = model::load_arch(vm["student"].as<std::string>());
  o.seq_len = vm["seq-len"].as<int64_t>();
  o.micro_batch = vm["micro-batch"].as<int64_t>();
  o.global_batch = vm["global-batch"].as<int64_t>();
  o.recompute = search::parse_recompute(vm["recompute"].as<std::string>());
  const std::string attn = vm["attention"].as<std::string>();
  if (attn != "flash" && attn != "eager") throw InputError("--attention", attn, "expected flash or eager");
  o.flash_attention = attn == "flash";
  o.sequence_parallel = !vm["no-sequence-parallel"].as<bool>();
  const std::string gd = vm["grad-dtype"].as<std::string>();
  if (gd != "bf16" && gd != "fp32") throw InputError("--grad-dtype", gd, "expected bf16 or fp32");
  o.grad_bytes = gd == "bf16" ? 2 : 4;
  const double reserve = vm["reserve-gib"].as<double>();
  if (!(reserve >= 0)) throw InputError("--reserve-gib", std::to_string(reserve), "must not be negative");
  o.reserve_bytes = reserve * double(1 << 30);
  o.include_mtp = !vm["no-mtp"].as<bool>();
  if (o.seq_len < 1) throw InputError("--seq-len", std::to_string(o.seq_len), "must be positive");
  if (o.micro_batch < 1) throw InputError("--micro-batch", std::to_string(o.micro_batch), "must be positive");
  if (o.global_batch < 0) throw InputError("--global-batch", std::to_string(o.global_batch), "must not be negative");
  const model::ArchSpec* st = student ? &*student : nullptr;

  const bool layout_given = vm.count("tp") || vm.count("dp") || vm.count("ep") || vm.count("etp") ||
                            vm.count("teacher-ep") || vm.count("zero");
  std::optional<search::Plan> plan;
  std::vector<search::Plan> fit;
  if (layout_given) {
    search::PlanLayout L;
    if (vm.count("tp")) L.tp = vm["tp"].as<int>();
    if (vm.count("dp")) L.dp = vm["dp"].as<int>();
    if (vm.count("ep")) L.ep = vm["ep"].as<int>();
    if (vm.count("etp")) L.etp = vm["etp"].as<int>();
    if (vm.count("teacher-ep")) L.teacher_ep = vm["teacher-ep"].as<int>();
    if (vm.count("zero")) L.zero = vm["zero"].as<int>();
    if (L.dp < 0) throw InputError("--dp", std::to_string(L.dp), "must be positive");
    if (L.etp < 0 || (vm.count("etp") && L.etp == 0)) throw InputError("--etp", std::to_string(L.etp), "must be positive");
    if (vm.count("teacher-ep") && L.teacher_ep < 1)
      throw InputError("--teacher-ep", std::to_string(L.teacher_ep), "must be positive");
    plan = search::make_plan(teacher, st, cluster, hw, L, o);
    if (!plan->fits) fit = search::fitting_layouts(teacher, st, cluster, hw, o);
  } else {
    fit = search::fitting_layouts(teacher, st, cluster, hw, o);
    if (fit.empty()) {  // show the valid layout that needs the least memory, to say by how much it misses
      std::vector<search::Plan> all = search::candidate_layouts(teacher, st, cluster, hw, o);
      if (all.empty()) throw InputError("--cluster", cluster.to_string(), "no valid layout (TP 1/2/4/8 and EP) for these models");
      plan = *std::min_element(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.total_bytes < b.total_bytes; });
      std::cout << "layout: none given and none fits on " << cluster.to_string() << "; the one needing the least memory is "
                << plan->layout.to_string() << "\n";
    } else {
      plan = fit.front();
      std::cout << "layout: none given; the least-sharded layout that fits on " << cluster.to_string() << " is "
                << plan->layout.to_string() << "\n";
    }
  }
  std::cout << "teacher: " << vm["teacher"].as<std::string>();
  if (st && o.stage == search::PlanStage::Distill) std::cout << "\nstudent: " << vm["student"].as<std::string>();
  std::cout << "\n" << plan->table();
  if (vm.count("json")) {
    nlohmann::json j = plan->to_json();
    j["teacher"] = vm["teacher"].as<std::string>();
    if (st) j["student"] = vm["student"].as<std::string>();
    nlohmann::json alt = nlohmann::json::array();
    for (const auto& p : fit)
      alt.push_back({{"layout", p.to_json()["layout"]}, {"total_bytes", p.total_bytes}, {"step_s", p.step_s}});
    j["fitting_layouts"] = alt;
    write_json(vm["json"].as<std::string>(), j);
    std::cout << "wrote " << vm["json"].as<std::string>() << "\n";
  }
  std::cout << std::flush;
  if (!plan->fits) {
    std::string msg = "does not fit: " + plan->overflow() + ". ";
    if (fit.empty()) {
      msg += "No layout of " + cluster.to_string() + " fits (TP 1/2/4/8, ETP 1 or TP, EP dividing the experts, ZeRO 0-2)";
      const std::vector<search::Plan> more = search::smallest_fitting_cluster(teacher, st, cluster, hw, o);
      if (more.empty())
        msg += ", nor on up to 1024 such nodes: use a larger GPU, full recompute or a shorter sequence";
      else
        msg += "; the fewest nodes of this kind that fit: " + more.front().cluster.to_string() + " with" +
               layouts_line(more);
    }
    else
      msg += "Layouts of " + cluster.to_string() + " that fit, least sharded first:" + layouts_line(fit);
    throw InputError("--cluster " + cluster.to_string(), "layout", msg);
  }
  return kExitOk;
}

AC_REGISTER_SUBCOMMAND((Subcommand{
    "plan", "per-GPU memory, communication and step time of a distillation/importance/search job on a cluster",
    [](po::options_description& d) {
      d.add_options()("teacher", po::value<std::string>()->value_name("CONFIG"), "teacher ArchSpec JSON or HF config.json")(
          "student", po::value<std::string>()->value_name("CONFIG"), "student ArchSpec JSON or HF config.json (distill)")(
          "cluster", po::value<std::string>()->value_name("NODESxGPUSxKIND"),
          "e.g. 8x8xh100 (KIND: a hardware profile id or .json with an interconnect block)")(
          "stage", po::value<std::string>()->default_value("distill"), "distill | importance | search")(
          "tp", po::value<int>(), "tensor parallel (dense layers; default 1)")(
          "dp", po::value<int>(), "data parallel (must be GPUs / TP)")(
          "ep", po::value<int>(), "expert parallel (default 1)")(
          "etp", po::value<int>(), "expert tensor parallel (default TP; 1 as in ModelOpt KD)")(
          "teacher-ep", po::value<int>(), "expert parallel of the teacher (default --ep)")(
          "zero", po::value<int>(), "0 replicated, 1 optimizer states sharded (default), 2 + gradients")(
          "seq-len", po::value<int64_t>()->default_value(8192), "tokens per sequence")(
          "micro-batch", po::value<int64_t>()->default_value(1), "sequences per DP rank per micro-step")(
          "global-batch", po::value<int64_t>()->default_value(0), "sequences per optimizer step (0: micro-batch x DP)")(
          "recompute", po::value<std::string>()->default_value("selective"), "none | selective | full")(
          "attention", po::value<std::string>()->default_value("flash"), "flash | eager (stores the s^2 scores)")(
          "grad-dtype", po::value<std::string>()->default_value("bf16"), "bf16 | fp32 gradient storage")(
          "no-sequence-parallel", po::bool_switch(), "TP without sequence parallelism")(
          "no-mtp", po::bool_switch(), "leave the MTP layers' weights out")(
          "reserve-gib", po::value<double>()->default_value(2.0),
          "per-GPU memory kept back for the CUDA context, library workspaces and allocator slack")(
          "configs-dir", po::value<std::string>()->value_name("DIR")->default_value(search::default_configs_dir()),
          "where hardware ids are looked up")("json", po::value<std::string>()->value_name("FILE"), "also write the plan as JSON");
    },
    run_plan}));

}  // namespace
}  // namespace ac::launcher
