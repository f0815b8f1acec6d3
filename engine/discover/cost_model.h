// Roofline cost model: time = launches * launch_overhead + max(flops / rate, bytes / bandwidth).
//
// Per node, for the unfused PyTorch program (one kernel per op, views free), and per pattern,
// for the fused kernel (one launch; it reads its external operands once and writes its output
// once). The estimated saving of a pattern is the difference; the planner maximises the sum.
#pragma once

#include <string>
#include <vector>

#include "discover/pattern.h"
#include "ir/graph.h"

namespace fact::discover {

// Sustained rates for one GPU. Sources are noted per row in cost_model.cpp.
struct Hardware {
  std::string gpu;   // h200 | h100 | a100
  std::string arch;  // sm90 | sm80
  double bf16_flops;  // dense tensor-core bf16/fp16, FLOP/s
  double tf32_flops;  // tensor-core tf32
  double fp32_flops;  // CUDA-core fp32 (SIMT)
  double bandwidth;   // device memory, bytes/s (read + write)
  double launch_s;    // per-kernel launch overhead in a stream of eager ops
};

// `gpu` may be empty: the arch's default (sm90 -> h200, sm80 -> a100). UserError otherwise.
const Hardware& hardware(const std::string& arch, const std::string& gpu);
std::vector<std::string> known_gpus();

struct Cost {
  double flops = 0;
  double bytes = 0;
  int launches = 0;
  double seconds = 0;
};

class CostModel {
 public:
  // `precision`: the float32 matmul precision (highest | high | medium) for f32 GEMMs.
  CostModel(const Hardware& hw, std::string precision) : hw_(hw), precision_(std::move(precision)) {}

  const Hardware& hw() const { return hw_; }
  double matmul_rate(ir::DType dtype) const;
  // One node as eager PyTorch runs it.
  Cost node(const ir::Graph& g, int id) const;
  // The sum over nodes (the unfused subgraph).
  Cost unfused(const ir::Graph& g, const std::vector<int>& nodes) const;
  // The fused kernel for a match.
  Cost fused(const ir::Graph& g, const Match& m) const;

 private:
  Cost finish(Cost c, double rate) const;
  const Hardware& hw_;
  std::string precision_;
};

}  // namespace fact::discover
