// Helpers shared by the data tests: a temporary directory and whole-file read/write.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dist/error.h"

namespace ac::data::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ac_data_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Files in the directory (names only), sorted.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary);
  f << data;
}

inline std::string fixture(const std::string& rel) { return std::string(AC_DATA_FIXTURES) + "/" + rel; }

// Runs f, expects ac::InputError, and returns its message.
template <typename F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const ac::InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ac::InputError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ac::InputError, nothing was thrown";
  return "";
}

}  // namespace ac::data::test
