#include "runtime/sampler.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "util/error.h"

namespace minfer::runtime {

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
    return best;
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t n_top) {
    const size_t n_vocab = logits.size();
    TokenLogprobs out;
    double mx = logits[0];
    for (size_t i = 1; i < n_vocab; ++i) mx = std::max<double>(mx, logits[i]);
    double sum = 0;
    for (size_t i = 0; i < n_vocab; ++i) sum += std::exp(double{logits[i]} - mx);
    const double lse = mx + std::log(sum);
    out.logprob = static_cast<float>(logits[static_cast<size_t>(token)] - lse);
    const size_t n = std::min(static_cast<size_t>(std::max<int32_t>(n_top, 0)), n_vocab);
    std::vector<int32_t> ids(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) ids[i] = static_cast<int32_t>(i);
    std::partial_sort(
        ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
        [&](int32_t a, int32_t b) {
            return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
                   (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
        });
    for (size_t i = 0; i < n; ++i)
        out.top.emplace_back(ids[i], static_cast<float>(logits[static_cast<size_t>(ids[i])] - lse));
    return out;
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
    : params_(params), eog_(std::move(eog)), sampler_(params.sampler) {
    // No rollback history: a sampled token is never taken back.
    if (params_.constraint) matcher_.emplace(params_.constraint->grammar, 0);
}

void SequenceSampler::start_reply(std::span<const int32_t> input) {
    for (int32_t t : input) sampler_.accept(t);
    reply_counts_.clear();
    // A reply is one output of the grammar, from its start.
    if (matcher_) {
        matcher_.emplace(params_.constraint->grammar, 0);
        mask_ready_ = false;
    }
}

void SequenceSampler::prepare_mask() {
    if (!matcher_ || mask_ready_) return;
    // CPU time of this thread: the engine's mask thread shares the cores
    // with the forward pass, whose threads would count in a wall time.
    auto cpu_us = [] {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
    };
    const double t0 = cpu_us();
    params_.constraint->masker->compute_mask(*matcher_, mask_);
    pending_mask_us_ = static_cast<float>(cpu_us() - t0);
    mask_ready_ = true;
}

// Sets the logits of the tokens mask_ refuses (and of any id past the
// constraint's vocabulary) to -inf, 64 tokens a mask word.
void SequenceSampler::apply_mask(std::vector<float>& row) const {
    constexpr float kRefused = -std::numeric_limits<float>::infinity();
    const size_t n = row.size();
    for (size_t w = 0, base = 0; base < n; ++w, base += 64) {
        const uint64_t allowed = w < mask_.words.size() ? mask_.words[w] : 0;
        const size_t end = std::min(n, base + 64);
        if (allowed == ~uint64_t{0} && end == base + 64) continue;
        if (allowed == 0) {
            std::fill(row.begin() + static_cast<std::ptrdiff_t>(base),
                      row.begin() + static_cast<std::ptrdiff_t>(end), kRefused);
            continue;
        }
        for (size_t i = base; i < end; ++i)
            if (!((allowed >> (i - base)) & 1)) row[i] = kRefused;
    }
}

int32_t SequenceSampler::sample(std::span<const float> logits) {
    std::span<const float> row = logits;
    const bool penalties = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
    // The end tokens ignore_eos masks: with a constraint, its vocabulary's
    // (the only ones its mask allows).
    const std::vector<int32_t>& end_ids =
        matcher_ ? params_.constraint->masker->vocab().eog_ids : eog_;
    bool mask_eog = params_.ignore_eos && !end_ids.empty();
    if (matcher_) {
        prepare_mask();
        mask_us_ = pending_mask_us_;
        const size_t n_allowed = mask_.count();
        if (n_allowed == 0)
            throw Error(
                "the grammar allows no token of the vocabulary here (it needs bytes no "
                "token spells)");
        // ignore_eos: the end tokens stay masked while the grammar allows
        // something else; a complete output that cannot go on ends anyway.
        if (mask_eog) {
            size_t n_eog = 0;
            for (int32_t e : end_ids) n_eog += mask_.test(e);
            if (n_eog == n_allowed) mask_eog = false;
        }
    }
    if (matcher_ || (penalties && !reply_counts_.empty()) || mask_eog) {
        row_.assign(logits.begin(), logits.end());
        if (matcher_) apply_mask(row_);
        if (penalties)
            for (const auto& [tok, count] : reply_counts_)
                if (static_cast<size_t>(tok) < row_.size())
                    row_[static_cast<size_t>(tok)] -=
                        params_.presence_penalty +
                        params_.frequency_penalty * static_cast<float>(count);
        if (mask_eog)
            for (int32_t e : end_ids)
                if (e >= 0 && static_cast<size_t>(e) < row_.size())
                    row_[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
        row = row_;
    }
    const int32_t tok = sampler_.sample(row);
    if (matcher_) {
        // The token was in the mask, so the grammar takes it.
        MINFER_ASSERT_MSG(params_.constraint->masker->accept_token(*matcher_, tok),
                          "a token of the mask refused by the grammar");
        mask_ready_ = false;
    }
    sampler_.accept(tok);
    ++reply_counts_[tok];
    return tok;
}

bool SequenceSampler::ends(int32_t token) const {
    // A constrained sample's end token was taken by its grammar (allowed
    // where the output is complete, under ignore_eos only where nothing else is).
    if (matcher_ && matcher_->is_terminated()) return true;
    return !params_.ignore_eos && std::find(eog_.begin(), eog_.end(), token) != eog_.end();
}

}  // namespace minfer::runtime
