// JSON readers/writers of hardware, engine and workload profiles.
#include "search/costmodel/profiles.h"

#include <cmath>
#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "dist/error.h"
#include "dist/file_io.h"

namespace ac::search {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fmt(double d) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", d);
  return b;
}

struct Fields {
  const json& j;
  const std::string& path;
  std::set<std::string> seen;

  [[noreturn]] void fail(const std::string& f, const std::string& what) const { throw InputError(path, f, what); }
  const json& get(const std::string& f) {
    seen.insert(f);
    if (!j.contains(f)) fail(f, "missing");
    return j[f];
  }
  bool has(const std::string& f) {
    seen.insert(f);
    return j.contains(f);
  }
  double number(const std::string& f, bool positive = true) {
    const json& v = get(f);
    if (!v.is_number()) fail(f, "expected a number, got " + v.dump());
    const double d = v.get<double>();
    if (positive ? !(d > 0) : !(d >= 0))
      fail(f, fmt(d) + (positive ? " must be positive" : " must not be negative"));
    return d;
  }
  double number_or(const std::string& f, double def, bool positive = false) { return has(f) ? number(f, positive) : def; }
  int64_t integer(const std::string& f, bool positive = true, int64_t max = INT32_MAX) {
    const json& v = get(f);
    if (!v.is_number_integer()) fail(f, "expected an integer, got " + v.dump());
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(max) : v.get<int64_t>() > max)
      fail(f, v.dump() + " is more than the " + std::to_string(max) + " accepted");
    const int64_t i = v.get<int64_t>();
    if (positive ? i <= 0 : i < 0) fail(f, std::to_string(i) + (positive ? " must be positive" : " must not be negative"));
    return i;
  }
  int64_t integer_or(const std::string& f, int64_t def, bool positive = false, int64_t max = INT32_MAX) {
    return has(f) ? integer(f, positive, max) : def;
  }
  std::string string(const std::string& f) {
    const json& v = get(f);
    if (!v.is_string()) fail(f, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::string string_or(const std::string& f, const std::string& def) { return has(f) ? string(f) : def; }
  bool boolean_or(const std::string& f, bool def) {
    if (!has(f)) return def;
    if (!j[f].is_boolean()) fail(f, "expected true or false");
    return j[f].get<bool>();
  }
  void header(const char* format) {
    if (!j.is_object()) fail("(top level)", "expected a JSON object");
    if (string("format") != format) fail("format", std::string("expected \"") + format + "\"");
    if (integer("version") != 1) fail("version", "only version 1 is supported");
  }
  void no_unknown() const {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!seen.count(it.key())) fail(it.key(), "unknown field");
  }
};

EfficiencyCurve curve(Fields& f, const json& eff, const std::string& name) {
  const std::string base = "efficiency." + name;
  if (!eff.contains(name)) f.fail(base, "missing");
  const json& c = eff[name];
  if (!c.is_object() || !c.contains("max") || !c.contains("half") || !c["max"].is_number() || !c["half"].is_number())
    f.fail(base, "expected {\"max\": <0..1], \"half\": <work at half of max>}");
  EfficiencyCurve e{c["max"].get<double>(), c["half"].get<double>()};
  if (!(e.max > 0 && e.max <= 1.0)) f.fail(base + ".max", fmt(e.max) + " must be in (0, 1]");
  if (!(e.half >= 0)) f.fail(base + ".half", "must not be negative");
  return e;
}

json read_json_file(const std::string& path) {
  const std::string text = read_regular_file(path, "(file)", uint64_t(1) << 26);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    throw InputError(path, "(json)", std::string("not valid JSON: ") + e.what());
  }
}

// An id names <configs_dir>/<kind>/<id>.json; anything with a '/' or ending in .json is a path.
std::string resolve(const std::string& id_or_path, const std::string& configs_dir, const std::string& kind,
                    const std::string& option) {
  const bool is_path = id_or_path.find('/') != std::string::npos ||
                       (id_or_path.size() > 5 && id_or_path.substr(id_or_path.size() - 5) == ".json");
  if (is_path) return id_or_path;
  const fs::path p = fs::path(configs_dir) / kind / (id_or_path + ".json");
  if (fs::exists(p)) return p.string();
  std::string known;
  std::error_code ec;
  std::set<std::string> ids;
  for (const auto& e : fs::directory_iterator(fs::path(configs_dir) / kind, ec))
    if (e.path().extension() == ".json") ids.insert(e.path().stem().string());
  for (const auto& id : ids) known += (known.empty() ? "" : " ") + id;
  throw InputError(option, id_or_path,
                   "unknown " + kind + " id (known in " + (fs::path(configs_dir) / kind).string() + ": " +
                       (known.empty() ? "none" : known) + ")");
}

// The decode_step block's JSON fields (HardwareProfile::DecodeStepCost), in file order.
std::vector<std::pair<const char*, double*>> decode_step_fields(HardwareProfile::DecodeStepCost& c) {
  return {{"gemv_fixed_s", &c.gemv_fixed},   {"gemv_per_byte_s", &c.gemv_per_byte}, {"gemv_per_out_s", &c.gemv_per_out},
          {"attn_fixed_s", &c.attn_fixed},   {"attn_per_kv_s", &c.attn_per_kv},     {"attn_per_q_s", &c.attn_per_q},
          {"mlp_fixed_s", &c.mlp_fixed},     {"mlp_per_ffn_s", &c.mlp_per_ffn},     {"moe_fixed_s", &c.moe_fixed},
          {"moe_per_expert_s", &c.moe_per_expert}, {"mamba_fixed_s", &c.mamba_fixed},
          {"gemv_per_row_out_s", &c.gemv_per_row_out}, {"gemv_per_row_mac_s", &c.gemv_per_row_mac},
          {"model_fixed_s", &c.model_fixed}, {"model_per_layer_s", &c.model_per_layer},
          {"model_per_moe_layer_s", &c.model_per_moe_layer}, {"model_per_mamba_layer_s", &c.model_per_mamba_layer},
          {"model_per_weight_byte_s", &c.model_per_weight_byte},
          {"attn_per_row_s", &c.attn_per_row}, {"attn_per_row_kv_s", &c.attn_per_row_kv},
          {"attn_per_row_q_s", &c.attn_per_row_q}, {"mlp_per_row_s", &c.mlp_per_row},
          {"mlp_per_row_ffn_s", &c.mlp_per_row_ffn}, {"gemv_multirow_fixed_s", &c.gemv_multirow_fixed},
          {"gemv_multirow_per_mac_s", &c.gemv_multirow_per_mac}};
}
// The per-kind terms of the model step, written and read together.
constexpr std::array<const char*, 3> kModelKindFields = {"model_per_moe_layer_s", "model_per_mamba_layer_s",
                                                         "model_per_weight_byte_s"};
bool model_kind_field(const std::string& name) {
  return std::find(kModelKindFields.begin(), kModelKindFields.end(), name) != kModelKindFields.end();
}
// Each further row's rest of the attention and MLP sublayers, fitted together.
constexpr std::array<const char*, 5> kRowRestFields = {"attn_per_row_s", "attn_per_row_kv_s", "attn_per_row_q_s",
                                                       "mlp_per_row_s", "mlp_per_row_ffn_s"};
bool row_rest_field(const std::string& name) {
  return std::find(kRowRestFields.begin(), kRowRestFields.end(), name) != kRowRestFields.end();
}
// What a call of 2 or more rows pays beyond the one-row call's path, fitted together.
constexpr std::array<const char*, 2> kMultirowFields = {"gemv_multirow_fixed_s", "gemv_multirow_per_mac_s"};
bool multirow_field(const std::string& name) {
  return std::find(kMultirowFields.begin(), kMultirowFields.end(), name) != kMultirowFields.end();
}
// How many of `names` the block `x` has; the first it lacks in `missing`.
template <size_t N>
int count_fields(const json& x, const std::array<const char*, N>& names, std::string& missing) {
  int n = 0;
  for (const char* k : names)
    if (x.contains(k)) ++n;
    else if (missing.empty()) missing = k;
  return n;
}
// The per-extra-row terms, absent from profiles calibrated on one-row GEMMs only, and the
// model step's own terms, absent from profiles made before they were measured.
bool optional_decode_field(const std::string& name) {
  return name == "gemv_per_row_out_s" || name == "gemv_per_row_mac_s" || name == "model_fixed_s" ||
         name == "model_per_layer_s" || model_kind_field(name) || row_rest_field(name) || multirow_field(name);
}
// Whether a decode_step field is written: the required ones always, an optional one when measured.
bool decode_field_written(const HardwareProfile::DecodeStepCost& c, const std::string& name) {
  if (name == "model_fixed_s") return c.has_model_fixed;
  if (name == "model_per_layer_s") return c.has_model_per_layer;
  if (model_kind_field(name)) return c.has_model_kinds;
  if (row_rest_field(name)) return c.has_row_rests;
  if (multirow_field(name)) return c.has_multirow;
  return !optional_decode_field(name) || c.batched;
}
// The gemm_line block's JSON fields (HardwareProfile::GemmLine), in file order.
std::vector<std::pair<const char*, double*>> gemm_line_fields(HardwareProfile::GemmLine& c) {
  return {{"fixed_s", &c.fixed}, {"per_weight_byte_s", &c.per_weight_byte}, {"per_flop_s", &c.per_flop}};
}
// The prefill_step block's JSON fields (HardwareProfile::PrefillStepCost), in file order.
std::vector<std::pair<const char*, double*>> prefill_step_fields(HardwareProfile::PrefillStepCost& c) {
  return {{"model_fixed_s", &c.model_fixed}, {"model_per_element_s", &c.model_per_element}};
}

// The activation block's JSON fields (HardwareProfile::ActivationCost), in file order.
std::vector<std::pair<const char*, double*>> activation_fields(HardwareProfile::ActivationCost& c) {
  return {{"gated_element_s", &c.gated_element_s}, {"plain_element_s", &c.plain_element_s}};
}

// A block of measured costs as written: each of `fields` by its name.
json cost_block_json(const std::vector<std::pair<const char*, double*>>& fields) {
  json x = json::object();
  for (const auto& [name, ptr] : fields) x[name] = *ptr;
  return x;
}

// A block of measured costs at `key`: an object whose fields are `fields` (numbers >= 0, each
// required unless `optional` says so) and nothing else.
void read_cost_block(Fields& f, const json& j, const std::string& key, const std::string& what,
                     const std::vector<std::pair<const char*, double*>>& fields,
                     const std::function<bool(const std::string&)>& optional = {}) {
  const json& x = j.at(key);
  if (!x.is_object()) f.fail(key, "expected an object of " + what);
  for (const auto& [name, ptr] : fields) {
    if (!x.contains(name) && optional && optional(name)) continue;
    if (!x.contains(name)) f.fail(key + "." + name, "missing");
    const json& v = x.at(name);
    if (!v.is_number() || !(v.get<double>() >= 0)) f.fail(key + "." + name, "must be a number >= 0");
    *ptr = v.get<double>();
  }
  for (const auto& [k, v] : x.items()) {
    bool known = false;
    for (const auto& [name, ptr] : fields) known = known || k == name;
    if (!known) f.fail(key + "." + k, "unknown field");
  }
}
}  // namespace

HardwareProfile hardware_from_json(const json& j, const std::string& path) {
  Fields f{j, path, {}};
  f.header("autocompress.hardware");
  HardwareProfile h;
  h.id = f.string("id");
  h.name = f.string_or("name", h.id);
  h.source = f.string_or("source", "");
  h.peak_flops = f.number("peak_flops");
  h.memory_bandwidth = f.number("memory_bandwidth");
  h.memory_bytes = f.number("memory_bytes");
  h.usable_fraction = f.number_or("usable_fraction", 1.0, true);
  if (h.usable_fraction > 1) f.fail("usable_fraction", "must be in (0, 1]");
  h.kernel_overhead_s = f.number_or("kernel_overhead_s", 0.0);
  h.gemm_rows_half = f.number_or("gemm_rows_half", 0.0);
  h.fresh_bytes_s = f.number_or("fresh_bytes_s", 0.0);
  h.threads = static_cast<int>(f.number_or("threads", 0.0));
  const json& eff = f.get("efficiency");
  if (!eff.is_object()) f.fail("efficiency", "expected an object with gemm, attention, scan, memory");
  h.gemm = curve(f, eff, "gemm");
  h.attention = curve(f, eff, "attention");
  h.scan = curve(f, eff, "scan");
  h.memory = curve(f, eff, "memory");
  h.elementwise = eff.contains("elementwise") ? curve(f, eff, "elementwise") : h.memory;
  if (f.has("gemm_line")) {
    auto& c = h.gemm_line;
    read_cost_block(f, j, "gemm_line", "measured GEMM line", gemm_line_fields(c));
    if (!(c.per_weight_byte + c.per_flop > 0))
      f.fail("gemm_line.per_flop_s", "the per-byte and per-FLOP terms are both 0");
    c.measured = true;
  }
  if (f.has("mamba")) {
    auto& c = h.mamba;
    read_cost_block(f, j, "mamba", "measured Mamba mixer costs",
                    {{"per_flop_s", &c.per_flop}, {"per_quad_s", &c.per_quad}, {"per_lin_s", &c.per_lin}, {"fixed_s", &c.fixed},
                     {"step_per_state_s", &c.step_per_state}, {"step_per_lin_s", &c.step_per_lin}, {"step_fixed_s", &c.step_fixed}});
    c.measured = true;
  }
  if (f.has("decode_step")) {
    auto& c = h.decode;
    read_cost_block(f, j, "decode_step", "measured decode step costs", decode_step_fields(c), optional_decode_field);
    const json& x = j.at("decode_step");
    if (!(c.gemv_fixed + c.gemv_per_byte + c.gemv_per_out > 0)) f.fail("decode_step.gemv_fixed_s", "the GEMM terms are all 0");
    // A profile fitted on one-row GEMMs only charged every row as a one-row GEMM's outputs.
    c.batched = x.contains("gemv_per_row_out_s") || x.contains("gemv_per_row_mac_s");
    c.has_model_fixed = x.contains("model_fixed_s");
    c.has_model_per_layer = x.contains("model_per_layer_s");
    // The per-kind and per-weight-byte terms are fitted together: all three or none; so are the
    // five further-row terms.
    std::string missing;
    const int kinds = count_fields(x, kModelKindFields, missing);
    if (kinds > 0 && kinds < int(kModelKindFields.size()))
      f.fail("decode_step." + missing, "missing (model_per_moe_layer_s, model_per_mamba_layer_s and model_per_weight_byte_s come together)");
    c.has_model_kinds = kinds == int(kModelKindFields.size());
    missing.clear();
    const int rows = count_fields(x, kRowRestFields, missing);
    if (rows > 0 && rows < int(kRowRestFields.size()))
      f.fail("decode_step." + missing, "missing (attn_per_row_s, attn_per_row_kv_s, attn_per_row_q_s, mlp_per_row_s and "
                                       "mlp_per_row_ffn_s come together)");
    c.has_row_rests = rows == int(kRowRestFields.size());
    missing.clear();
    const int multirow = count_fields(x, kMultirowFields, missing);
    if (multirow == 1)
      f.fail("decode_step." + missing, "missing (gemv_multirow_fixed_s and gemv_multirow_per_mac_s come together)");
    c.has_multirow = multirow == int(kMultirowFields.size());
    if (!c.batched) c.gemv_per_row_out = c.gemv_per_out;
    c.measured = true;
  }
  if (f.has("prefill_step")) {
    read_cost_block(f, j, "prefill_step", "measured whole-model prefill costs", prefill_step_fields(h.prefill));
    h.prefill.measured = true;
  }
  if (f.has("activation"))
    read_cost_block(f, j, "activation", "measured MLP activation costs", activation_fields(h.activation));
  if (f.has("interconnect")) {  // optional, for training plans (search/plan/plan.h)
    const json& x = j.at("interconnect");
    if (!x.is_object()) f.fail("interconnect", "expected an object with intra_node_bandwidth, inter_node_bandwidth");
    auto& ic = h.interconnect;
    for (const auto& [k, v] : x.items()) {
      const std::string name = "interconnect." + k;
      if (k == "source" || k == "comment") {
        if (!v.is_string()) f.fail(name, "expected a string");
        if (k == "source") ic.source = v.get<std::string>();
        continue;
      }
      if (!v.is_number() || !(v.get<double>() > 0)) f.fail(name, "must be a positive number");
      if (k == "intra_node_bandwidth") ic.intra_node_bandwidth = v.get<double>();
      else if (k == "inter_node_bandwidth") ic.inter_node_bandwidth = v.get<double>();
      else if (k == "efficiency") ic.efficiency = v.get<double>();
      else if (k == "gpus_per_node" && v.is_number_integer()) ic.gpus_per_node = v.get<int>();
      else if (k == "gpus_per_node") f.fail(name, "expected an integer");
      else f.fail(name, "unknown field");
    }
    if (!(ic.intra_node_bandwidth > 0)) f.fail("interconnect.intra_node_bandwidth", "missing");
    if (!(ic.inter_node_bandwidth > 0)) f.fail("interconnect.inter_node_bandwidth", "missing");
    if (ic.efficiency > 1) f.fail("interconnect.efficiency", "must be in (0, 1]");
  }
  if (f.has("calibrated_on")) {
    const json& x = j.at("calibrated_on");
    if (!x.is_object()) f.fail("calibrated_on", "expected an object with cpu_model, isa, dtype");
    auto& on = h.calibrated_on;
    for (const auto& [k, v] : x.items()) {
      if (k == "other_cores" || k == "cores") {
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < (k == "cores" ? 0 : -1) || v.get<double>() > 1e6)
          f.fail("calibrated_on." + k, "expected a number of cores");
        if (k == "cores") on.cores = v.get<int>();
        else on.other_cores = v.get<double>();
        continue;
      }
      if (!v.is_string()) f.fail("calibrated_on." + k, "expected a string");
      if (k == "cpu_model") on.cpu_model = v.get<std::string>();
      else if (k == "isa") on.isa = v.get<std::string>();
      else if (k == "dtype") on.dtype = v.get<std::string>();
      else if (k == "kernels") on.kernels = v.get<std::string>();
      else if (k == "when") on.when = v.get<std::string>();
      else f.fail("calibrated_on." + k, "unknown field");
    }
  }
  f.has("comment");
  if (f.has("measurements") && j.at("measurements").is_object() && j.at("measurements").contains("points") &&
      j.at("measurements").at("points").is_array())
    for (const auto& pt : j.at("measurements").at("points"))  // informational: malformed points are skipped
      if (pt.is_object() && pt.value("kind", json()).is_string() && pt.value("shape", json()).is_string() &&
          pt.value("seconds", json()).is_number())
        h.calibration_seconds[pt.at("kind").get<std::string>() + " " + pt.at("shape").get<std::string>()] =
            pt.at("seconds").get<double>();
  f.no_unknown();
  return h;
}

json hardware_to_json(const HardwareProfile& h) {
  auto c = [](const EfficiencyCurve& e) { return json{{"max", e.max}, {"half", e.half}}; };
  json j = {{"format", "autocompress.hardware"},
          {"version", 1},
          {"id", h.id},
          {"name", h.name},
          {"source", h.source},
          {"peak_flops", h.peak_flops},
          {"memory_bandwidth", h.memory_bandwidth},
          {"memory_bytes", h.memory_bytes},
          {"usable_fraction", h.usable_fraction},
          {"kernel_overhead_s", h.kernel_overhead_s},
          {"gemm_rows_half", h.gemm_rows_half},
          {"efficiency", {{"gemm", c(h.gemm)}, {"attention", c(h.attention)}, {"scan", c(h.scan)}, {"memory", c(h.memory)}, {"elementwise", c(h.elementwise)}}}};
  if (h.threads > 0) j["threads"] = h.threads;
  if (h.fresh_bytes_s > 0) j["fresh_bytes_s"] = h.fresh_bytes_s;
  if (h.interconnect.present()) {
    const auto& ic = h.interconnect;
    j["interconnect"] = {{"intra_node_bandwidth", ic.intra_node_bandwidth},
                         {"inter_node_bandwidth", ic.inter_node_bandwidth},
                         {"efficiency", ic.efficiency}};
    if (ic.gpus_per_node > 0) j["interconnect"]["gpus_per_node"] = ic.gpus_per_node;
    if (!ic.source.empty()) j["interconnect"]["source"] = ic.source;
  }
  if (!h.calibrated_on.empty()) {
    const auto& on = h.calibrated_on;
    j["calibrated_on"] = {{"cpu_model", on.cpu_model}, {"isa", on.isa}, {"dtype", on.dtype}};
    if (!on.kernels.empty()) j["calibrated_on"]["kernels"] = on.kernels;
    if (!on.when.empty()) j["calibrated_on"]["when"] = on.when;
    if (on.other_cores >= 0) j["calibrated_on"]["other_cores"] = on.other_cores;
    if (on.cores > 0) j["calibrated_on"]["cores"] = on.cores;
  }
  if (h.mamba.measured)
    j["mamba"] = {{"per_flop_s", h.mamba.per_flop},
                  {"per_quad_s", h.mamba.per_quad},
                  {"per_lin_s", h.mamba.per_lin},
                  {"fixed_s", h.mamba.fixed},
                  {"step_per_state_s", h.mamba.step_per_state},
                  {"step_per_lin_s", h.mamba.step_per_lin},
                  {"step_fixed_s", h.mamba.step_fixed}};
  if (h.gemm_line.measured) {
    auto c = h.gemm_line;
    j["gemm_line"] = cost_block_json(gemm_line_fields(c));
  }
  if (h.decode.measured) {
    auto c = h.decode;
    json x = json::object();
    for (const auto& [name, ptr] : decode_step_fields(c))
      if (decode_field_written(c, name)) x[name] = *ptr;
    j["decode_step"] = x;
  }
  if (h.prefill.measured) {
    auto c = h.prefill;
    j["prefill_step"] = cost_block_json(prefill_step_fields(c));
  }
  if (h.activation.measured()) {
    auto c = h.activation;
    j["activation"] = cost_block_json(activation_fields(c));
  }
  return j;
}

EngineProfile engine_from_json(const json& j, const std::string& path) {
  Fields f{j, path, {}};
  f.header("autocompress.engine");
  EngineProfile e;
  e.id = f.string("id");
  e.name = f.string_or("name", e.id);
  e.memory_policy = f.string("memory_policy");
  if (e.memory_policy != "fraction_of_total" && e.memory_policy != "fraction_of_free")
    f.fail("memory_policy", "\"" + e.memory_policy + "\" is not fraction_of_total or fraction_of_free");
  e.memory_fraction = f.number("memory_fraction");
  if (e.memory_fraction > 1) f.fail("memory_fraction", "must be in (0, 1]");
  e.kv_block_tokens = int(f.integer("kv_block_tokens"));
  e.hybrid_page_rule = f.boolean_or("hybrid_page_rule", false);
  e.max_num_batched_tokens = f.integer("max_num_batched_tokens");
  e.max_num_seqs = f.integer("max_num_seqs");
  e.cuda_graph_bytes = f.number_or("cuda_graph_bytes", 0.0);
  e.non_torch_bytes = f.number_or("non_torch_bytes", 0.0);
  e.step_overhead_s = f.number_or("step_overhead_s", 0.0);
  if (f.has("extra_ops")) {
    const json& x = j.at("extra_ops");
    if (!x.is_object()) f.fail("extra_ops", "expected an object of operator counts");
    auto& o = e.extra_ops;
    const std::pair<const char*, double*> keys[] = {
        {"norm", &o.norm}, {"attention_prefill", &o.attention_prefill}, {"attention_decode", &o.attention_decode},
        {"rope", &o.rope},
        {"mamba_prefill", &o.mamba_prefill}, {"mamba_decode", &o.mamba_decode}, {"mlp", &o.mlp}, {"moe", &o.moe}, {"moe_shared", &o.moe_shared},
        {"moe_expert", &o.moe_expert}, {"model", &o.model}};
    for (const auto& [k, v] : x.items()) {
      double* dst = nullptr;
      for (const auto& [name, ptr] : keys)
        if (k == name) dst = ptr;
      if (!dst) f.fail("extra_ops." + k, "unknown field (known: norm attention_prefill attention_decode rope mamba_prefill "
                                         "mamba_decode mlp moe moe_shared moe_expert model)");
      if (!v.is_number() || v.get<double>() < 0) f.fail("extra_ops." + k, "must be a number >= 0");
      *dst = v.get<double>();
    }
  }
  e.activations = f.string_or("activations", "profile");
  e.split_projections = f.boolean_or("split_projections", false);
  e.elementwise_traffic = f.number_or("elementwise_traffic", 1.0, true);
  if (e.activations != "profile" && e.activations != "eager")
    f.fail("activations", "\"" + e.activations + "\" is not profile or eager");
  if (f.has("heterogeneous")) {
    const json& x = j.at("heterogeneous");
    if (!x.is_object()) f.fail("heterogeneous", "expected {\"format\": ..., \"per_layer\": [axes], \"ffn_multiple\": n}");
    for (const auto& [k, v] : x.items()) {
      if (k == "format" && v.is_string()) e.heterogeneous_format = v.get<std::string>();
      else if (k == "per_layer" && v.is_array()) {
        for (const auto& a : v) {
          const auto& known = engine_per_layer_axes();
          if (!a.is_string() || std::find(known.begin(), known.end(), a.get<std::string>()) == known.end()) {
            std::string names;
            for (const auto& k : known) names += (names.empty() ? "" : " ") + k;
            f.fail("heterogeneous.per_layer", a.dump() + " is not one of " + names);
          }
          e.per_layer_axes.push_back(a.get<std::string>());
        }
      } else if (k == "ffn_multiple") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1) f.fail("heterogeneous.ffn_multiple", "must be an integer >= 1");
        e.per_layer_ffn_multiple = v.get<int64_t>();
      } else if (k != "comment") {
        f.fail("heterogeneous." + k,
               "unknown field or wrong type (format: string, per_layer: array, ffn_multiple: integer, comment)");
      }
    }
  }
  f.has("comment");
  f.no_unknown();
  return e;
}

bool EngineProfile::serves_per_layer(const std::string& axis) const {
  return std::find(per_layer_axes.begin(), per_layer_axes.end(), axis) != per_layer_axes.end();
}

Workload workload_from_json(const json& j, const std::string& path) {
  Fields f{j, path, {}};
  f.header("autocompress.workload");
  Workload w;
  w.id = f.string("id");
  w.name = f.string_or("name", w.id);
  // Bounded: the cost model's work grows with the token counts (1e15 would never finish).
  constexpr int64_t kMaxTokens = int64_t(1) << 27, kMaxConcurrency = int64_t(1) << 20;
  w.prompt_tokens = f.integer("prompt_tokens", true, kMaxTokens);
  w.output_tokens = f.integer("output_tokens", true, kMaxTokens);
  w.context_tokens = f.integer_or("context_tokens", w.prompt_tokens + w.output_tokens, true, kMaxTokens);
  if (w.context_tokens < w.prompt_tokens + w.output_tokens)
    f.fail("context_tokens", std::to_string(w.context_tokens) + " is less than prompt_tokens + output_tokens (" +
                                 std::to_string(w.prompt_tokens + w.output_tokens) + ")");
  w.concurrency = f.integer_or("concurrency", 1, false, kMaxConcurrency);
  w.ttft_limit_s = f.number_or("ttft_limit_s", 0.0);
  w.tpot_limit_s = f.number_or("tpot_limit_s", 0.0);
  f.has("comment");
  f.no_unknown();
  return w;
}

HardwareProfile load_hardware(const std::string& id_or_path, const std::string& configs_dir) {
  const std::string p = resolve(id_or_path, configs_dir, "hardware", "--hardware");
  return hardware_from_json(read_json_file(p), p);
}
EngineProfile load_engine(const std::string& id_or_path, const std::string& configs_dir) {
  const std::string p = resolve(id_or_path, configs_dir, "engines", "--engine");
  return engine_from_json(read_json_file(p), p);
}
Workload load_workload(const std::string& id_or_path, const std::string& configs_dir) {
  const std::string p = resolve(id_or_path, configs_dir, "workloads", "--workload");
  return workload_from_json(read_json_file(p), p);
}

std::string default_configs_dir() {
#ifdef AC_CONFIGS_DIR
  if (fs::is_directory(AC_CONFIGS_DIR)) return AC_CONFIGS_DIR;
#endif
  return "configs";
}

void save_hardware(const HardwareProfile& h, const std::string& path) {
  write_file_atomic(path, hardware_to_json(h).dump(2) + "\n", "hardware profile");
}

}  // namespace ac::search
