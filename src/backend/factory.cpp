#include "backend/factory.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant_dot.h"
#include "backend/queue/queue_backend.h"

namespace minfer::backend {

std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool batch_invariant) {
    return std::make_unique<CpuBackend>(n_threads, batch_invariant);
}

std::unique_ptr<Backend> make_queue_backend(bool batch_invariant) {
    return std::make_unique<QueueBackend>(batch_invariant);
}

bool cpu_groups_weight_rows(tensor::DType t) {
    return cpu::group_dot_fn(t) != nullptr;
}

}  // namespace minfer::backend
