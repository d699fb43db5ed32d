// Calibration on this machine (quick mode): the fitted profile is a valid hardware profile,
// reproduces its own measurements, and predicts a GEMM size it was not fitted on.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "dist/error.h"
#include "model/kernels_version.h"
#include "model/layers/common.h"
#include "model/layers/selective_recompute.h"
#include "search/costmodel/calibrate.h"
#include "search/costmodel/cost_model.h"
#include "search/costmodel/local_profile.h"
#include "search/costmodel/profiles.h"
#include "search/costmodel/validate.h"
#include "dist/cpu_features.h"
#include "dist/communicator.h"
#include "dist/omp_env.h"
#include "model/layers/mamba2.h"

using namespace ac::search;

namespace {

CalibrationOptions quick_options() {
  CalibrationOptions o;
  o.dtype = ac::dist::choose_dtype("auto").dtype == "bf16" ? "bfloat16" : "float32";
  o.threads = 1;  // the launcher's default: process CPU time (Stopwatch)
  o.quick = true;
  o.min_seconds = 0.02;
  o.memory_bytes = 8e9;
  return o;
}

}  // namespace

TEST(CostCalibrate, QuickCalibrationFitsAndPredicts) {
  // In the dtype `--dtype auto` picks here: bf16 GEMMs are emulated (~80x slower than fp32)
  // on CPUs without AVX512_BF16/AMX, which made this test take minutes there.
  const bool bf16 = ac::dist::choose_dtype("auto").dtype == "bf16";
  const auto dt = bf16 ? torch::kBFloat16 : torch::kFloat32;
  const double eb = bf16 ? 2.0 : 4.0;
  // At one thread, as the launcher calibrates (--threads 1), so the calibration and this test's
  // own timings read process CPU time (Stopwatch): at two threads they read the wall clock, and
  // beside the rest of the suite on two cores an fp32 GEMM (OpenBLAS's own threads) waited for
  // a core: the AVX2-only class's first CI measured its checks 3-80x the predictions.
  const ac::dist::ScopedComputeThreads one_thread(1);
  const CalibrationOptions o = quick_options();
  const CalibrationResult r = calibrate(o);
  const HardwareProfile& h = r.profile;
  EXPECT_EQ(h.id, "cpu-local");
  EXPECT_GT(h.peak_flops, 1e9);           // any CPU does more than 1 GFLOP/s in GEMMs of its auto dtype
  EXPECT_LT(h.peak_flops, 1e14);
  EXPECT_GT(h.memory_bandwidth, 1e8);
  EXPECT_LT(h.memory_bandwidth, 1e13);
  EXPECT_GE(r.points.size(), 12u);
  EXPECT_GT(h.kernel_overhead_s, 0);    // one tiny framework op costs something
  EXPECT_LT(h.kernel_overhead_s, 1e-3); // and far less than a millisecond
  EXPECT_LT(r.mape, 1.0) << r.to_json().dump(1);  // two parameters per kind, on a shared, noisy machine
  // Each group of measurements says what it took, once, in the order it ran; the JSON has them.
  std::vector<std::string> groups;
  const nlohmann::json phases = r.to_json()["measurements"]["phase_s"];
  for (const auto& [group, seconds] : r.phase_s) {
    groups.push_back(group);
    EXPECT_GT(seconds, 0) << group;
    EXPECT_DOUBLE_EQ(phases.at(group).get<double>(), seconds);
  }
  EXPECT_EQ(groups, (std::vector<std::string>{"model windows", "gemms", "attention + scan", "mamba mixers",
                                              "decode sublayer steps", "model prefills",
                                              "copies + elementwise + dispatch"}));
  // The JSON it writes is a loadable profile.
  const HardwareProfile back = hardware_from_json(r.to_json(), "cpu-local.json");
  EXPECT_DOUBLE_EQ(back.peak_flops, h.peak_flops);
  // It records the machine it measured, which matches this machine and not another one.
  const auto& cpu = ac::dist::detect_cpu();
  EXPECT_EQ(back.calibrated_on.cpu_model, cpu.model);
  EXPECT_EQ(back.calibrated_on.isa, cpu.isa());
  EXPECT_EQ(back.calibrated_on.dtype, o.dtype);
  EXPECT_EQ(machine_mismatch(back, cpu, o.dtype), "");
  EXPECT_NE(machine_mismatch(back, cpu, bf16 ? "float32" : "bfloat16").find("calibrated in " + o.dtype), std::string::npos);
  ac::dist::CpuFeatures other = cpu;
  other.model = "Other CPU 9000";
  EXPECT_NE(machine_mismatch(back, other, o.dtype).find("this machine is Other CPU 9000"), std::string::npos);
  other = cpu;
  other.avx512_bf16 = !other.avx512_bf16;  // same name, another ISA (a VM that hides features)
  EXPECT_NE(machine_mismatch(back, other, o.dtype), "");
  // The per-user cache: the profile stored under this machine's key is used as it is (no second
  // calibration), and the key differs by dtype and CPU.
  const std::string cache = ::testing::TempDir() + "/ac_profile_cache_" + std::to_string(::getpid());
  const std::string path = local_profile_path(cache, cpu, o.dtype, o.threads);
  EXPECT_NE(path, local_profile_path(cache, cpu, bf16 ? "float32" : "bfloat16", o.threads));
  EXPECT_NE(path, local_profile_path(cache, other, o.dtype, o.threads));
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << r.to_json().dump();
  bool called = false;
  // The cache's keying only: no spot check, and no busy mark acted on (LocalProfileBusy and
  // LocalProfileSpotCheck below test those).
  LocalProfileOptions trust;
  trust.spot_check = false;
  trust.max_other_cores = 1e9;
  const LocalProfile lp = local_profile(cache, o, [&](const std::string&, const std::string&) { called = true; }, trust);
  EXPECT_FALSE(called);
  EXPECT_FALSE(lp.calibrated);
  EXPECT_EQ(lp.path, path);
  EXPECT_DOUBLE_EQ(lp.profile.peak_flops, h.peak_flops);
  // A profile cached before whole-model prefills were timed is recalibrated, saying why.
  nlohmann::json older = r.to_json();
  older.erase("prefill_step");
  std::ofstream(path) << older.dump();
  std::string why;
  const LocalProfile re = local_profile(cache, o, [&](const std::string&, const std::string& w) { why = w; }, trust);
  EXPECT_TRUE(re.calibrated);
  EXPECT_NE(why.find("no cold model prefill"), std::string::npos) << why;
  EXPECT_TRUE(re.profile.prefill.measured);
  // So is one cached before batched sublayer steps were timed (it would charge each further
  // row the one-row rest again).
  nlohmann::json one_row = r.to_json();
  for (const char* k : {"attn_per_row_s", "attn_per_row_kv_s", "attn_per_row_q_s", "mlp_per_row_s", "mlp_per_row_ffn_s"})
    one_row["decode_step"].erase(k);
  std::ofstream(path) << one_row.dump();
  const LocalProfile re_rows = local_profile(cache, o, [&](const std::string&, const std::string& w) { why = w; }, trust);
  EXPECT_TRUE(re_rows.calibrated);
  EXPECT_NE(why.find("no batched (4- and 8-sequence) attention and MLP decode steps"), std::string::npos) << why;
  EXPECT_TRUE(re_rows.profile.decode.has_row_rests);
  // So is one cached before the GEMM line was fitted (its prefills priced by the roofline).
  nlohmann::json no_line = r.to_json();
  no_line.erase("gemm_line");
  std::ofstream(path) << no_line.dump();
  const LocalProfile re_line =
      local_profile(cache, o, [&](const std::string&, const std::string& w) { why = w; }, trust);
  EXPECT_TRUE(re_line.calibrated);
  EXPECT_NE(why.find("no measured GEMM line"), std::string::npos) << why;
  EXPECT_TRUE(re_line.profile.gemm_line.measured);
  std::filesystem::remove_all(cache);
  // A GEMM shape outside the fitted set is predicted within a factor of 5 (the CI machine is
  // 2 cores shared by several builds: this catches unit and fitting errors, not noise). Timed
  // by the calibration's own clock (process CPU time at one thread): a test running beside
  // this one on the other core does not count.
  const Stopwatch clock = Stopwatch::for_device("cpu");
  auto fastest = [&](int runs, const auto& f) {  // the fastest of `runs` calls of f()
    double best = 1e9;
    for (int i = 0; i < runs; ++i) {
      const double t0 = clock.now();
      f();
      best = std::min(best, clock.now() - t0);
    }
    return best;
  };
  auto expect_within = [](double pred, double meas, double factor) {  // pred / meas in [1/factor, factor]
    EXPECT_GT(pred / meas, 1 / factor) << pred << " vs " << meas;
    EXPECT_LT(pred / meas, factor) << pred << " vs " << meas;
  };
  torch::NoGradGuard ng;
  auto a = torch::randn({256, 1536}, dt), b = torch::randn({1536, 1536}, dt);
  (void)torch::matmul(a, b);
  const double s = fastest(7, [&] { (void)torch::matmul(a, b); });
  const double pred = roofline_seconds(h, "gemm", 2.0 * 256 * 1536 * 1536, eb * (2 * 256 * 1536 + 1536 * 1536));
  expect_within(pred, s, 5.0);
  // The GEMM line is fitted on the GEMMs of more than 16 rows (square and rectangular weights),
  // written and read back, and predicts an expert-sized GEMM it was not fitted on (48 rows of a
  // [192, 320] weight, as the model calls it) within 3x; each of its own points within 2x.
  ASSERT_TRUE(h.gemm_line.measured);
  EXPECT_TRUE(back.gemm_line.measured);
  EXPECT_DOUBLE_EQ(back.gemm_line.per_flop, h.gemm_line.per_flop);
  EXPECT_DOUBLE_EQ(back.gemm_line.fixed, h.gemm_line.fixed);
  int lined = 0;
  for (const CalibrationPoint& p : r.points)
    if (p.kind == "gemm" && p.rows > 16) ++lined, expect_within(p.predicted_s, p.seconds, 2.0);
  EXPECT_EQ(lined, 2 * 2 + 2 * 2);  // quick: 2 square widths at 64 and 512 rows, 2 rectangles at 32 and 128
  auto xe = torch::randn({48, 320}, dt), we = torch::randn({192, 320}, dt);
  (void)ac::model::apply_linear(xe, we);
  const double ge = fastest(9, [&] { (void)ac::model::apply_linear(xe, we); });
  expect_within(h.gemm_line.seconds(2.0 * 48 * 320 * 192, eb * 192 * 320, 1.0), ge, 3.0);
  // The Mamba mixer cost is measured on the model's own mixer, written and read back, and
  // predicts a mixer size it was not fitted on (prefill of 256 tokens, projections on the
  // gemm fit) within a factor of 10: two fresh-clone CI runs in the nineteenth session (ctest -j
  // with the CUDA compile beside it, 2 cores) measured it 4.2x and 5.1x the prediction, quiet it
  // passes within 4x. This guards units and fitting (off by orders of magnitude when broken);
  // how well the cost model predicts is `cost validate`'s figure (docs/benchmarks.md).
  ASSERT_TRUE(h.mamba.measured);
  EXPECT_TRUE(back.mamba.measured);
  EXPECT_DOUBLE_EQ(back.mamba.step_fixed, h.mamba.step_fixed);
  EXPECT_DOUBLE_EQ(back.mamba.per_quad, h.mamba.per_quad);
  ac::model::MambaSpec ms;
  ms.num_heads = 8, ms.head_dim = 48, ms.state_size = 32, ms.n_groups = 2, ms.chunk_size = 64;
  const int64_t hid = 320, T = 256, di = 8 * 48, proj = 2 * di + 2 * 2 * 32 + 8;
  ac::model::Mamba2 mixer(ms, hid, 1e-5, ac::model::TpGroup{ac::dist::make_self_communicator()}, dt, "t");
  auto x = torch::randn({1, T, hid}, dt);
  const double ms_meas = fastest(9, [&] {
    ac::model::MambaCache c;
    (void)mixer->forward(x, &c);
  });
  const double ms_pred =
      mamba_mixer_seconds(h, false, mamba_prefill_features(1, T, 8, 48, 32, 2, 64)) +
      roofline_seconds(h, "gemm", 2.0 * T * hid * proj, eb * (T * hid + hid * proj + T * proj), T) +
      roofline_seconds(h, "gemm", 2.0 * T * di * hid, eb * (T * di + di * hid + T * hid), T);
  expect_within(ms_pred, ms_meas, 10.0);
  // The decode step is measured too (one-row GEMM line and per-sublayer rests), written and
  // read back, and the line predicts a one-row GEMM shape it was not fitted on within 4x.
  ASSERT_TRUE(h.decode.measured);
  EXPECT_TRUE(back.decode.measured);
  EXPECT_DOUBLE_EQ(back.decode.gemv_per_byte, h.decode.gemv_per_byte);
  EXPECT_DOUBLE_EQ(back.decode.attn_fixed, h.decode.attn_fixed);
  EXPECT_TRUE(std::any_of(r.points.begin(), r.points.end(), [](const CalibrationPoint& p) { return p.kind == "attention_decode"; }));
  auto v = torch::randn({1, 1, 1024}, dt), W = torch::randn({640, 1024}, dt);
  const double gv = fastest(9, [&] { (void)ac::model::apply_linear(v, W); });
  const double gv_pred = decode_step_seconds(h, "gemv", {}, {{640, 1024, 1}}, eb);
  expect_within(gv_pred, gv, 4.0);
  // ... and 8 rows (a batched decode step) from its per-row terms, measured on 2-16 rows.
  EXPECT_TRUE(h.decode.batched && back.decode.batched);
  EXPECT_DOUBLE_EQ(back.decode.gemv_per_row_mac, h.decode.gemv_per_row_mac);
  auto v8 = torch::randn({8, 1, 1024}, dt);
  const double gv8 = fastest(9, [&] { (void)ac::model::apply_linear(v8, W); });
  expect_within(decode_step_seconds(h, "gemv", {}, {{640, 1024, 8}}, eb), gv8, 4.0);
  // Attention and MLP sublayers are stepped over 8 sequences too (quick: every size), each
  // further row's rest fitted apart, and each such point predicted within 2x.
  EXPECT_TRUE(h.decode.has_row_rests && back.decode.has_row_rests);
  EXPECT_DOUBLE_EQ(back.decode.mlp_per_row_ffn, h.decode.mlp_per_row_ffn);
  int batched = 0;
  for (const CalibrationPoint& p : r.points)
    if ((p.kind == "attention_decode" || p.kind == "mlp_decode") && p.shape.find(" x8 sequences") != std::string::npos)
      ++batched, expect_within(p.predicted_s, p.seconds, 2.0);
  EXPECT_EQ(batched, 4 + 3);
  // Whole-model prefills are timed and their rest fitted against local-eager's prediction:
  // each model_prefill point's prediction (the rest included) is within 2x of its time.
  ASSERT_TRUE(h.prefill.measured);
  EXPECT_TRUE(back.prefill.measured);
  EXPECT_DOUBLE_EQ(back.prefill.model_per_element, h.prefill.model_per_element);
  int prefills = 0;
  for (const CalibrationPoint& p : r.points)
    if (p.kind == "model_prefill") ++prefills, expect_within(p.predicted_s, p.seconds, 2.0);
  EXPECT_EQ(prefills, 4);  // quick: two sizes, one and two blocks, one prompt length
  // The MLP activation is timed as the model runs it (gated SwiGLU and squared ReLU), written and
  // read back, each point predicted within 4x, and a size it was not fitted on within 4x. Not
  // tighter: one rate per element prices sizes whose rate differs with the cache (on the Intel
  // AMX class SwiGLU 1.3 ns an element at 128 x 768, in L2, and 3-6 ns at 0.8-6 M elements;
  // the quick calibration's two points 0.12 and 8.6 ms in a CI run, fitted 2.7x under the
  // larger); this guards units and the fit, `cost validate` the accuracy.
  ASSERT_GT(h.activation.gated_element_s, 0);
  ASSERT_GT(h.activation.plain_element_s, 0);
  EXPECT_DOUBLE_EQ(back.activation.gated_element_s, h.activation.gated_element_s);
  EXPECT_DOUBLE_EQ(back.activation.plain_element_s, h.activation.plain_element_s);
  int activations = 0;
  for (const CalibrationPoint& p : r.points)
    if (p.kind == "activation") ++activations, expect_within(p.predicted_s, p.seconds, 4.0);
  EXPECT_EQ(activations, 2 * 2);  // quick: two sizes of each kind
  auto gate = torch::randn({384, 1536}, dt), up = torch::randn({384, 1536}, dt);
  const auto swiglu = ac::model::MlpActivation::SwiGLU;
  (void)ac::model::mlp_activation(gate, up, swiglu);
  const double act = fastest(9, [&] { (void)ac::model::mlp_activation(gate, up, swiglu); });
  expect_within(384.0 * 1536 * h.activation.gated_element_s + 4 * h.kernel_overhead_s, act, 4.0);
}

TEST(CostCalibrate, MambaMixerCostFieldsAreChecked) {
  nlohmann::json j = hardware_to_json(load_hardware("b200", AC_SOURCE_DIR "/configs"));
  EXPECT_FALSE(hardware_from_json(j, "b200.json").mamba.measured);  // GPU profiles: the scan curve
  j["mamba"] = {{"per_flop_s", 1e-11}, {"per_quad_s", 1e-9}, {"per_lin_s", 1e-8}, {"fixed_s", 1e-4},
                {"step_per_state_s", 1e-9}, {"step_per_lin_s", 1e-8}, {"step_fixed_s", 1e-4}};
  EXPECT_TRUE(hardware_from_json(j, "x.json").mamba.measured);
  auto bad = j;
  bad["mamba"]["fixed_s"] = -1;
  EXPECT_THROW(hardware_from_json(bad, "x.json"), ac::InputError);
  bad = j;
  bad["mamba"].erase("step_fixed_s");
  EXPECT_THROW(hardware_from_json(bad, "x.json"), ac::InputError);
  bad = j;
  bad["mamba"]["per_byte_s"] = 1e-9;
  EXPECT_THROW(hardware_from_json(bad, "x.json"), ac::InputError);
}

namespace {
// A profile JSON `j` with any of `fields` of `block` negative is refused naming "block.field",
// and without the field refused too; so is the block with an unknown field, or not an object.
void expect_block_checked(const nlohmann::json& j, const std::string& block, const std::vector<std::string>& fields) {
  for (const std::string& field : fields) {
    auto bad = j;
    bad[block][field] = -1;
    try {
      hardware_from_json(bad, "x.json");
      ADD_FAILURE() << block << "." << field;
    } catch (const ac::InputError& e) {
      EXPECT_NE(std::string(e.what()).find(block + "." + field), std::string::npos) << e.what();
    }
    bad = j;
    bad[block].erase(field);
    EXPECT_THROW(hardware_from_json(bad, "x.json"), ac::InputError) << block << "." << field;
  }
  auto bad = j;
  bad[block]["per_layer_s"] = 1e-4;
  EXPECT_THROW(hardware_from_json(bad, "x.json"), ac::InputError) << block << ": unknown field";
  bad[block] = 3;
  EXPECT_THROW(hardware_from_json(bad, "x.json"), ac::InputError) << block << ": not an object";
}
// The b200 profile as JSON (`j`) and read back (`bare`: a GPU profile, which writes none of the
// measured blocks), then with `block` set to `fields` (`h`): read, and written back unchanged.
struct WithBlock {
  nlohmann::json j;
  HardwareProfile bare, h;
};
WithBlock with_block(const std::string& block, const nlohmann::json& fields) {
  WithBlock w;
  w.j = hardware_to_json(load_hardware("b200", AC_SOURCE_DIR "/configs"));
  w.bare = hardware_from_json(w.j, "b200.json");
  EXPECT_FALSE(hardware_to_json(w.bare).contains(block));
  w.j[block] = fields;
  w.h = hardware_from_json(w.j, "x.json");
  EXPECT_EQ(hardware_to_json(w.h)[block], fields);
  return w;
}
}  // namespace

namespace {
// hardware_from_json refuses `profile` with an InputError naming `field`; `accepted` says what
// slipped through otherwise.
void expect_refused_naming(const nlohmann::json& profile, const std::string& field, const char* accepted) {
  try {
    (void)hardware_from_json(profile, "x.json");
    ADD_FAILURE() << accepted;
  } catch (const ac::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(CostCalibrate, DecodeStepCostFieldsAreChecked) {
  nlohmann::json j = hardware_to_json(load_hardware("b200", AC_SOURCE_DIR "/configs"));
  EXPECT_FALSE(hardware_from_json(j, "b200.json").decode.measured);  // GPU profiles: the curves
  j["decode_step"] = {{"gemv_fixed_s", 2e-5},  {"gemv_per_byte_s", 1e-10}, {"gemv_per_out_s", 3e-8},
                      {"attn_fixed_s", 1e-4},  {"attn_per_kv_s", 2e-10},   {"attn_per_q_s", 7e-10},
                      {"mlp_fixed_s", 3e-5},   {"mlp_per_ffn_s", 9e-9},    {"moe_fixed_s", 0},
                      {"moe_per_expert_s", 2e-5}, {"mamba_fixed_s", 2e-5}};
  const HardwareProfile h = hardware_from_json(j, "x.json");
  EXPECT_TRUE(h.decode.measured);
  EXPECT_DOUBLE_EQ(h.decode.attn_per_q, 7e-10);
  EXPECT_EQ(hardware_to_json(h)["decode_step"], j["decode_step"]);
  // Without the per-row terms (a profile fitted on one-row GEMMs) every row costs a one-row
  // GEMM's outputs, as those profiles were used; with them they are read and written back.
  EXPECT_FALSE(h.decode.batched);
  EXPECT_DOUBLE_EQ(h.decode.gemv_per_row_out, 3e-8);
  EXPECT_DOUBLE_EQ(h.decode.gemv_per_row_mac, 0);
  auto rows = j;
  rows["decode_step"]["gemv_per_row_out_s"] = 4e-9;
  rows["decode_step"]["gemv_per_row_mac_s"] = 8e-12;
  const HardwareProfile hr = hardware_from_json(rows, "x.json");
  EXPECT_TRUE(hr.decode.batched);
  EXPECT_DOUBLE_EQ(hr.decode.gemv_per_row_out, 4e-9);
  EXPECT_EQ(hardware_to_json(hr)["decode_step"], rows["decode_step"]);
  // A decode_step field added to `profile`: read, and written back as it was.
  auto with_field = [](const nlohmann::json& profile, const char* field, double value) {
    nlohmann::json out = profile;
    out["decode_step"][field] = value;
    const HardwareProfile read = hardware_from_json(out, "x.json");
    EXPECT_EQ(hardware_to_json(read)["decode_step"], out["decode_step"]) << field;
    return std::make_pair(out, read);
  };
  // The model step's own term: absent (0, has_model_fixed false) or read and written back.
  EXPECT_FALSE(hr.decode.has_model_fixed);
  EXPECT_FALSE(hardware_to_json(hr)["decode_step"].contains("model_fixed_s"));
  auto [stepped, hs] = with_field(rows, "model_fixed_s", 5.7e-4);
  EXPECT_TRUE(hs.decode.has_model_fixed);
  EXPECT_DOUBLE_EQ(hs.decode.model_fixed, 5.7e-4);
  // and it is charged once per decode step, whatever the batch.
  ac::model::ArchSpec tiny;
  tiny.hidden_size = 256, tiny.vocab_size = 4096, tiny.dtype = "bfloat16";
  ac::model::LayerSpec l;
  l.mlp = ac::model::MlpSpec{768, ac::model::MlpActivation::SwiGLU};
  tiny.layers = {l, l};
  Workload w;
  w.id = "w", w.prompt_tokens = 64, w.output_tokens = 8, w.context_tokens = 72;
  EngineProfile eager = load_engine("local-eager", AC_SOURCE_DIR "/configs");
  eager.max_num_seqs = 8;  // as `cost validate` runs its batched regimes (the file's 1 would cap B)
  for (int64_t b : {1, 4}) {
    w.concurrency = b;
    ASSERT_EQ(predict(tiny, hs, eager, w).concurrency, b);
    EXPECT_NEAR(predict(tiny, hs, eager, w).tpot_s - predict(tiny, hr, eager, w).tpot_s, 5.7e-4, 1e-12) << b;
  }
  // The per-sublayer term: absent (0) or read and written back, charged once per sublayer
  // (here two MLPs) and per step, whatever the batch.
  EXPECT_FALSE(hs.decode.has_model_per_layer);
  EXPECT_FALSE(hardware_to_json(hs)["decode_step"].contains("model_per_layer_s"));
  auto [layered, hl] = with_field(stepped, "model_per_layer_s", 3.1e-5);
  EXPECT_TRUE(hl.decode.has_model_per_layer);
  for (int64_t b : {1, 4}) {
    w.concurrency = b;
    EXPECT_NEAR(predict(tiny, hl, eager, w).tpot_s - predict(tiny, hs, eager, w).tpot_s, 2 * 3.1e-5, 1e-12) << b;
  }
  // The MoE and Mamba sublayers' rests and the per-weight-byte term: all three or none (one
  // alone is refused, naming the first missing), read and written back.
  EXPECT_FALSE(hl.decode.has_model_kinds);
  nlohmann::json kinds = layered;
  kinds["decode_step"]["model_per_moe_layer_s"] = 4e-5;
  expect_refused_naming(kinds, "decode_step.model_per_mamba_layer_s",
                        "a per-kind term without the others was accepted");
  kinds["decode_step"]["model_per_mamba_layer_s"] = 6e-5;
  kinds["decode_step"]["model_per_weight_byte_s"] = 2e-11;
  const HardwareProfile hk = hardware_from_json(kinds, "x.json");
  EXPECT_TRUE(hk.decode.has_model_kinds);
  EXPECT_EQ(hardware_to_json(hk)["decode_step"], kinds["decode_step"]);
  // Each weight byte a GEMM reads (two MLPs' gate, up, down and the LM head) costs
  // model_per_weight_byte, once per step whatever the batch.
  auto [nobytes, hn] = with_field(kinds, "model_per_weight_byte_s", 0.0);
  const double bytes = 2.0 * (2 * 3 * 256 * 768 + 4096 * 256);
  for (int64_t b : {1, 4}) {
    w.concurrency = b;
    EXPECT_NEAR(predict(tiny, hk, eager, w).tpot_s - predict(tiny, hn, eager, w).tpot_s, bytes * 2e-11, 1e-12) << b;
  }
  // A MoE sublayer costs model_per_moe_layer and a Mamba one model_per_mamba_layer instead of
  // model_per_layer, whatever the batch.
  ac::model::ArchSpec mixed = tiny;
  ac::model::LayerSpec mamba, moe;
  mamba.mamba = ac::model::MambaSpec{};
  mamba.mamba->num_heads = 8, mamba.mamba->head_dim = 64, mamba.mamba->state_size = 16, mamba.mamba->n_groups = 1;
  moe.moe = ac::model::MoeSpec{};
  moe.moe->num_experts = 8, moe.moe->top_k = 2, moe.moe->expert_ffn = 128;
  mixed.layers = {mamba, moe, moe};
  HardwareProfile flat = hk;
  flat.decode.model_per_moe_layer = flat.decode.model_per_mamba_layer = flat.decode.model_per_layer;
  for (int64_t b : {1, 4}) {
    w.concurrency = b;
    EXPECT_NEAR(predict(mixed, hk, eager, w).tpot_s - predict(mixed, flat, eager, w).tpot_s,
                2 * (4e-5 - 3.1e-5) + (6e-5 - 3.1e-5), 1e-12) << b;
  }
  // Each further row's attention and MLP rest: all five or none (one alone is refused, naming
  // the first missing), read and written back.
  EXPECT_FALSE(hk.decode.has_row_rests);
  nlohmann::json row_rests = kinds;
  row_rests["decode_step"]["attn_per_row_s"] = 0;
  expect_refused_naming(row_rests, "decode_step.attn_per_row_kv_s",
                        "a further-row term without the others was accepted");
  // The one-row rest's variable terms again and no fixed term per row: what a profile without
  // them charges, at every batch.
  row_rests["decode_step"]["attn_per_row_kv_s"] = 2e-10, row_rests["decode_step"]["attn_per_row_q_s"] = 7e-10;
  row_rests["decode_step"]["mlp_per_row_s"] = 0, row_rests["decode_step"]["mlp_per_row_ffn_s"] = 9e-9;
  const HardwareProfile same = hardware_from_json(row_rests, "x.json");
  EXPECT_TRUE(same.decode.has_row_rests);
  EXPECT_EQ(hardware_to_json(same)["decode_step"], row_rests["decode_step"]);
  ac::model::ArchSpec dense = tiny;
  ac::model::LayerSpec block = l;
  block.attention = ac::model::AttentionSpec{4, 2, 64};
  dense.layers = {block, block};
  for (int64_t b : {1, 4, 8}) {
    w.concurrency = b;
    EXPECT_NEAR(predict(dense, same, eager, w).tpot_s, predict(dense, hk, eager, w).tpot_s, 1e-12) << b;
  }
  // Each further row costs its own fixed terms (two layers of attention and MLP, B - 1 rows) and
  // nothing at B = 1; a row's variable terms are its own (0 here: cheaper than charging the
  // one-row ones again).
  const nlohmann::json fixed_rows = with_field(row_rests, "attn_per_row_s", 5e-6).first;
  const HardwareProfile hb = with_field(fixed_rows, "mlp_per_row_s", 2e-6).second;
  HardwareProfile flat_rows = hb;
  flat_rows.decode.attn_per_row_kv = flat_rows.decode.attn_per_row_q = flat_rows.decode.mlp_per_row_ffn = 0;
  for (int64_t b : {1, 4, 8}) {
    w.concurrency = b;
    EXPECT_NEAR(predict(dense, hb, eager, w).tpot_s - predict(dense, same, eager, w).tpot_s, 2.0 * (b - 1) * (5e-6 + 2e-6),
                1e-12) << b;
    if (b == 1) {
      EXPECT_NEAR(predict(dense, flat_rows, eager, w).tpot_s, predict(dense, hb, eager, w).tpot_s, 1e-12);
    } else {
      EXPECT_LT(predict(dense, flat_rows, eager, w).tpot_s, predict(dense, hb, eager, w).tpot_s - 1e-6) << b;
    }
  }
  // What a call of 2 or more rows pays beyond the one-row call's path: both terms or none (one
  // alone is refused, naming the other), read and written back; nothing at B = 1; at B = 4 and 8
  // the fixed term per GEMM call (two MLPs' gate, up and down, and the LM head) and the per-MAC
  // term once per weight element; at B = 16 that one twice (a pass over the weight per 8 rows).
  EXPECT_FALSE(same.decode.has_multirow);
  nlohmann::json multirow = row_rests;
  multirow["decode_step"]["gemv_multirow_per_mac_s"] = 3e-11;
  expect_refused_naming(multirow, "decode_step.gemv_multirow_fixed_s",
                        "gemv_multirow_per_mac_s without gemv_multirow_fixed_s was accepted");
  const HardwareProfile hm = with_field(multirow, "gemv_multirow_fixed_s", 4e-6).second;
  EXPECT_TRUE(hm.decode.has_multirow);
  const double macs = 2 * 3 * 256 * 768 + 4096 * 256;
  eager.max_num_seqs = 16;
  for (int64_t b : {1, 4, 8, 16}) {
    w.concurrency = b;
    const double want = b == 1 ? 0.0 : 7 * 4e-6 + (b == 16 ? 2 : 1) * macs * 3e-11;
    EXPECT_NEAR(predict(tiny, hm, eager, w).tpot_s - predict(tiny, same, eager, w).tpot_s, want, 1e-12) << b;
  }
  eager.max_num_seqs = 8;
  multirow["decode_step"]["gemv_multirow_fixed_s"] = -1;
  EXPECT_THROW(hardware_from_json(multirow, "x.json"), ac::InputError);
  layered["decode_step"]["model_per_layer_s"] = -1;
  EXPECT_THROW(hardware_from_json(layered, "x.json"), ac::InputError);
  stepped["decode_step"]["model_fixed_s"] = -1;
  EXPECT_THROW(hardware_from_json(stepped, "x.json"), ac::InputError);
  rows["decode_step"]["gemv_per_row_mac_s"] = -1;
  EXPECT_THROW(hardware_from_json(rows, "x.json"), ac::InputError);
  expect_block_checked(j, "decode_step", {"mlp_fixed_s", "gemv_per_out_s"});
}

TEST(CostCalibrate, PrefillStepCostFieldsAreChecked) {
  const WithBlock b = with_block("prefill_step", {{"model_fixed_s", 2e-4}, {"model_per_element_s", 6e-9}});
  const nlohmann::json& j = b.j;
  const HardwareProfile &bare = b.bare, &h = b.h;
  EXPECT_FALSE(bare.prefill.measured);  // GPU profiles: nothing charged
  EXPECT_TRUE(h.prefill.measured);
  EXPECT_DOUBLE_EQ(h.prefill.model_per_element, 6e-9);
  // Charged per prefill chunk of s tokens: model_fixed + s h model_per_element, whatever the
  // layers; the decode step is unchanged.
  ac::model::ArchSpec spec;
  spec.hidden_size = 256, spec.vocab_size = 4096, spec.dtype = "bfloat16";
  ac::model::LayerSpec l;
  l.attention = ac::model::AttentionSpec{4, 2, 64};
  l.mlp = ac::model::MlpSpec{768, ac::model::MlpActivation::SwiGLU};
  ac::model::LayerSpec skipped = l;
  skipped.mlp.reset();
  spec.layers = {l, skipped};
  Workload w;
  w.id = "w", w.prompt_tokens = 96, w.output_tokens = 8, w.context_tokens = 104, w.concurrency = 1;
  EngineProfile eager = load_engine("local-eager", AC_SOURCE_DIR "/configs");
  eager.max_num_seqs = 1;
  for (int64_t chunk : {96, 32}) {  // one chunk; three chunks of 32
    eager.max_num_batched_tokens = chunk;
    const double chunks = 96.0 / double(chunk), elems = 96.0 * 256;
    EXPECT_NEAR(predict(spec, h, eager, w).ttft_s - predict(spec, bare, eager, w).ttft_s,
                chunks * 2e-4 + elems * 6e-9, 1e-12) << chunk;
    EXPECT_DOUBLE_EQ(predict(spec, h, eager, w).tpot_s, predict(spec, bare, eager, w).tpot_s);
  }
  expect_block_checked(j, "prefill_step", {"model_fixed_s", "model_per_element_s"});
}

TEST(CostCalibrate, ActivationCostFieldsAreChecked) {
  const WithBlock b = with_block("activation", {{"gated_element_s", 3e-9}, {"plain_element_s", 1e-9}});
  const HardwareProfile &bare = b.bare, &h = b.h;
  EXPECT_FALSE(bare.activation.measured());  // GPU profiles: fused into the GEMMs, nothing charged
  EXPECT_TRUE(h.activation.measured());
  // Charged per element of each MLP's and expert's [tokens x ffn] intermediate, at the gated rate
  // for a SwiGLU MLP and the plain one for squared ReLU (a MoE's shared expert and each token's
  // top_k routed experts): 96 tokens of a prefill, one of a decode step.
  ac::model::ArchSpec spec;
  spec.hidden_size = 256, spec.vocab_size = 4096, spec.dtype = "bfloat16";
  ac::model::LayerSpec swiglu, relu2, moe;
  swiglu.mlp = ac::model::MlpSpec{768, ac::model::MlpActivation::SwiGLU};
  relu2.mlp = ac::model::MlpSpec{512, ac::model::MlpActivation::ReLU2};
  moe.moe = ac::model::MoeSpec{};
  moe.moe->num_experts = 8, moe.moe->top_k = 2, moe.moe->expert_ffn = 128, moe.moe->shared_ffn = 384;
  moe.moe->activation = ac::model::MlpActivation::ReLU2;
  spec.layers = {swiglu, relu2, moe};
  Workload w;
  w.id = "w", w.prompt_tokens = 96, w.output_tokens = 8, w.context_tokens = 104, w.concurrency = 1;
  EngineProfile eager = load_engine("local-eager", AC_SOURCE_DIR "/configs");
  eager.max_num_seqs = 1;
  const double per_token = 768 * 3e-9 + (512 + 384 + 2 * 128) * 1e-9;
  EXPECT_NEAR(predict(spec, h, eager, w).ttft_s - predict(spec, bare, eager, w).ttft_s, 96 * per_token, 1e-12);
  EXPECT_NEAR(predict(spec, h, eager, w).tpot_s - predict(spec, bare, eager, w).tpot_s, per_token, 1e-12);
  expect_block_checked(b.j, "activation", {"gated_element_s", "plain_element_s"});
}

TEST(CostCalibrate, GemmLineFieldsAreChecked) {
  const WithBlock b = with_block("gemm_line", {{"fixed_s", 2e-5}, {"per_weight_byte_s", 1e-10}, {"per_flop_s", 5e-12}});
  const nlohmann::json& j = b.j;
  const HardwareProfile &bare = b.bare, &h = b.h;
  EXPECT_FALSE(bare.gemm_line.measured);  // GPU profiles: the gemm curve
  ASSERT_TRUE(h.gemm_line.measured);
  EXPECT_DOUBLE_EQ(h.gemm_line.per_weight_byte, 1e-10);
  // Every GEMM call of a prefill pays the fixed cost once: a SwiGLU MLP layer three (gate, up,
  // down: local-eager splits projections), a MoE layer its router and two matrices (ReLU2) of
  // every expert its tokens touch, and the prefill's LM head (the last token) one. The FLOPs and
  // the weights' bytes are charged at their rates.
  ac::model::ArchSpec spec;
  spec.hidden_size = 256, spec.vocab_size = 4096, spec.dtype = "bfloat16";
  ac::model::LayerSpec mlp, moe;
  mlp.mlp = ac::model::MlpSpec{768, ac::model::MlpActivation::SwiGLU};
  ac::model::MoeSpec e;
  e.num_experts = 8, e.top_k = 2, e.expert_ffn = 128, e.shared_ffn = 0;
  e.router = ac::model::RouterKind::SigmoidBias, e.activation = ac::model::MlpActivation::ReLU2;
  moe.moe = e;
  spec.layers = {mlp, moe};
  Workload w;
  w.id = "w", w.prompt_tokens = 4, w.output_tokens = 8, w.context_tokens = 12, w.concurrency = 1;
  EngineProfile eager = load_engine("local-eager", AC_SOURCE_DIR "/configs");
  eager.max_num_seqs = 1;
  auto ttft = [&](double fixed, double per_byte, double per_flop) {
    HardwareProfile x = h;
    x.gemm_line = {true, fixed, per_byte, per_flop};
    return predict(spec, x, eager, w).ttft_s;
  };
  const double base = ttft(2e-5, 1e-10, 5e-12), N = 4, touched = 8 * (1 - std::pow(1 - 2.0 / 8, N));
  EXPECT_NEAR(ttft(3e-5, 1e-10, 5e-12) - base, 1e-5 * (3 + 1 + 2 * touched + 1), 1e-12);
  const double weights = 3 * 256 * 768 + 256 * 8 + touched * 2 * 256 * 128 + 256 * 4096.0;
  EXPECT_NEAR(ttft(2e-5, 2e-10, 5e-12) - base, 1e-10 * 2 * weights, 1e-12);  // bf16: 2 bytes per weight
  const double flops = 2 * N * (3 * 256 * 768 + 256 * 8 + 2 * 2 * 256 * 128) + 2 * 256 * 4096.0;
  EXPECT_NEAR(ttft(2e-5, 1e-10, 6e-12) - base, 1e-12 * flops, 1e-12);
  // Refused: a term missing, negative or unknown (named), and a line with neither rate.
  expect_block_checked(j, "gemm_line", {"fixed_s", "per_weight_byte_s", "per_flop_s"});
  auto flat = j;
  flat["gemm_line"]["per_weight_byte_s"] = 0, flat["gemm_line"]["per_flop_s"] = 0;
  EXPECT_THROW(hardware_from_json(flat, "x.json"), ac::InputError);
}

// `cost validate`'s figure at the calibration's speed: a machine that runs 1.5x slower in one
// sweep and 2x faster in another (the AVX2-only VM of the thirtieth session swung 0.5-2.8x) gives
// a model that is right at its calibration's speed zero error by it, while the fastest sweep
// (the raw figure) is off by 2x. Each sweep's ratio is the geometric mean of the probes around it.
TEST(CostCalibrate, SpeedNormalizedTimeUndoesTheMachinesDrift) {
  auto probes = [](double decode_ratio, double prefill_ratio) {
    return std::vector<SpeedProbe>{{"gemm 16x1024x1024", 1e-3, 5e-3},  // another kind: ignored
                                   {"model_decode h256 ffn 768 vocab 4096", 1e-3, decode_ratio * 1e-3},
                                   {"model_prefill 1x(h256 ffn 768) vocab 4096 prompt 128", 2e-3, prefill_ratio * 2e-3}};
  };
  // Probes before sweep 0, between the sweeps and after sweep 2.
  const std::vector<std::vector<SpeedProbe>> by_sweep = {probes(1.5, 1), probes(1.5, 1), probes(0.5, 1), probes(0.5, 1)};
  const std::vector<double> decode = sweep_speed(by_sweep, "model_decode");
  ASSERT_EQ(decode.size(), 3u);
  EXPECT_NEAR(decode[0], 1.5, 1e-12);
  EXPECT_NEAR(decode[1], std::sqrt(1.5 * 0.5), 1e-12);
  EXPECT_NEAR(decode[2], 0.5, 1e-12);
  EXPECT_EQ(sweep_speed(by_sweep, "model_prefill"), std::vector<double>(3, 1.0));
  EXPECT_TRUE(sweep_speed(by_sweep, "attention_decode").empty());  // no such probe
  EXPECT_TRUE(sweep_speed({probes(1, 1)}, "model_decode").empty());  // one probe: no sweep between two
  // A step the model prices at 4 ms, timed at the machine's speed of each sweep.
  const double predicted = 4e-3;
  std::map<int, double> medians;
  for (int k = 0; k < 3; ++k) medians[k] = predicted * decode[size_t(k)];
  EXPECT_NEAR(speed_normalized_time(medians, decode), predicted, 1e-12);
  EXPECT_NEAR(std::min({medians[0], medians[1], medians[2]}) / predicted, 0.5, 1e-12);  // the fastest sweep
  // Sweeps without a ratio are skipped; none left is 0.
  EXPECT_NEAR(speed_normalized_time({{0, medians[0]}, {7, 1.0}}, decode), predicted, 1e-12);
  EXPECT_EQ(speed_normalized_time(medians, {}), 0.0);
}

// Whether the rows moved with the speed probes, on two real validations of the AVX2-only VM
// (docs/data/cost_pairs/2026-12-07: measured / predicted per sweep of the base rows, TTFT at 256
// and TPOT at B=1, beside each sweep's probe ratio). On the drifting day the division removed
// most of the rows' sweep-to-sweep spread; on the steady day (probes moving 73%) it added to it,
// and there the raw figure was the better one (6.5% against 10.0%).
TEST(CostCalibrate, SpeedTrackingSaysWhetherTheRowsMovedWithTheProbes) {
  using Phase = std::pair<std::vector<double>, std::vector<double>>;
  const std::vector<Phase> drifting = {
      {{1.319, 1.463, 1.113, 0.996, 0.829}, {1.225, 1.352, 1.286, 0.934, 0.709}},
      {{1.415, 1.588, 1.180, 0.898, 0.693}, {1.355, 1.496, 1.335, 0.882, 0.594}}};
  const std::vector<Phase> steady = {
      {{1.262, 1.351, 1.281, 1.117, 1.296}, {1.307, 1.274, 1.055, 1.095, 1.114}},
      {{1.245, 1.412, 1.323, 1.205, 1.352}, {1.352, 1.343, 1.129, 1.156, 1.127}}};
  EXPECT_LT(speed_tracking(drifting), 0.5);
  EXPECT_GT(speed_tracking(steady), 1.0);
  // Rows that are the probes times a constant: nothing left; rows that held still while the
  // probes moved: the division is all the spread.
  const std::vector<double> speed = {1.0, 1.5, 0.8, 1.2};
  std::vector<double> follow;
  for (double v : speed) follow.push_back(1.1 * v);
  EXPECT_NEAR(speed_tracking({{follow, speed}}), 0.0, 1e-12);
  EXPECT_GT(speed_tracking({{{1.10, 1.11, 1.09, 1.10}, speed}}), 10.0);
  // Undefined: rows without spread, fewer than three sweeps, mismatched lengths, a zero, no phase.
  EXPECT_EQ(speed_tracking({{std::vector<double>(4, 1.1), speed}}), -1);
  EXPECT_EQ(speed_tracking({{{1.2, 1.0}, {1.0, 1.1}}}), -1);
  EXPECT_EQ(speed_tracking({{follow, {1.0, 1.5, 0.8}}}), -1);
  EXPECT_EQ(speed_tracking({{{1.2, 0.0, 1.1}, {1.0, 1.5, 0.8}}}), -1);
  EXPECT_EQ(speed_tracking({}), -1);
}

// Which figure `cost validate` says to read, on the three stored validations where the rows
// moved with the probes (speed_tracking <= 0.5 in 3 of 83, `bench/cost_pairs_summary.py`): the
// AVX2 VM's drifting day, whose rows kept sweeps at 0.74x / 0.62x the calibration's time (raw
// 35.3%, at the calibration's speed ~8%); and two Zen 4 validations whose kept sweeps ran near
// the calibration's speed (raw 7.8% and 8.7%; at the calibration's speed 15.1% and 8.7%).
TEST(CostCalibrate, SpeedAdviceNeedsTrackingRowsAndKeptSweepsOffSpeed) {
  auto advice = [](double tracking, double kept_prefill, double kept_decode) {
    ValidationResult r;
    r.speed_tracking = tracking, r.kept_speed_prefill = kept_prefill, r.kept_speed_decode = kept_decode;
    return r.speed_advice();
  };
  const std::string read = "read this figure", raw = "the raw figure stands";
  EXPECT_NE(advice(0.37, 0.74, 0.62).find(read), std::string::npos);       // AVX2, drifting
  EXPECT_NE(advice(0.44, 0.98, 1.27).find(raw), std::string::npos);        // Zen 4 rows-final pair 1
  EXPECT_NE(advice(0.43, 1.04, 1.23).find(raw), std::string::npos);        // Zen 4 ab-rows pair 3
  EXPECT_NE(advice(1.48, 1.11, 1.26).find(raw), std::string::npos);        // AVX2 steady, probes moved 73%
  EXPECT_NE(advice(1.48, 0.60, 0.60).find("did not move"), std::string::npos);  // off speed, not followed
  EXPECT_EQ(advice(-1, 0.60, 0.60), "");  // fewer than three sweeps
  EXPECT_EQ(advice(0.3, 0, 0), "");       // no speed reference
}

TEST(CostCalibrate, FastestPassKeepsEachPointsFastestTime) {
  auto pt = [](const char* kind, const char* shape, double s) {
    CalibrationPoint p;
    p.kind = kind, p.shape = shape, p.seconds = s;
    return p;
  };
  // A slow spell in pass 0 for the first point, in pass 1 for the second: neither decides.
  const std::vector<std::vector<CalibrationPoint>> passes = {
      {pt("gemm", "1 x 512 -> 512", 3e-4), pt("gemv_decode", "h256", 1e-4)},
      {pt("gemm", "1 x 512 -> 512", 2e-4), pt("gemv_decode", "h256", 2e-4)},
      {pt("gemm", "1 x 512 -> 512", 2.5e-4), pt("gemv_decode", "h256", 1.1e-4)}};
  const auto out = fastest_pass(passes);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_DOUBLE_EQ(out[0].seconds, 2e-4);
  EXPECT_DOUBLE_EQ(out[1].seconds, 1e-4);
  EXPECT_EQ(out[1].kind, "gemv_decode");
  EXPECT_EQ(fastest_pass({passes[1]})[0].seconds, 2e-4);  // one pass: as measured
  // A windowed point (model_decode) keeps every pass's window medians, in pass order.
  auto windowed = passes;
  windowed[0][1].window_s = {1e-4, 1.3e-4};
  windowed[1][1].window_s = {2e-4};
  windowed[2][1].window_s = {1.1e-4, 1.2e-4};
  EXPECT_EQ(fastest_pass(windowed)[1].window_s, (std::vector<double>{1e-4, 1.3e-4, 2e-4, 1.1e-4, 1.2e-4}));
  EXPECT_TRUE(fastest_pass(windowed)[0].window_s.empty());
  // Passes that measured other points are refused, naming the point.
  auto bad = passes;
  bad[2][1].shape = "h384";
  try {
    (void)fastest_pass(bad);
    FAIL() << "misaligned passes accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("h384"), std::string::npos) << e.what();
  }
  bad = passes;
  bad[1].pop_back();
  EXPECT_THROW((void)fastest_pass(bad), std::invalid_argument);
}

TEST(CostCalibrate, BadOptions) {
  CalibrationOptions o;
  o.memory_bytes = 8e9;
  o.device = "tpu";
  EXPECT_THROW(calibrate(o), ac::InputError);
  o.device = "cpu";
  o.memory_bytes = 0;
  EXPECT_THROW(calibrate(o), ac::InputError);
}

namespace {

// A profile JSON whose GEMM measurements are `factor` times the calibrated ones.
nlohmann::json with_gemm_times_scaled(nlohmann::json j, double factor) {
  for (auto& p : j["measurements"]["points"])
    if (p["kind"] == "gemm") p["seconds"] = p["seconds"].get<double>() * factor;
  return j;
}

std::string write_cached(const std::string& cache, const CalibrationOptions& o, const nlohmann::json& j) {
  const std::string path = local_profile_path(cache, ac::dist::detect_cpu(), o.dtype, o.threads);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << j.dump();
  return path;
}

// The decode steps a calibration's profile, loaded from its JSON, predicts for the models of its
// whole-model points; with `factor`, after refitting its decode rest (fit_model_decodes, as
// bench_cost_replay refits stored profiles) to the JSON's model_decode points (kind, features,
// seconds) with each time scaled by it.
std::vector<double> model_decode_predictions(const CalibrationResult& r, const std::string& dtype,
                                             std::optional<double> factor) {
  const nlohmann::json j = r.to_json();
  HardwareProfile h = hardware_from_json(j, "profile.json");
  std::vector<CalibrationPoint> steps;
  for (const auto& q : j["measurements"]["points"])
    if (q["kind"] == "model_decode") {
      CalibrationPoint p;
      p.kind = "model_decode", p.seconds = factor.value_or(1) * q["seconds"].get<double>();
      p.features = q["features"].get<std::vector<double>>();
      steps.push_back(p);
    }
  const EngineProfile eager = load_engine(kPrefillEngine, AC_SOURCE_DIR "/configs");
  if (factor) fit_model_decodes(h, steps, eager, dtype);
  std::vector<double> out;
  for (const auto& p : steps)
    out.push_back(predict_prompt(model_decode_spec(p.features, dtype), h, eager, kModelDecodePast, 1).tpot_s);
  return out;
}

}  // namespace

// An f32 calibration prices its whole-model points in f32: each model_decode point's model, as a
// float32 ArchSpec, is the prediction the profile reports and is within 1.35x of its time. The
// fits once priced those models with bf16's 2-byte weights while they ran in f32, so the per-byte
// rate came out ~2x and every f32 decode was predicted ~1.5x its time (`cost validate --dtype
// float32`: decode +53%; docs/costmodel.md "fp32 profiles"). Cheap in f32 on every CPU class.
TEST(CostCalibrate, Float32CalibrationPricesItsModelsInFloat32) {
  CalibrationOptions o = quick_options();
  o.dtype = "float32";
  const CalibrationResult r = calibrate_recorded(o);
  const EngineProfile eager = load_engine(kPrefillEngine, AC_SOURCE_DIR "/configs");
  // The points' predictions within 1.35x of their times on a quiet machine, as a geometric mean:
  // the mispricing was systematic (every f32 decode ~1.5x), while the speed of a VM whose host
  // takes cycles moves between the windows that time the sublayers and the models (the AVX2-only
  // class: one quiet run in six put two of eight points at 1.41 and 1.47x, the rest below). Each
  // point within 2x. A calibration beside other work (CI compiles the CUDA build beside the
  // suite) times the pooled sublayers slower than the whole models: one put Mamba models at
  // 1.64-1.91x. There, as for a busy profile (busy_warning), only a loose bound; the equality
  // with an fp32 ArchSpec checks the dtype either way.
  const bool busy = r.profile.calibrated_on.other_cores > 0.5;
  const double bound = busy ? 2.5 : 1.35, point_bound = busy ? 2.5 : 2.0;
  int points = 0;
  double log_over = 0;
  std::string all;
  for (const CalibrationPoint& p : r.points) {
    if (p.kind != "model_decode") continue;
    ++points;
    const ac::model::ArchSpec spec = model_decode_spec(p.features, o.dtype);
    ASSERT_EQ(spec.dtype, "float32");
    const double pred = predict_prompt(spec, r.profile, eager, kModelDecodePast, 1).tpot_s;
    EXPECT_NEAR(pred, p.predicted_s, 1e-9 * p.predicted_s) << p.shape;
    const std::string why = p.shape + ": " + std::to_string(pred) + " s predicted, " + std::to_string(p.seconds) +
                            " s measured, other processes used " + std::to_string(r.profile.calibrated_on.other_cores) +
                            " cores";
    EXPECT_LT(pred / p.seconds, point_bound) << why;
    EXPECT_GT(pred / p.seconds, 1 / point_bound) << why;
    log_over += std::log(pred / p.seconds);
    all += "\n  " + why;
  }
  EXPECT_GE(points, 4);  // quick: dense, MoE and Mamba models of one and two blocks
  const double mean_over = std::exp(log_over / std::max(points, 1));
  EXPECT_LT(mean_over, bound) << all;
  EXPECT_GT(mean_over, 1 / bound) << all;
  std::cout << "predicted / measured, geometric mean " << mean_over << all << "\n";
  // The stored points refit the stored profile's decode rest, and points 1.5x slower than its
  // predictions a rest that prices their models slower on average (which terms take it varies:
  // a deeper model's prediction may not move when the fixed term takes it all). Slower than the
  // predictions, not than the times: the rest is fitted non-negative over the sublayers' sum,
  // and a busy calibration's sublayers can exceed a whole model's time (2.7-3.6x in the
  // AVX2-only class's first CI), when 1.5x the times leaves every term at zero.
  const std::vector<double> stored = model_decode_predictions(r, o.dtype, std::nullopt);
  const std::vector<double> same = model_decode_predictions(r, o.dtype, 1.0);
  double over = 1;  // the largest prediction / time
  for (const CalibrationPoint& p : r.points)
    if (p.kind == "model_decode") over = std::max(over, p.predicted_s / p.seconds);
  const std::vector<double> slower = model_decode_predictions(r, o.dtype, 1.5 * over);
  double log_ratio = 0;
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_NEAR(same[i], stored[i], 1e-9 * stored[i]);
    log_ratio += std::log(slower[i] / stored[i]) / double(stored.size());
  }
  EXPECT_GT(std::exp(log_ratio), 1.2);
  // The 2-16-row call's own terms are fitted, and a profile cached before them is recalibrated.
  EXPECT_TRUE(r.profile.decode.has_multirow);
  nlohmann::json older = r.to_json();
  older["decode_step"].erase("gemv_multirow_fixed_s"), older["decode_step"].erase("gemv_multirow_per_mac_s");
  const std::string cache = ::testing::TempDir() + "/ac_profile_multirow_" + std::to_string(::getpid());
  write_cached(cache, o, older);
  LocalProfileOptions trust;
  trust.spot_check = false;
  trust.max_other_cores = 1e9;  // the load is not what this test is about
  std::string why;
  const LocalProfile re = local_profile(cache, o, [&](const std::string&, const std::string& w) { why = w; }, trust);
  EXPECT_TRUE(re.calibrated);
  EXPECT_NE(why.find("no cost of a 2-16-row GEMM call beyond the one-row call's"), std::string::npos) << why;
  EXPECT_TRUE(re.profile.decode.has_multirow);
  std::filesystem::remove_all(cache);
}

// A calibration records the kernels' version it timed; a profile of other kernels does not
// describe this build (it is recalibrated, as one of another CPU is).
TEST(CostCalibrate, ProfileRecordsTheKernelsItTimed) {
  const CalibrationOptions o = quick_options();
  const CalibrationResult r = calibrate_recorded(o);
  const auto& on = r.profile.calibrated_on;
  EXPECT_EQ(on.kernels, ac::model::kernels_version());
  EXPECT_NE(std::string(ac::model::kernels_version()), "unknown");  // CMake hashed the sources
  EXPECT_FALSE(on.when.empty());
  EXPECT_GE(on.other_cores, 0);
  EXPECT_GE(on.cores, 1);
  nlohmann::json j = r.to_json();
  const HardwareProfile back = hardware_from_json(j, "p.json");  // the new fields round-trip
  EXPECT_EQ(back.calibrated_on.kernels, on.kernels);
  EXPECT_DOUBLE_EQ(back.calibrated_on.other_cores, on.other_cores);
  EXPECT_EQ(machine_mismatch(back, ac::dist::detect_cpu(), o.dtype), "");
  j["calibrated_on"]["kernels"] = "0123456789ab";
  EXPECT_NE(machine_mismatch(hardware_from_json(j, "p.json"), ac::dist::detect_cpu(), o.dtype).find("kernels 0123456789ab"),
            std::string::npos);
}

// The spot check (default tolerance, 35%): a cached profile whose GEMM times are twice what
// this machine takes now (made for a machine half as fast, or under load) is recalibrated, as
// is one with half the times (a faster machine's); the profile as calibrated and one 10% off
// are kept. Each use is checked anew here (`spot_check_once_per_process` off).
//
// Every case compares a calibration with a re-timing moments later, so on a shared machine a
// load that comes or goes between the two decides it by chance (one CI run, with the CUDA
// compile beside the suite, failed so). Each case gets up to three tries, each from a fresh
// calibration; a spot check that is really wrong fails all three. The first try of every case
// starts from one shared calibration (a quick calibration is 10-20 s on the AVX2-only class).
TEST(CostCalibrate, LocalProfileSpotCheck) {
  const CalibrationOptions o = quick_options();
  const nlohmann::json shared = calibrate_recorded(o).to_json();
  const auto calibration = [&](int t) { return t == 0 ? shared : calibrate_recorded(o).to_json(); };
  const std::string cache = ::testing::TempDir() + "/ac_spot_" + std::to_string(::getpid());
  LocalProfileOptions trust;
  trust.max_other_cores = 1e9;  // the load is not what this test is about
  trust.spot_check_once_per_process = false;
  ASSERT_DOUBLE_EQ(trust.spot_tolerance, 0.35);
  constexpr int kTries = 3;
  for (double kept_scale : {1.0, 1.1}) {
    std::string why;
    bool kept = false;
    for (int t = 0; t < kTries && !kept; ++t) {
      write_cached(cache, o, with_gemm_times_scaled(calibration(t), kept_scale));
      const LocalProfile lp = local_profile(cache, o, nullptr, trust);
      kept = !lp.calibrated;
      why += "\n  try " + std::to_string(t + 1) + ": " + lp.why;
    }
    EXPECT_TRUE(kept) << "scale " << kept_scale << " recalibrated in " << kTries << " tries:" << why;
  }
  // A try where the re-timing itself disagrees with the calibration a moment before (ratio x
  // scale off by 15% or more: another test's threads on the sibling vCPU made the GEMMs 1.6-1.9x
  // slower in one CI run) cannot tell whether the check works, so it does not count; up to
  // kAttempts tries for kTries that count, and a skip, not a pass, when none did. Not 30%: the
  // check keeps a profile when the nearest of its three readings is within 35%, so at scale 2 a
  // machine 29% slower than its calibration (a counted try in the thirty-sixth session's CI on
  // the Intel AMX class) reads 0.64x, and one slower reading of three is kept. Four attempts: six
  // took 438 s at scale 2 alone there (a quick calibration and the check each), the limit is 600.
  constexpr int kAttempts = 4;
  for (double off_scale : {2.0, 0.5}) {
    std::string why;
    bool ok = false;
    int counted = 0;
    for (int t = 0; t < kAttempts && counted < kTries && !ok; ++t) {
      const nlohmann::json off = with_gemm_times_scaled(calibration(t), off_scale);
      // time now / the profile's time
      const double ratio = spot_check_ratio(hardware_from_json(off, "p.json"), o.dtype, o.threads);
      const bool steady = std::abs(ratio * off_scale - 1.0) < 0.15;
      write_cached(cache, o, off);
      const LocalProfile redone = local_profile(cache, o, nullptr, trust);
      // The new calibration replaced the cached file: it passes the check now.
      const double after = redone.calibrated ? spot_check_ratio(load_hardware(redone.path, ""), o.dtype, o.threads) : 0.0;
      counted += steady ? 1 : 0;
      ok = steady && redone.calibrated && redone.why.find("spot check") != std::string::npos && std::abs(after - 1.0) < 0.35;
      why += "\n  try " + std::to_string(t + 1) + ": ratio x scale " + std::to_string(ratio * off_scale) +
             (steady ? "" : " (machine speed moved: not counted)") + ", recalibrated " +
             (redone.calibrated ? "yes" : "no") + " (" + redone.why + "), ratio after " + std::to_string(after);
    }
    if (counted == 0) GTEST_SKIP() << "scale " << off_scale << ": the machine's speed moved in every try:" << why;
    EXPECT_TRUE(ok) << "scale " << off_scale << ":" << why;
  }
  std::filesystem::remove_all(cache);
}

// The spot check acts on readings that agree: one reading out of tolerance is checked again,
// and the profile is off only when every reading is off on the same side (scripted readings,
// no timing: what confirm_spot_check decides from them).
TEST(CostCalibrate, SpotCheckConfirmsBeforeRecalibrating) {
  auto verdict = [](std::vector<double> readings) {
    size_t next = 0;
    const SpotCheck s = confirm_spot_check([&] { return readings.at(next++); }, 0.35, 3);
    EXPECT_EQ(size_t(s.checks), next) << "checks counts the readings taken";
    return s;
  };
  SpotCheck s = verdict({1.1});  // within: one reading
  EXPECT_FALSE(s.off);
  EXPECT_EQ(s.checks, 1);
  EXPECT_DOUBLE_EQ(s.ratio, 1.1);
  s = verdict({1.53, 1.04});  // a slow moment, then as calibrated: kept
  EXPECT_FALSE(s.off);
  EXPECT_EQ(s.checks, 2);
  EXPECT_DOUBLE_EQ(s.ratio, 1.04);
  s = verdict({1.6, 2.1, 1.5});  // slower every time: off, the nearest reading reported
  EXPECT_TRUE(s.off);
  EXPECT_EQ(s.checks, 3);
  EXPECT_DOUBLE_EQ(s.ratio, 1.5);
  s = verdict({0.5, 0.55, 0.45});  // faster every time (a profile made under load): off
  EXPECT_TRUE(s.off);
  EXPECT_DOUBLE_EQ(s.ratio, 0.55);
  s = verdict({1.6, 0.6});  // off on both sides: the machine swings around the profile, kept
  EXPECT_FALSE(s.off);
  EXPECT_EQ(s.checks, 2);
  s = verdict({0.0});  // nothing to re-time (a GPU profile)
  EXPECT_FALSE(s.off);
  EXPECT_EQ(s.checks, 1);
  size_t calls = 0;  // one check asked for: one reading decides
  EXPECT_TRUE(confirm_spot_check([&] { return ++calls, 2.0; }, 0.35, 1).off);
  EXPECT_EQ(calls, 1u);
}

// A command runs at its share of the cores (main(): 2 threads here), its profile at one
// thread: the calibration and the spot check run at the profile's count and give the caller's
// back. Before, the spot check timed two threads by the wall clock against the one-thread
// profile (~0.6x its GEMM times on two cores), so every use of a fresh profile recalibrated it.
TEST(CostCalibrate, SpotCheckAtTheProfilesThreads) {
  const ac::dist::ScopedComputeThreads command(2);
  CalibrationOptions o = quick_options();
  o.threads = 1;  // the launcher's default (--threads 1)
  const std::string cache = ::testing::TempDir() + "/ac_spot_threads_" + std::to_string(::getpid());
  LocalProfileOptions trust;
  trust.max_other_cores = 1e9;
  trust.spot_check_once_per_process = false;
  std::string why;
  bool kept = false;
  for (int t = 0; t < 3 && !kept; ++t) {  // as LocalProfileSpotCheck: a load that comes or goes decides one try
    write_cached(cache, o, calibrate_recorded(o).to_json());
    EXPECT_EQ(at::get_num_threads(), 2) << "the calibration kept its thread count";
    const LocalProfile lp = local_profile(cache, o, nullptr, trust);
    EXPECT_EQ(at::get_num_threads(), 2) << "the spot check kept its thread count";
    kept = !lp.calibrated;
    why += "\n  try " + std::to_string(t + 1) + ": " + lp.why;
  }
  EXPECT_TRUE(kept) << "a fresh profile was recalibrated by a command at 2 threads:" << why;
  std::filesystem::remove_all(cache);
}

// A calibration made while two other processes spin (one per core) is not cached silently:
// the profile records the load and the result carries a warning naming it.
TEST(CostCalibrate, LocalProfileBusy) {
  const CalibrationOptions o = quick_options();
  const std::string cache = ::testing::TempDir() + "/ac_busy_" + std::to_string(::getpid());
  // A quiet profile (other_cores 0) whose GEMM times are half of this machine's, for the spot
  // check under load below.
  nlohmann::json quiet = with_gemm_times_scaled(calibrate_recorded(o).to_json(), 0.5);
  quiet["calibrated_on"]["other_cores"] = 0.0;
  std::vector<pid_t> spinners;
  for (int i = 0; i < 2; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      volatile unsigned long x = 0;
      for (;;) x = x + 1;
    }
    spinners.push_back(pid);
  }
  // The spot check fails while the machine is busy: the quiet profile is kept, with a warning
  // (a calibration now would time the load), and not marked as having passed.
  const std::string path = write_cached(cache, o, quiet);
  LocalProfileOptions checked;
  checked.spot_check_once_per_process = false;
  const LocalProfile kept = local_profile(cache, o, nullptr, checked);
  EXPECT_FALSE(kept.calibrated) << kept.why;
  EXPECT_NE(kept.warning.find("spot check"), std::string::npos) << kept.warning;
  EXPECT_NE(kept.warning.find("while other processes use"), std::string::npos) << kept.warning;
  std::filesystem::remove(path);
  LocalProfileOptions trust;
  trust.spot_check = false;
  const LocalProfile lp = local_profile(cache, o, nullptr, trust);
  for (pid_t pid : spinners) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  EXPECT_TRUE(lp.calibrated);
  EXPECT_GT(lp.profile.calibrated_on.other_cores, 0.5) << lp.profile.calibrated_on.other_cores;
  EXPECT_NE(lp.warning.find("other processes used"), std::string::npos) << lp.warning;
  // The cached file says so too, and a later use either recalibrates (the machine is quiet
  // now) or repeats the warning (still busy): never uses it silently.
  const HardwareProfile cached = load_hardware(lp.path, "");
  EXPECT_NE(busy_warning(cached, trust.max_other_cores), "");
  const LocalProfile again = local_profile(cache, o, nullptr, trust);
  EXPECT_TRUE(again.calibrated || !again.warning.empty()) << again.why;
  if (again.calibrated) {
    EXPECT_NE(again.why.find("quiet now"), std::string::npos) << again.why;
  }
  std::filesystem::remove_all(cache);
}
