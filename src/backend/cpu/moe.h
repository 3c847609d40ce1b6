// The mixture-of-experts ops behind run_node (graph/ir.h: Softmax .. SigmoidScale).
#pragma once

#include "backend/cpu/kernels.h"

namespace minfer::cpu {

void op_softmax(const graph::Node& node, const NodeData& data, ThreadPool& pool);
void op_top_k(const graph::Node& node, const NodeData& data, ThreadPool& pool);
void op_moe_weights(const graph::Node& node, const NodeData& data, ThreadPool& pool);
void op_moe_group(const graph::Node& node, const NodeData& data, ThreadPool& pool);
void op_moe_gather(const graph::Node& node, const NodeData& data, ThreadPool& pool);
void op_matmul_id(const graph::Node& node, const NodeData& data, ThreadPool& pool);
void op_moe_sum(const graph::Node& node, const NodeData& data, ThreadPool& pool);
void op_sigmoid_scale(const graph::Node& node, const NodeData& data, ThreadPool& pool);

// The 2-D matrix of expert e in a 3-D expert tensor [K, M, n_expert]: its
// M rows at an offset (whole 16-row groups when the tensor is regrouped).
tensor::TensorView expert_slice(const tensor::TensorView& w, int64_t e);

}  // namespace minfer::cpu
