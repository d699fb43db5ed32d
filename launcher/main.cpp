// The `autocompress` executable: finds the subcommand, parses its options from the command
// line and an INI config file (the command line wins), and runs it under the MPI runtime.
#include <ATen/Parallel.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "autocompress/build_info.h"
#include "dist/error.h"
#include "dist/omp_env.h"
#include "dist/runtime.h"
#include "dist/tensor_memory.h"
#include "launcher/command.h"
#include "launcher/config_file.h"

namespace po = boost::program_options;
using ac::launcher::Subcommand;

namespace {

void print_tool_help(std::ostream& os, const std::string& group = {}) {
  os << "autocompress " << AC_VERSION << " (" << AC_GIT_DESCRIBE << ")\n"
     << "Hardware-guided compression of large language models.\n\n"
     << "Usage: autocompress <subcommand> [options]\n"
     << "       autocompress <subcommand> --help\n\n"
     << "Subcommands:\n";
  size_t width = 0;
  for (const auto& c : ac::launcher::subcommands()) width = std::max(width, c.name.size());
  for (const auto& c : ac::launcher::subcommands()) {
    if (!group.empty() && c.name.rfind(group + " ", 0) != 0) continue;
    os << "  " << c.name << std::string(width + 2 - c.name.size(), ' ') << c.summary << "\n";
  }
  os << "\nEvery subcommand takes --config FILE (INI: top-level keys, or a section named after the\n"
        "subcommand such as [bench.comm]); options on the command line override the file.\n"
        "Exit codes: 0 ok, 2 bad usage or input, 1 runtime failure.\n";
}

// The longest registered subcommand whose words start argv[1..]; sets *consumed.
const Subcommand* find_subcommand(int argc, char** argv, int* consumed) {
  const Subcommand* best = nullptr;
  for (const auto& c : ac::launcher::subcommands()) {
    std::istringstream words(c.name);
    std::string w;
    int i = 1;
    bool match = true;
    while (words >> w) {
      if (i >= argc || w != argv[i]) { match = false; break; }
      ++i;
    }
    if (match && (!best || i - 1 > *consumed)) {
      best = &c;
      *consumed = i - 1;
    }
  }
  return best;
}

bool is_group(const std::string& word) {
  for (const auto& c : ac::launcher::subcommands())
    if (c.name.rfind(word + " ", 0) == 0) return true;
  return false;
}

// The parsed options of one subcommand call, and where each value came from.
struct ParsedOptions {
  po::variables_map vm;
  std::set<std::string> from_cli, from_config;
  bool help = false;
};

// Parses the command line and the --config file of `cmd`; with --help on the command line it
// stops there (help = true). Throws ac::InputError for anything that does not parse. Needs
// neither MPI nor LibTorch, so main() can run it before MPI_Init.
ParsedOptions parse_options(const Subcommand& cmd, po::options_description& desc, int argc, char** argv,
                            int consumed) {
  desc.add_options()("help,h", "show this help and exit")(
      "config", po::value<std::string>()->value_name("FILE"), "INI config file; the command line overrides it");
  cmd.add_options(desc);
  po::positional_options_description pos;
  if (cmd.add_positional) cmd.add_positional(pos);

  std::vector<std::string> args(argv + 1 + consumed, argv + argc);
  ParsedOptions p;
  try {
    po::parsed_options cli = po::command_line_parser(args).options(desc).positional(pos).run();
    for (const auto& o : cli.options) p.from_cli.insert(o.string_key);
    po::store(cli, p.vm);
    if (p.vm.count("help")) {
      p.help = true;
      return p;
    }
    if (p.vm.count("config")) {
      const std::string path = p.vm["config"].as<std::string>();
      po::parsed_options cfg = ac::launcher::parse_ini_config(path, cmd.name, desc);
      for (const auto& o : cfg.options) p.from_config.insert(o.string_key);
      try {
        po::store(cfg, p.vm);  // first store wins: command-line values stay
      } catch (const po::error& e) {
        throw ac::InputError(path, "--config", e.what());  // a value in the file does not parse
      }
    }
    po::notify(p.vm);
  } catch (const po::error& e) {
    throw ac::InputError(std::string("autocompress ") + cmd.name + ": " + e.what() + " (see --help)");
  }
  return p;
}

void print_subcommand_help(const Subcommand& cmd, const po::options_description& desc) {
  std::cout << "Usage: autocompress " << cmd.name << " [options]\n" << cmd.summary << "\n\n" << desc << "\n";
}

int run_subcommand(ac::dist::Runtime& rt, const Subcommand& cmd, int argc, char** argv, int consumed) {
  po::options_description desc("Options of 'autocompress " + cmd.name + "'");
  ParsedOptions p = parse_options(cmd, desc, argc, argv, consumed);
  if (p.help) {
    if (rt.is_root()) print_subcommand_help(cmd, desc);
    return ac::kExitOk;
  }
  ac::launcher::RunContext ctx{rt, cmd.name, std::vector<std::string>(argv, argv + argc), nlohmann::json::object()};
  for (const auto& [name, value] : p.vm) {
    if (name == "help") continue;
    const char* source = p.from_cli.count(name) ? "cli" : p.from_config.count(name) ? "config" : "default";
    ctx.config[name] = {{"value", ac::launcher::option_value_json(value)}, {"source", source}};
  }
  return cmd.run(p.vm, ctx);
}

// argv-style words of `args` behind a program name, and the subcommand they start with.
struct ArgWords {
  std::vector<std::string> words;
  std::vector<char*> argv;
  const Subcommand* cmd = nullptr;
  int consumed = 0;
  explicit ArgWords(const std::vector<std::string>& args) : words(args) {
    words.insert(words.begin(), "autocompress");
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    cmd = find_subcommand(int(words.size()), argv.data(), &consumed);
    if (!cmd) throw ac::InputError(std::string("unknown subcommand '") + (args.empty() ? "" : args[0]) + "'");
    for (int i = 1; i < int(words.size()); ++i)
      if (words[size_t(i)] == "--config")
        throw ac::InputError("autocompress " + cmd->name + ": --config is not taken by an invoked subcommand");
  }
};

// The world size and rank the process launcher announced in the environment (mpirun, srun,
// Hydra), before MPI_Init; size 1, rank 0 when started on its own.
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names)
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      const long x = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && x >= 0) return static_cast<int>(x);
    }
  return fallback;
}
int launcher_world_size() { return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "MV2_COMM_WORLD_SIZE"}, 1); }
int launcher_world_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"}, 0); }

// What the launcher can answer without MPI or any compute: the tool's, a group's and a
// subcommand's --help, --version, no arguments, an unknown subcommand, and options (command
// line or --config file) that do not parse. MPI_Init costs ~0.4 s (a singleton starts an
// orted), a third of such a call. Help and version print on launcher rank 0 only, as before;
// errors are answered here only in a one-process launch (under mpirun every rank reports its
// error through MPI_Abort as before). Returns the exit code, or -1 when the call needs the
// runtime (then nothing was printed).
int answer_before_mpi(int argc, char** argv) {
  const bool root = launcher_world_rank() == 0;
  const bool alone = launcher_world_size() <= 1;
  auto usage_error = [&](const std::string& message) {
    if (!alone) return -1;
    std::fflush(stdout);
    std::fprintf(stderr, "autocompress: error: %s\n", message.c_str());
    return int(ac::kExitUsage);
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    if (root) print_tool_help(std::cout);
    return argc < 2 ? ac::kExitUsage : ac::kExitOk;
  }
  if (std::string(argv[1]) == "--version") {
    if (root) std::cout << "autocompress " << AC_VERSION << " (" << AC_GIT_DESCRIBE << ")\n";
    return ac::kExitOk;
  }
  int consumed = 0;
  const Subcommand* cmd = find_subcommand(argc, argv, &consumed);
  if (!cmd) {
    if (is_group(argv[1])) {
      const bool help = argc > 2 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h");
      if (root) print_tool_help(help ? std::cout : std::cerr, argv[1]);
      return help ? ac::kExitOk : ac::kExitUsage;
    }
    return usage_error(std::string("unknown subcommand '") + argv[1] + "' (see autocompress --help)");
  }
  po::options_description desc("Options of 'autocompress " + cmd->name + "'");
  try {
    if (!parse_options(*cmd, desc, argc, argv, consumed).help) return -1;
  } catch (const ac::InputError& e) {
    return usage_error(e.what());
  } catch (const std::exception&) {
    return -1;  // reported by the runtime path, as any other failure
  }
  if (root) print_subcommand_help(*cmd, desc);
  return ac::kExitOk;
}

}  // namespace

namespace ac::launcher {

int invoke_subcommand(ac::dist::Runtime& rt, const std::vector<std::string>& args) {
  ArgWords a(args);
  return run_subcommand(rt, *a.cmd, int(a.words.size()), a.argv.data(), a.consumed);
}

void check_subcommand_args(const std::vector<std::string>& args) {
  ArgWords a(args);
  po::options_description desc("Options of 'autocompress " + a.cmd->name + "'");
  parse_options(*a.cmd, desc, int(a.words.size()), a.argv.data(), a.consumed);
}

}  // namespace ac::launcher

int main(int argc, char** argv) {
  // Help, version and usage errors need no MPI: answered first, in well under a second.
  if (const int rc = answer_before_mpi(argc, argv); rc >= 0) return rc;
  // Before any tensor: oneDNN's caches sized for many shapes (dist/omp_env.h).
  ac::dist::default_primitive_caches();
  // Before MPI_Init: may re-execute this program with GOMP_SPINCOUNT set (dist/omp_env.h).
  ac::dist::default_omp_wait(argc, argv);
  // Before any thread: denormals flushed to zero (FTZ + DAZ; dist/omp_env.h).
  ac::dist::default_flush_denormals();
  ac::dist::Runtime rt(&argc, &argv);
  // LibTorch defaults to the physical core count (1 on a 2-vCPU VM). Unless the user set
  // OMP_NUM_THREADS, share the node's hardware threads among the ranks on it.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    ac::dist::set_compute_threads(std::max(1, hw / std::max(1, rt.local_size())));
  }
  return rt.run_guarded([&]() -> int {
    // Before any tensor: every CPU storage counted, large freed blocks reused (dist/tensor_memory.h).
    ac::dist::tensor_memory::install(rt.local_size());
    // answer_before_mpi() handled help, version and unknown subcommands unless this is a
    // multi-rank launch with a usage error; those are reported from every rank here.
    int consumed = 0;
    const Subcommand* cmd = find_subcommand(argc, argv, &consumed);
    if (!cmd) throw ac::InputError(std::string("unknown subcommand '") + argv[1] + "' (see autocompress --help)");
    return run_subcommand(rt, *cmd, argc, argv, consumed);
  });
}
