// The JSON an HDF5 checkpoint carries in attributes (checkpoint/attributes.h) on arbitrary
// text: the input is split at lines "--" into json_attributes, arch_spec, per_rank and a
// dataset's crc32_slices. Read as CheckpointReader reads them, then the ArchSpec as
// checkpoint::checkpoint_arch reads it; accepted slices lie inside the [4, 8] dataset, and a
// partial read's plan (plan_checked_read) stays inside it.
#include <string_view>

#include "checkpoint/attributes.h"
#include "model/arch_spec.h"
#include "tests/fuzz/fuzz_common.h"

// What a read of rows 1-2, columns 2-4 checks: its span holds the read and lies in the
// dataset, and every block it checks lies in the span.
static void check_plan(const std::vector<ac::checkpoint::CrcSlice>& slices, const std::vector<int64_t>& shape) {
  const ac::checkpoint::Box want{{1, 2}, {2, 3}};
  const auto plan = ac::checkpoint::plan_checked_read(slices, want);
  const auto& sp = plan.span;
  for (size_t k = 0; k < shape.size(); ++k)
    ac::fuzz::require(sp.offset[k] >= 0 && sp.offset[k] <= want.offset[k] &&
                          want.offset[k] + want.shape[k] <= sp.offset[k] + sp.shape[k] && sp.offset[k] + sp.shape[k] <= shape[k],
                      "span holds the read and lies in the dataset");
  for (const auto& b : plan.blocks)
    for (size_t k = 0; k < shape.size(); ++k)
      ac::fuzz::require(b.box.offset[k] >= sp.offset[k] && b.box.shape[k] >= 0 &&
                            b.box.offset[k] + b.box.shape[k] <= sp.offset[k] + sp.shape[k],
                        "checked block inside the span");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  while (parts.size() < 3) {
    const size_t at = in.find("\n--\n");
    if (at == std::string_view::npos) break;
    parts.emplace_back(in.substr(0, at));
    in.remove_prefix(at + 4);
  }
  parts.emplace_back(in);
  parts.resize(4);
  const std::string path = "step_3.h5";
  return ac::fuzz::expect_input_error_only([&] {
    std::map<std::string, std::string> strings = {{"format", "autocompress-checkpoint"}, {"arch_spec", parts[1]}};
    if (!parts[0].empty()) strings["json_attributes"] = parts[0];
    if (!parts[2].empty()) strings["per_rank"] = parts[2];
    const nlohmann::json attrs = ac::checkpoint::parse_root_attributes(strings, {{"format_version", 1}, {"step", 3}}, path);
    ac::fuzz::require(attrs.is_object() && attrs.at("step") == 3, "attributes an object with step");
    const std::vector<int64_t> shape = {4, 8};
    const auto slices = ac::checkpoint::parse_crc32_slices(parts[3], shape, path, "model/embed.weight");
    for (const auto& s : slices)
      for (size_t k = 0; k < shape.size(); ++k)
        ac::fuzz::require(s.offset[k] >= 0 && s.shape[k] >= 0 && s.offset[k] + s.shape[k] <= shape[k], "slice inside the dataset");
    check_plan(slices, shape);
    if (attrs.at("arch_spec").is_object()) (void)ac::model::arch_from_json(attrs.at("arch_spec"), path + ": arch_spec");
  });
}
