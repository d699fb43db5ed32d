// The tokenizer that belongs to a checkpoint, for subcommands that turn ids into text or bytes
// (generate, eval): tokenizer.json beside the checkpoint, in its hf/ folder, or in the hf/
// folder beside it (the layout scripts/teacher_smollm2.sh writes).
#pragma once

#include <filesystem>
#include <string>

namespace ac::launcher {

// "" when there is none.
inline std::string tokenizer_beside(const std::string& checkpoint) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(checkpoint) ? fs::path(checkpoint) : fs::path(checkpoint).parent_path();
  for (const fs::path& p : {dir / "tokenizer.json", dir / "hf" / "tokenizer.json", dir.parent_path() / "hf" / "tokenizer.json"})
    if (fs::exists(p)) return p.string();
  return "";
}

}  // namespace ac::launcher
