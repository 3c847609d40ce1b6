// Token sampling with llama.cpp's vocabulary and defaults, applied in its
// order: repetition penalty -> top-k -> top-p -> min-p -> temperature ->
// draw. temp <= 0 is greedy (argmax, lowest id on ties).
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

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

}  // namespace minfer::runtime
