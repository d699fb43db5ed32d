// INI config files for the launcher, and option values as JSON for the run manifest.
#pragma once

#include <boost/any.hpp>
#include <cstdint>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ac::launcher {

// One `key = value` line of an INI file, with its section ("" before the first header; names
// normalized: "bench comm" / "bench-comm" -> "bench.comm") and line number.
struct IniEntry {
  std::string section, key, value;
  int line = 0;
};
// Every entry of an INI file in order. A syntax error or an unreadable file throws
// ac::InputError naming the file and line.
std::vector<IniEntry> read_ini(const std::string& path);

// Reads an INI file for `subcommand`: top-level keys and the keys of the section named after
// the subcommand ("[bench.comm]", "[bench comm]" or "[bench-comm]") are options of it; other
// sections belong to other subcommands and are skipped. An unknown key, a syntax error or an
// unreadable file throws ac::InputError naming the file, line and key.
boost::program_options::parsed_options parse_ini_config(const std::string& path, const std::string& subcommand,
                                                        const boost::program_options::options_description& desc);

// Writes `j` to `path` through a temporary file and a rename (creating the parent directory),
// so a reader sees the old file or the new one, never a torn one.
void write_json_atomic(const std::string& path, const nlohmann::json& j, int indent = 2);

nlohmann::json option_value_json(const boost::program_options::variable_value& v);

// What makes `dir` a checkpoint directory ("latest" or a "step_<N>.h5"), or "" when nothing
// does (or it does not exist).
std::string checkpoint_in(const std::string& dir);
// Throws InputError(dir, option, ...) when `dir` holds a checkpoint and `force` is false: a
// command must not replace a checkpoint's files (step_<N>.h5, latest, manifest.json) unasked.
void refuse_checkpoint_dir(const std::string& dir, const std::string& option, bool force);

// A byte size on the command line: "4096", "512KiB", "256MiB", "5GiB" (K/M/G accepted).
// Throws ac::InputError naming `option` when it is malformed or not positive.
int64_t parse_size(const std::string& s, const char* option);

}  // namespace ac::launcher
