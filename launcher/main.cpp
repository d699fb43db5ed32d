// The `autocompress` executable: finds the subcommand, parses its options from the command
// line and an INI config file (the command line wins), and runs it under the MPI runtime.
#include <ATen/Parallel.h>
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "autocompress/build_info.h"
#include "dist/error.h"
#include "dist/omp_env.h"
#include "dist/runtime.h"
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

int run_subcommand(ac::dist::Runtime& rt, const Subcommand& cmd, int argc, char** argv, int consumed) {
  po::options_description desc("Options of 'autocompress " + cmd.name + "'");
  desc.add_options()("help,h", "show this help and exit")(
      "config", po::value<std::string>()->value_name("FILE"), "INI config file; the command line overrides it");
  cmd.add_options(desc);
  po::positional_options_description pos;
  if (cmd.add_positional) cmd.add_positional(pos);

  std::vector<std::string> args(argv + 1 + consumed, argv + argc);
  po::variables_map vm;
  std::set<std::string> from_cli, from_config;
  try {
    po::parsed_options cli = po::command_line_parser(args).options(desc).positional(pos).run();
    for (const auto& o : cli.options) from_cli.insert(o.string_key);
    po::store(cli, vm);
    if (vm.count("help")) {
      if (rt.is_root()) std::cout << "Usage: autocompress " << cmd.name << " [options]\n" << cmd.summary << "\n\n" << desc << "\n";
      return ac::kExitOk;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      po::parsed_options cfg = ac::launcher::parse_ini_config(path, cmd.name, desc);
      for (const auto& o : cfg.options) from_config.insert(o.string_key);
      po::store(cfg, vm);  // first store wins: command-line values stay
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw ac::InputError(std::string("autocompress ") + cmd.name + ": " + e.what() + " (see --help)");
  }

  ac::launcher::RunContext ctx{rt, cmd.name, std::vector<std::string>(argv, argv + argc), nlohmann::json::object()};
  for (const auto& [name, value] : vm) {
    if (name == "help") continue;
    const char* source = from_cli.count(name) ? "cli" : from_config.count(name) ? "config" : "default";
    ctx.config[name] = {{"value", ac::launcher::option_value_json(value)}, {"source", source}};
  }
  return cmd.run(vm, ctx);
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI_Init: may re-execute this program with GOMP_SPINCOUNT set (dist/omp_env.h).
  ac::dist::default_omp_wait(argc, argv);
  ac::dist::Runtime rt(&argc, &argv);
  // LibTorch defaults to the physical core count (1 on a 2-vCPU VM). Unless the user set
  // OMP_NUM_THREADS, share the node's hardware threads among the ranks on it.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    ac::dist::set_compute_threads(std::max(1, hw / std::max(1, rt.local_size())));
  }
  return rt.run_guarded([&]() -> int {
    if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
        std::string(argv[1]) == "help") {
      if (rt.is_root()) print_tool_help(std::cout);
      return argc < 2 ? ac::kExitUsage : ac::kExitOk;
    }
    if (std::string(argv[1]) == "--version") {
      if (rt.is_root()) std::cout << "autocompress " << AC_VERSION << " (" << AC_GIT_DESCRIBE << ")\n";
      return ac::kExitOk;
    }
    int consumed = 0;
    const Subcommand* cmd = find_subcommand(argc, argv, &consumed);
    if (!cmd) {
      if (is_group(argv[1])) {
        const bool help = argc > 2 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h");
        if (rt.is_root()) print_tool_help(help ? std::cout : std::cerr, argv[1]);
        return help ? ac::kExitOk : ac::kExitUsage;
      }
      throw ac::InputError(std::string("unknown subcommand '") + argv[1] + "' (see autocompress --help)");
    }
    return run_subcommand(rt, *cmd, argc, argv, consumed);
  });
}
