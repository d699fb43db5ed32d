// How a subcommand plugs into the `autocompress` launcher. Each launcher/cmd_*.cpp file
// defines its subcommands and registers them with AC_REGISTER_SUBCOMMAND; main.cpp parses
// the command line and INI config, builds the run context and calls run().
#pragma once

#include <boost/program_options.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ac::dist { class Runtime; }

namespace ac::launcher {

namespace po = boost::program_options;

// The checkpoint `eval` and `generate` read when --model is not given: where
// scripts/teacher_smollm2.sh puts the real teacher.
inline constexpr const char* kDefaultTeacher = "teachers/smollm2-135m";

struct RunContext {
  dist::Runtime& runtime;
  std::string subcommand;        // e.g. "bench comm"
  std::vector<std::string> argv; // the full command line, for the manifest
  nlohmann::json config;         // resolved options: {name: {"value": ..., "source": "default|config|cli"}}

  // Writes <dir>/manifest.json (rank 0 only, atomically): command line, resolved config,
  // version, build features, world layout (pass the layout of the run, e.g. tp/dp sizes).
  // `name` replaces manifest.json for outputs that are files (e.g. scores.h5.manifest.json).
  void write_manifest(const std::string& dir, const nlohmann::json& layout,
                      const std::string& name = "manifest.json") const;
};

struct Subcommand {
  std::string name;     // words separated by single spaces: "env", "bench comm", "data preprocess"
  std::string summary;  // one line for `autocompress --help`
  // Adds this subcommand's options. --help and --config are added by the launcher.
  std::function<void(po::options_description&)> add_options;
  // Runs it; returns an exit code. Throw ac::InputError for bad usage or input (exit 2),
  // anything else is a runtime failure (exit 1). Multi-rank errors abort every rank.
  std::function<int(const po::variables_map&, RunContext&)> run;
  // Optional: positional arguments (e.g. `checkpoint inspect PATH`), mapped to named options.
  std::function<void(po::positional_options_description&)> add_positional = nullptr;
};

bool register_subcommand(Subcommand cmd);
const std::vector<Subcommand>& subcommands();
// The registered subcommand named `name` ("distill", "checkpoint import"), or nullptr.
const Subcommand* find_subcommand(const std::string& name);

// Runs one subcommand inside this process, as `autocompress ARGS...` would (ARGS[0..] are the
// subcommand's words, then its options; no --config), under `rt`. Returns its exit code;
// throws ac::InputError when ARGS do not parse, and whatever the subcommand throws.
// `autocompress run` chains its stages with it.
int invoke_subcommand(dist::Runtime& rt, const std::vector<std::string>& args);
// Parses ARGS as invoke_subcommand would, without running anything (ac::InputError if not).
void check_subcommand_args(const std::vector<std::string>& args);

}  // namespace ac::launcher

#define AC_CONCAT_INNER(a, b) a##b
#define AC_CONCAT(a, b) AC_CONCAT_INNER(a, b)
// Registers a subcommand at static-initialization time; use once per Subcommand in a
// launcher/cmd_*.cpp file (those files are compiled straight into the executable). The name
// takes __COUNTER__, not __LINE__: a unity build (AC_UNITY_BUILD, in CI) puts several of
// those files in one translation unit.
#define AC_REGISTER_SUBCOMMAND(expr) \
  static const bool AC_CONCAT(ac_registered_, __COUNTER__) = ::ac::launcher::register_subcommand(expr)
