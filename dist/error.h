// Error kinds shared by every library: they decide the process exit code
// (0 ok, 2 bad usage or input, 1 runtime failure) and how the dist runtime stops all ranks.
#pragma once

#include <stdexcept>
#include <string>

namespace ac {

// Bad usage or bad input: a malformed config, a truncated or corrupt file, an impossible
// layout, shapes that do not match. Exit code 2. The message names the file and field.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
  // "path: field: problem" -- the shape every input error should have.
  InputError(const std::string& path, const std::string& field, const std::string& problem)
      : std::runtime_error(path + ": " + field + ": " + problem) {}
};

// Exit codes of the autocompress executable.
enum ExitCode : int { kExitOk = 0, kExitRuntime = 1, kExitUsage = 2 };

}  // namespace ac
