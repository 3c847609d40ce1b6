// How a sample goes on after each token it samples: the one rule of the
// engine's sequences (every request of the server and batched-bench) and of
// the CLI's generation and chat, so the two cannot drift apart. The caller
// runs the passes and hands each one's logits row to next_token(), which
// samples and decides, in this order:
//   1. n_predict tokens sampled already (only with n_predict 0): Length,
//      nothing sampled;
//   2. an end-of-generation token: Stop, not part of the output;
//   3. the token is emitted (the caller's emit returns false for a stop
//      string or a client gone): Stop;
//   4. a constraint's output is complete and nothing may follow: Stop;
//   5. the n_predict-th token: Length;
//   6. the KV cache cannot take the token: ContextFull.
// Otherwise the caller feeds the token to its next pass.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "runtime/sampler.h"

namespace minfer::runtime {

enum class FinishReason {
    Stop,         // an end-of-generation token, or the caller's on_token returned false
    Length,       // n_predict reached
    ContextFull,  // the sequence reached n_ctx cells (or could never get more pages)
    Cancelled,    // cancel() or shutdown
    Error,        // the message says what
};
const char* finish_reason_name(FinishReason r);

// Where one sample stands before its next token.
struct GenerationState {
    int64_t n_sampled = 0;   // tokens sampled so far (end tokens included)
    int64_t n_predict = -1;  // -1: no limit
    int64_t n_cached = 0;    // tokens the KV cache holds (the sampled token is not yet among them)
    int64_t n_ctx = 0;       // tokens it can hold
};

struct NextToken {
    int32_t token = -1;               // -1: none sampled (rule 1)
    bool emitted = false;             // handed to emit: part of the output
    std::optional<FinishReason> end;  // the sample ends with this token
};

// Samples the next token from `logits` (rules above). Throws what
// SequenceSampler::sample throws (a constraint that allows no token).
NextToken next_token(SequenceSampler& sampler, std::span<const float> logits,
                     const GenerationState& state, const std::function<bool(int32_t)>& emit);

}  // namespace minfer::runtime
