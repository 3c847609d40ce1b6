// Token sampling with llama.cpp's vocabulary and defaults, applied in its
// order: repetition penalty -> top-k -> top-p -> min-p -> temperature ->
// draw. temp <= 0 is greedy (argmax, lowest id on ties).
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <unordered_map>
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

// One sequence's choice of its next token, the one piece of it the engine
// (every sequence of the server and batched-bench) and the CLI's generation
// share: OpenAI's presence and frequency penalties on the tokens of this
// reply, then with ignore_eos the end-of-generation tokens masked (never
// sampled, as llama.cpp does, rather than sampled and not honoured), then
// the Sampler (repeat penalty over its window of the context, top-k, top-p,
// min-p, temperature, draw with this sequence's own seed).
struct SequenceSampling {
    SamplerParams sampler;
    float presence_penalty = 0.0f;   // subtracted once per token seen in the reply
    float frequency_penalty = 0.0f;  // subtracted per occurrence in the reply
    bool ignore_eos = false;
};

class SequenceSampler {
  public:
    SequenceSampler(const SequenceSampling& params, std::vector<int32_t> eog);
    // Input before a reply (a prompt, or a chat turn's new part): it joins
    // the context the repeat penalty looks at; the presence and frequency
    // penalties count the reply's tokens from here.
    void start_reply(std::span<const int32_t> input);
    // Picks the next token from one row of logits and records it.
    int32_t sample(std::span<const float> logits);
    // Whether `token` ends the sample: an end-of-generation token (which,
    // with ignore_eos, sample() never picks).
    bool ends(int32_t token) const;

  private:
    SequenceSampling params_;
    std::vector<int32_t> eog_;
    Sampler sampler_;
    std::unordered_map<int32_t, int32_t> reply_counts_;
    std::vector<float> row_;  // the logits with penalties and mask
};

}  // namespace minfer::runtime
