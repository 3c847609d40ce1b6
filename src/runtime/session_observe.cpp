// Session's window for the reports: observers and the allocator, without
// exposing Session::Impl (runtime/session_impl.h stays inside runtime/).
#include <utility>

#include "runtime/session.h"
#include "runtime/session_impl.h"

namespace minfer::runtime {

void Session::add_pass_observer(PassObserver observer) {
    impl_->pass_observers.push_back(std::move(observer));
}

void Session::set_node_hook(NodeHook hook) {
    impl_->runner.scheduler().set_node_hook(std::move(hook));
}

graph::GraphAllocator& Session::allocator() {
    return impl_->runner.allocator();
}

const graph::CParams& Session::cparams() const {
    return impl_->runner.cparams();
}

}  // namespace minfer::runtime
