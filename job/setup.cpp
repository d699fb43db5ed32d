// The job's setup (job/setup.h).
#include "job/setup.h"

#include <algorithm>

#include "dist/device.h"
#include "dist/error.h"
#include "job/teacher.h"

namespace ac::job {

JobSetup make_job_setup(MPI_Comm world, const SetupOptions& o) {
  return make_job_setup(world, o, choose_run_device(o.device, o.local_rank, o.dtype));
}

JobSetup make_job_setup(MPI_Comm world, const SetupOptions& o, const RunDevice& rd) {
  JobSetup s;
  s.rd = rd;
  const dist::LayoutSpec spec{o.tp, 0, 0, o.ep};
  // Collectives on CUDA tensors go through NCCL, on CPU tensors through MPI.
  s.layout = o.host_collectives ? std::make_unique<dist::ParallelLayout>(world, spec)
                                : std::make_unique<dist::ParallelLayout>(world, spec, rd.choice.backend(),
                                                                         std::max(0, rd.choice.index));
  if (o.etp != 1 && o.etp != o.tp)
    throw InputError("--etp", std::to_string(o.etp),
                     "must be 1 (whole experts over the TP ranks) or the TP size " + std::to_string(o.tp) +
                         " (each expert's FFN width over the TP ranks)");
  check_sequence_parallel(o.sequence_parallel, o.tp, 0);
  s.tp = model::TpGroup{dist::make_device_communicator(s.layout->tp_mpi_comm(), rd.choice), o.sequence_parallel};
  if (o.ep > 1) s.ep.comm = dist::make_device_communicator(s.layout->ep_mpi_comm(), rd.choice);
  s.ep.expert_tp = o.etp > 1;
  // SP with whole experts over TP x EP dispatches over the joint group (the TP group at EP 1).
  if (o.sequence_parallel && o.etp == 1 && o.ep > 1)
    s.ep.tp_ep = dist::make_device_communicator(s.layout->tp_ep_mpi_comm(), rd.choice);
  s.layout_json = layout_json(*s.layout, rd, o.etp);
  s.layout_json["sequence_parallel"] = o.sequence_parallel;
  return s;
}

model::CausalLM JobSetup::frozen_teacher(const std::string& path) const {
  model::CausalLM m = load_frozen_teacher(path, tp, rd.dtype, ep);
  m->to(rd.device);
  return m;
}

void check_sequence_parallel(bool sequence_parallel, int tp, int64_t seq_len) {
  if (!sequence_parallel) return;
  if (tp < 2) throw InputError("--sequence-parallel", "true", "needs tensor parallelism (--tp > 1): it splits the sequence over the TP ranks");
  if (seq_len > 0 && seq_len % tp != 0)
    throw InputError("--seq-len", std::to_string(seq_len), "does not split evenly over --tp " + std::to_string(tp) + " (--sequence-parallel)");
}

std::string layout_options_text(const SetupOptions& o) {
  return "--tp " + std::to_string(o.tp) + (o.ep > 1 ? " --ep " + std::to_string(o.ep) : "") +
         (o.etp > 1 ? " --etp " + std::to_string(o.etp) : "") + (o.sequence_parallel ? " --sequence-parallel" : "");
}

}  // namespace ac::job
