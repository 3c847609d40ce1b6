// Token sampling with llama.cpp's vocabulary and defaults, applied in its
// order: repetition penalty -> top-k -> top-p -> min-p -> temperature ->
// draw. temp <= 0 is greedy (argmax, lowest id on ties).
//
// The one sampler of the engine, the server (through the engine) and the
// CLI: SequenceSampler owns a sequence's penalties, its end-of-generation
// masking and its structured-output constraint; token_logprobs the logprobs
// a request asks for. Stop strings are on the text side (sample_text.h).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "structured/constraint.h"

namespace minfer::runtime {

struct SamplerParams {
    float temp = 0.8f;
    int32_t top_k = 40;           // <= 0: off
    float top_p = 0.95f;          // >= 1: off
    float min_p = 0.05f;          // <= 0: off
    float repeat_penalty = 1.0f;  // 1: off
    int32_t repeat_last_n = 64;   // window of the penalty; 0: off, -1: the whole context
    uint64_t seed = 0;
};

class Sampler {
  public:
    explicit Sampler(const SamplerParams& params);
    // Picks the next token from one row of logits.
    int32_t sample(std::span<const float> logits);
    // Records a token of the context (prompt or generated) for the penalty.
    void accept(int32_t token);
    void reset();
    const SamplerParams& params() const { return params_; }

  private:
    struct Candidate {
        int32_t id;
        float logit;
    };
    SamplerParams params_;
    std::mt19937_64 rng_;
    std::deque<int32_t> recent_;
    std::vector<Candidate> cand_;
};

int32_t argmax(std::span<const float> logits);

// The log-probability of `token` under one row of the model's logits (a
// log-softmax in double, before any penalty or mask) and the n_top most
// likely tokens (ties: the lower id first) with theirs.
struct TokenLogprobs {
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;  // [n_top] (token, logprob)
};
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t n_top);

// One sequence's choice of its next token, the one piece of it the engine
// (every sequence of the server and batched-bench) and the CLI's generation
// share: OpenAI's presence and frequency penalties on the tokens of this
// reply, then with ignore_eos the end-of-generation tokens masked (never
// sampled, as llama.cpp does, rather than sampled and not honoured), then
// the Sampler (repeat penalty over its window of the context, top-k, top-p,
// min-p, temperature, draw with this sequence's own seed).
//
// With a constraint (structured output), the tokens its grammar refuses after
// the reply so far are excluded first, before every penalty and cut (their
// logits are -inf in the row the rest sees), end-of-generation tokens are
// allowed only where the output is complete, each chosen token is accepted
// into the sequence's matcher, and the sample ends once its output is
// complete and nothing can follow (finished()). ignore_eos keeps masking the
// end tokens while the grammar allows something else, never past that: a
// complete output that cannot go on ends. Sequences without one take the
// path above unchanged (one test of a null pointer).
struct SequenceSampling {
    SamplerParams sampler;
    float presence_penalty = 0.0f;   // subtracted once per token seen in the reply
    float frequency_penalty = 0.0f;  // subtracted per occurrence in the reply
    bool ignore_eos = false;
    std::shared_ptr<const structured::Constraint> constraint;  // null: none
};

class SequenceSampler {
  public:
    SequenceSampler(const SequenceSampling& params, std::vector<int32_t> eog);
    // Input before a reply (a prompt, or a chat turn's new part): it joins
    // the context the repeat penalty looks at; the presence and frequency
    // penalties count the reply's tokens from here.
    void start_reply(std::span<const int32_t> input);
    // Picks the next token from one row of logits and records it. With a
    // constraint, throws minfer::Error when the grammar allows no token of
    // the vocabulary here (one that cannot spell what the grammar needs).
    int32_t sample(std::span<const float> logits);
    // Whether `token`, just sampled, ends the sample: an end-of-generation
    // token (which, with ignore_eos, sample() never picks unless a
    // constraint allows nothing else). Not part of the output.
    bool ends(int32_t token) const;

    bool constrained() const { return matcher_.has_value(); }
    // The constraint's mask for the next token (the tokens its grammar allows
    // after the reply so far), computed and timed. sample() computes it when
    // it is not ready; the engine calls it on its mask thread while the
    // forward pass that gives the logits runs (it reads only the matcher:
    // never call it while sample() runs on another thread). No-op
    // unconstrained or when ready.
    void prepare_mask();
    bool mask_ready() const { return mask_ready_; }
    // Microseconds of CPU time the last sampled token's mask took to compute
    // (0 when unconstrained).
    float mask_us() const { return mask_us_; }
    // Constrained: the output so far is complete and nothing may follow, so
    // the sample ends after the token just sampled (which, unlike an end
    // token, is part of the output).
    bool finished() const { return matcher_ && !matcher_->can_continue(); }
    // Constrained: the output so far is a complete sentence of the grammar.
    bool complete() const { return matcher_ && matcher_->is_complete(); }

  private:
    void apply_mask(std::vector<float>& row) const;

    SequenceSampling params_;
    std::vector<int32_t> eog_;
    Sampler sampler_;
    std::unordered_map<int32_t, int32_t> reply_counts_;
    std::vector<float> row_;  // the logits with penalties and mask
    // Constrained only.
    std::optional<structured::Matcher> matcher_;
    structured::TokenBitset mask_;  // [n_vocab of the constraint] allowed next
    bool mask_ready_ = false;       // mask_ is the matcher's current state's
    float mask_us_ = 0.0f, pending_mask_us_ = 0.0f;
};

}  // namespace minfer::runtime
