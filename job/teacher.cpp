// The job's teacher (job/teacher.h).
#include "job/teacher.h"

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert.h"
#include "checkpoint/model_state.h"
#include "dist/error.h"

namespace ac::job {

model::CausalLM load_frozen_teacher(const std::string& path, const model::TpGroup& tp, torch::Dtype dtype,
                                    const model::EpGroup& ep) {
  checkpoint::CheckpointReader r(path);
  const model::ArchSpec spec = checkpoint::checkpoint_arch(r);
  if (const std::string why = model::tp_split_problem(spec, tp.size(), ep.size(), ep.expert_tp); !why.empty())
    throw InputError(path, "arch_spec (--tp " + std::to_string(tp.size()) + (ep.size() > 1 ? " --ep " + std::to_string(ep.size()) : "") +
                               (ep.expert_tp ? " --etp " + std::to_string(tp.size()) : "") + ")", why);
  model::CausalLM m(spec, tp, model::ModelOptions{dtype, ep});
  checkpoint::load_model(m, r);
  m->eval();
  for (auto& p : m->parameters()) p.requires_grad_(false);
  return m;
}

}  // namespace ac::job
