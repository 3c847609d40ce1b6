// The backends the runtime can make, without it seeing their classes or the
// kernels: the backend stage alone knows the CPU kernels and the queue.
#pragma once

#include <memory>

#include "ir/backend.h"
#include "tensor/dtype.h"

namespace minfer::backend {

// The CPU backend: kernels on a pool of n_threads threads. batch_invariant:
// every matmul takes the GEMM path at any token count (cpu::matmul), so a
// token's results do not depend on its pass's size.
std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool batch_invariant);

// The asynchronous queue backend (host memory, its own worker thread).
std::unique_ptr<Backend> make_queue_backend(bool batch_invariant);

// Whether this CPU's kernels (at the level MINFER_CPU leaves) have a 16-row
// grouped dot for weight type t, so that regrouping its rows pays.
bool cpu_groups_weight_rows(tensor::DType t);

}  // namespace minfer::backend
