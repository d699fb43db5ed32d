// The budget options `minitron` and `search` share: --target-params, --target-active-params,
// --target-memory-gb, --target-ttft-ms, --target-tpot-ms, --target-throughput.
#pragma once

#include <boost/program_options.hpp>

#include "search/minitron.h"

namespace ac::launcher {

inline void add_budget_options(boost::program_options::options_description& d) {
  namespace po = boost::program_options;
  d.add_options()("target-params", po::value<double>()->value_name("N"), "at most N parameters (ArchSpec count, without MTP)")(
      "target-active-params", po::value<double>()->value_name("N"), "at most N active parameters per token")(
      "target-memory-gb", po::value<double>()->value_name("X"),
      "at most X GB (1e9 bytes) of serving memory by the cost model: weights + activations + reserve + KV/state of the "
      "workload's concurrency (1 sequence when it asks for as many as fit); needs --hardware and --workload")(
      "target-ttft-ms", po::value<double>()->value_name("X"), "predicted TTFT at most X ms")(
      "target-tpot-ms", po::value<double>()->value_name("X"), "predicted TPOT at most X ms")(
      "target-throughput", po::value<double>()->value_name("X"), "predicted output throughput at least X tokens/s");
}

inline void read_budget_options(const boost::program_options::variables_map& vm, search::MinitronConstraints& c) {
  auto take = [&](const char* name, double& v) {
    if (vm.count(name)) v = vm[name].as<double>();
  };
  take("target-params", c.params);
  take("target-active-params", c.active_params);
  take("target-memory-gb", c.memory_gb);
  take("target-ttft-ms", c.ttft_ms);
  take("target-tpot-ms", c.tpot_ms);
  take("target-throughput", c.throughput);
}

}  // namespace ac::launcher
