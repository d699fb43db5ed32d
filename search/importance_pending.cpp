// Placeholder for the importance file I/O and calibration (search/importance.h), compiled
// only while search/importance.cpp does not exist (it is written on another branch of issue
// 14). Lets the prune and minitron commands link; they then refuse importance files.
#include "dist/error.h"
#include "search/importance.h"

namespace ac::search {
namespace {
[[noreturn]] void pending(const std::string& what) {
  throw InputError(what, "importance", "importance files are not available in this build (search/importance.cpp missing)");
}
}  // namespace

void save_importance(const ImportanceScores&, const std::string& path) { pending(path); }
ImportanceScores load_importance(const std::string& path, const std::string&) { pending(path); }
ImportanceScores compute_importance(const ImportanceOptions& o, MPI_Comm) { pending(o.teacher); }

}  // namespace ac::search
