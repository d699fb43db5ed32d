// The job's metrics (job/metrics.h).
#include "job/metrics.h"

#include <filesystem>
#include <sstream>

#include "dist/file_io.h"

namespace fs = std::filesystem;

namespace ac::job {

void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  std::ostringstream kept;
  for (std::string line; std::getline(in, line);) {
    try {
      const auto j = nlohmann::json::parse(line);
      if (j.value("step", int64_t(0)) <= step) kept << line << "\n";
    } catch (const std::exception&) {
    }
  }
  write_file_atomic(path, kept.str(), "metrics.jsonl");
}

void MetricsLog::write(const nlohmann::json& line) {
  if (!root_) return;
  if (!out_) out_ = std::make_unique<std::ofstream>(path_, std::ios::app);
  *out_ << line.dump() << "\n" << std::flush;
}

}  // namespace ac::job
