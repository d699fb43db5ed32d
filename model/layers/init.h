// Construction-time initialisation of layer weights. Layers fill new weights with
// N(0, 0.02) so that a model is usable before init_weights() or a load; a model whose every
// parameter is loaded right after construction (pruning, where the student's random fill was
// most of a prune's time: docs/pruning.md) skips that fill under a SkipInitGuard.
#pragma once

#include <torch/types.h>

namespace ac::model {

// While one is alive on this thread, layers built leave their weights uninitialised
// (torch::empty): every parameter must then be loaded before use.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};

// t.normal_(0, 0.02), or t as it is under a SkipInitGuard.
torch::Tensor init_normal(torch::Tensor t);

}  // namespace ac::model
