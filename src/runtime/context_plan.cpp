#include <algorithm>

#include "runtime/session.h"
#include "util/error.h"

namespace minfer::runtime {

ContextPlan plan_context(int64_t requested, bool user_requested, int64_t n_ctx_train,
                         int64_t n_prompt, int64_t n_predict_hint) {
    if (requested < 1)
        throw Error("the context size must be at least 1, got " + std::to_string(requested));
    if (n_prompt > n_ctx_train)
        throw Error("the prompt has " + std::to_string(n_prompt) +
                    " tokens, more than the model's trained context length of " +
                    std::to_string(n_ctx_train) + " tokens");
    ContextPlan plan;
    plan.n_ctx = requested;
    if (plan.n_ctx > n_ctx_train) {
        if (user_requested)
            plan.warning = "context size " + std::to_string(requested) +
                           " is larger than the model's trained context length; using " +
                           std::to_string(n_ctx_train);
        plan.n_ctx = n_ctx_train;
    }
    if (plan.n_ctx < n_prompt) {
        // A long prompt must never overflow the KV regions: raise the context
        // to hold it (and the tokens asked for, as far as the model allows).
        const int64_t want = std::min(n_ctx_train, n_prompt + std::max<int64_t>(0, n_predict_hint));
        plan.warning = "the prompt has " + std::to_string(n_prompt) +
                       " tokens; context size raised from " + std::to_string(plan.n_ctx) + " to " +
                       std::to_string(want);
        plan.n_ctx = want;
    }
    return plan;
}

}  // namespace minfer::runtime
