// The metrics.jsonl of a job: appended on rank 0, cut back to the resumed step on resume.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace ac::job {

// Rank 0 on resume: drops the lines of `path` (JSONL with a "step" field) logged after `step`,
// which belong to the timeline the resumed checkpoint does not contain. Atomic.
void truncate_metrics(const std::string& path, int64_t step);

// The job's metrics.jsonl, appended on rank 0 only (other ranks' writes are dropped). Opened on
// the first line, so a resume's truncate_metrics() comes first.
class MetricsLog {
 public:
  MetricsLog(std::string path, bool root) : path_(std::move(path)), root_(root) {}
  const std::string& path() const { return path_; }
  void write(const nlohmann::json& line);

 private:
  std::string path_;
  bool root_;
  std::unique_ptr<std::ofstream> out_;
};

}  // namespace ac::job
