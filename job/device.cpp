// The job's device (job/device.h).
#include "job/device.h"

#include "checkpoint/convert.h"

namespace ac::job {

RunDevice choose_run_device(const std::string& device, int local_rank, const std::string& dtype) {
  RunDevice d;
  d.choice = dist::choose_device(device, local_rank);
  d.device = d.choice.torch_device();
  d.tf32 = dist::apply_tf32_policy(d.choice);
  d.dtype_choice = dist::choose_dtype(dtype, d.choice.cuda);
  d.dtype = checkpoint::parse_dtype(d.dtype_choice.dtype);
  return d;
}

nlohmann::json layout_json(const dist::ParallelLayout& layout, const RunDevice& d, int etp) {
  return {{"world", layout.world_size()},       {"tp", layout.tp_size()},
          {"dp", layout.dp_size()},             {"ep", layout.ep_size()},
          {"etp", etp},                         {"dtype", d.dtype_choice.dtype},
          {"dtype_reason", d.dtype_choice.reason}, {"device", d.choice.device},
          {"device_reason", d.choice.reason},   {"backend", d.choice.backend()},
          {"tf32", d.tf32}};
}

}  // namespace ac::job
