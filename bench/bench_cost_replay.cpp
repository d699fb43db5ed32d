// A stored calibration replayed with another statistic (issue 37): the profile's whole-model
// decode rest refitted (search::fit_model_decodes, as calibrate() does last) to its
// `model_decode` points taken as the fastest of their windows (what calibrate keeps, the
// baseline: it must give the stored profile's predictions back) and as the median of their
// windows, and the 24 validation architectures' decode step predicted under each. No timing:
// the same measurements read two ways, so what changes is the statistic alone, not the machine;
// and as the fastest of the first three and six windows (how the reading depends on their number).
// bench/cost_replay.py pairs the output with the validation's samples.
//
//   bench_cost_replay PROFILE.json DTYPE [PROMPT=256] [DECODE_STEPS=16]
//
// Prints one JSON object: per statistic ("stored" = the profile as loaded), each architecture's
// predicted decode step (seconds) and the refitted terms.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "search/costmodel/calibrate.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/profiles.h"
#include "search/costmodel/validate.h"

namespace {

using nlohmann::json;
using namespace ac::search;

// The profile's model_decode points: features and every window's median.
std::vector<CalibrationPoint> model_decode_points(const json& profile) {
  std::vector<CalibrationPoint> out;
  for (const auto& q : profile.at("measurements").at("points"))
    if (q.at("kind") == "model_decode") {
      CalibrationPoint p;
      p.kind = "model_decode", p.shape = q.at("shape");
      p.seconds = q.at("seconds");
      p.features = q.at("features").get<std::vector<double>>();
      p.window_s = q.value("window_s", std::vector<double>{p.seconds});
      out.push_back(p);
    }
  return out;
}

json decode_terms(const HardwareProfile& h) {
  const auto& d = h.decode;
  return {{"model_fixed_s", d.model_fixed}, {"model_per_layer_s", d.model_per_layer},
          {"model_per_moe_layer_s", d.model_per_moe_layer}, {"model_per_mamba_layer_s", d.model_per_mamba_layer},
          {"model_per_weight_byte_s", d.model_per_weight_byte}};
}

json predictions(const HardwareProfile& h, const EngineProfile& engine, const std::string& dtype, int64_t prompt,
                 int64_t steps) {
  json out = json::object();
  for (auto c : validation_architectures()) {
    c.spec.dtype = dtype;
    out[c.name] = predict_prompt(c.spec, h, engine, prompt, steps).tpot_s;
  }
  return {{"decode_s", out}, {"terms", decode_terms(h)}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: bench_cost_replay PROFILE.json DTYPE [PROMPT=256] [DECODE_STEPS=16]\n");
    return 2;
  }
  try {
    const std::string path = argv[1], dtype = argv[2];
    const int64_t prompt = argc > 3 ? std::atoll(argv[3]) : 256, steps = argc > 4 ? std::atoll(argv[4]) : 16;
    std::ifstream f(path);
    if (!f) throw std::runtime_error(path + ": cannot open");
    const json j = json::parse(f);
    const HardwareProfile stored = hardware_from_json(j, path);
    const EngineProfile engine = load_engine(kPrefillEngine, default_configs_dir());
    const std::vector<CalibrationPoint> points = model_decode_points(j);
    json out = {{"profile", path}, {"dtype", dtype}, {"model_decode_points", points.size()},
                {"stored", predictions(stored, engine, dtype, prompt, steps)}};
    // "first3" / "first6": the fastest of the first three / six windows (the first one / two
    // passes' windows in a profile of three a pass): how the fastest's reading depends on how
    // many windows it had.
    for (const std::string stat : {"fastest", "median", "first3", "first6"}) {
      std::vector<CalibrationPoint> pts = points;
      for (auto& p : pts) {
        const size_t k = stat == "first3" ? 3 : stat == "first6" ? 6 : p.window_s.size();
        const auto end = p.window_s.begin() + long(std::min(k, p.window_s.size()));
        p.seconds = stat == "median" ? median(p.window_s) : *std::min_element(p.window_s.begin(), end);
      }
      HardwareProfile h = stored;
      fit_model_decodes(h, pts, engine, dtype);
      out[stat] = predictions(h, engine, dtype, prompt, steps);
    }
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cost_replay: %s\n", e.what());
    return 1;
  }
  return 0;
}
