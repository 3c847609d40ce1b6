#include "runtime/generation.h"

namespace minfer::runtime {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::Stop:
            return "stop";
        case FinishReason::Length:
            return "length";
        case FinishReason::ContextFull:
            return "context_full";
        case FinishReason::Cancelled:
            return "cancelled";
        case FinishReason::Error:
            return "error";
    }
    return "?";
}

NextToken next_token(SequenceSampler& sampler, std::span<const float> logits,
                     const GenerationState& state, const std::function<bool(int32_t)>& emit) {
    NextToken next;
    const bool limited = state.n_predict >= 0;
    if (limited && state.n_sampled >= state.n_predict) {
        next.end = FinishReason::Length;
        return next;
    }
    next.token = sampler.sample(logits);
    if (sampler.ends(next.token)) {
        next.end = FinishReason::Stop;
        return next;
    }
    next.emitted = true;
    if (!emit(next.token) || sampler.finished())
        next.end = FinishReason::Stop;
    else if (limited && state.n_sampled + 1 >= state.n_predict)
        next.end = FinishReason::Length;
    else if (state.n_cached >= state.n_ctx)
        next.end = FinishReason::ContextFull;
    return next;
}

}  // namespace minfer::runtime
