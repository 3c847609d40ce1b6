#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace minfer::runtime {

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
    return best;
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {}

void Sampler::accept(int32_t token) {
    recent_.push_back(token);
    if (params_.repeat_last_n >= 0)
        while (recent_.size() > static_cast<size_t>(params_.repeat_last_n)) recent_.pop_front();
}

void Sampler::reset() {
    recent_.clear();
    rng_.seed(params_.seed);
}

int32_t Sampler::sample(std::span<const float> logits) {
    cand_.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {static_cast<int32_t>(i), logits[i]};

    // Repetition penalty, as llama.cpp applies it: each distinct recent token
    // once; positive logits divided, negative ones multiplied.
    if (params_.repeat_penalty != 1.0f && !recent_.empty()) {
        std::unordered_set<int32_t> seen(recent_.begin(), recent_.end());
        for (int32_t t : seen) {
            if (t < 0 || static_cast<size_t>(t) >= cand_.size()) continue;
            float& l = cand_[static_cast<size_t>(t)].logit;
            l = l <= 0 ? l * params_.repeat_penalty : l / params_.repeat_penalty;
        }
    }
    auto by_logit = [](const Candidate& a, const Candidate& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    if (params_.temp <= 0.0f) return std::min_element(cand_.begin(), cand_.end(), by_logit)->id;

    // top-k
    size_t keep = cand_.size();
    if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), cand_.end(),
                      by_logit);
    cand_.resize(keep);

    // top-p on the softmax of what is left (at temperature 1, as llama.cpp does)
    auto softmax = [&](std::vector<double>& p) {
        p.resize(cand_.size());
        const double mx = cand_[0].logit;
        double sum = 0;
        for (size_t i = 0; i < cand_.size(); ++i) sum += p[i] = std::exp(cand_[i].logit - mx);
        for (auto& x : p) x /= sum;
    };
    std::vector<double> p;
    if (params_.top_p < 1.0f) {
        softmax(p);
        double cum = 0;
        size_t n = cand_.size();
        for (size_t i = 0; i < cand_.size(); ++i) {
            cum += p[i];
            if (cum >= params_.top_p) {
                n = i + 1;
                break;
            }
        }
        cand_.resize(std::max<size_t>(1, n));
    }
    // min-p: keep tokens whose probability is at least min_p times the best one's
    if (params_.min_p > 0.0f) {
        const float threshold = cand_[0].logit + std::log(params_.min_p);
        size_t n = 1;
        while (n < cand_.size() && cand_[n].logit >= threshold) ++n;
        cand_.resize(n);
    }
    for (auto& c : cand_) c.logit /= params_.temp;
    softmax(p);
    std::discrete_distribution<size_t> dist(p.begin(), p.end());
    return cand_[dist(rng_)].id;
}

SequenceSampler::SequenceSampler(const SequenceSampling& params, std::vector<int32_t> eog)
    : params_(params), eog_(std::move(eog)), sampler_(params.sampler) {}

void SequenceSampler::start_reply(std::span<const int32_t> input) {
    for (int32_t t : input) sampler_.accept(t);
    reply_counts_.clear();
}

int32_t SequenceSampler::sample(std::span<const float> logits) {
    std::span<const float> row = logits;
    const bool penalties = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
    if ((penalties && !reply_counts_.empty()) || (params_.ignore_eos && !eog_.empty())) {
        row_.assign(logits.begin(), logits.end());
        if (penalties)
            for (const auto& [tok, count] : reply_counts_)
                if (static_cast<size_t>(tok) < row_.size())
                    row_[static_cast<size_t>(tok)] -=
                        params_.presence_penalty +
                        params_.frequency_penalty * static_cast<float>(count);
        if (params_.ignore_eos)
            for (int32_t e : eog_)
                if (e >= 0 && static_cast<size_t>(e) < row_.size())
                    row_[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
        row = row_;
    }
    const int32_t tok = sampler_.sample(row);
    sampler_.accept(tok);
    ++reply_counts_[tok];
    return tok;
}

bool SequenceSampler::ends(int32_t token) const {
    return !params_.ignore_eos && std::find(eog_.begin(), eog_.end(), token) != eog_.end();
}

}  // namespace minfer::runtime
