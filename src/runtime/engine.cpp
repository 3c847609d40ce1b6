// TEMPORARY STAND-IN for the many-sequence engine (engine.h), written by the
// server's branch so that `minfer serve` can be built and tested before the
// real engine lands: requests run ONE AT A TIME on a single-sequence Session,
// one token per step() (so cancel() and new submissions are seen between
// tokens); a request's samples run one after the other from the prompt's
// cached KV rows. No paging and no prefix sharing: "pages" are the session's
// occupied cells in units of page_cells, so the accounting the server shows
// (used while a request runs, zero when idle) still holds. To be replaced
// wholesale by the real implementation when branch h-engine is merged.
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "runtime/session.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

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

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}
constexpr int64_t kPageCells = 16;
}  // namespace

struct Engine::Impl {
    struct Request {
        RequestId id = 0;
        GenParams params;
        RequestCallbacks cb;
        Clock::time_point t_submit;
        // Running state (the one current request).
        int32_t sample = 0;
        std::vector<float> prompt_logits;  // [n_vocab] after the prompt
        std::vector<float> logits;         // [n_vocab] of the last token
        std::optional<Sampler> sampler;
        std::unordered_map<int32_t, int> counts;  // output token -> occurrences
        int64_t generated = 0;
        double t_queue_ms = 0, t_first_ms = -1;
    };

    const model::Model& model;
    EngineOptions options;
    tokenizer::Tokenizer tok;
    Session session;

    mutable std::mutex mu;  // guards queue, cancelled, stats, next_id
    std::condition_variable cv;
    std::deque<std::unique_ptr<Request>> queue;
    std::set<RequestId> cancelled;
    EngineStats st;
    RequestId next_id = 1;
    std::unique_ptr<Request> cur;  // step thread only

    Impl(const model::Model& m, EngineOptions o)
        : model(m),
          options(o),
          tok(tokenizer::Tokenizer::from_gguf(m.file)),
          session(m, session_options(o)) {
        st.page_cells = kPageCells;
        st.pages_total = o.n_ctx / kPageCells;
        st.pages_free = st.pages_total;
    }

    static SessionOptions session_options(const EngineOptions& o) {
        SessionOptions s;
        s.n_ctx = o.n_ctx;
        s.n_batch = o.n_batch;
        s.n_threads = o.n_threads;
        s.kv_type = o.kv_type_k;
        s.fuse = o.fuse;
        s.planner = o.planner;
        return s;
    }

    void update_pages_locked() {
        st.pages_used = (session.n_past() + kPageCells - 1) / kPageCells;
        st.pages_free = st.pages_total - st.pages_used;
        st.running = cur ? 1 : 0;
        st.waiting = static_cast<int64_t>(queue.size());
    }

    RequestResult result(const Request& r, FinishReason why, std::string error = {}) {
        RequestResult res;
        res.sample = r.sample;
        res.reason = why;
        res.error = std::move(error);
        res.prompt_tokens = static_cast<int64_t>(r.params.prompt.size());
        res.generated = r.generated;
        res.t_queue_ms = r.t_queue_ms;
        res.t_first_token_ms = r.t_first_ms < 0 ? ms_since(r.t_submit) : r.t_first_ms;
        res.t_total_ms = ms_since(r.t_submit);
        return res;
    }

    // Ends every sample from the current one on: `why` for all.
    void finish_all(Request& r, FinishReason why, const std::string& error = {}) {
        for (; r.sample < r.params.n_samples; ++r.sample) {
            if (r.cb.on_finish) r.cb.on_finish(result(r, why, error));
            r.generated = 0;
        }
    }

    void start_sample(Request& r) {
        SamplerParams sp = r.params.sampling;
        sp.seed += static_cast<uint64_t>(r.sample);
        r.sampler.emplace(sp);
        for (int32_t t : r.params.prompt) r.sampler->accept(t);
        r.counts.clear();
        r.generated = 0;
        r.logits = r.prompt_logits;
    }

    // One token of the current request; ends the sample (and maybe the request).
    void decode_one(Request& r) {
        std::vector<float> l = r.logits;
        // OpenAI's penalties on the output so far.
        for (const auto& [t, c] : r.counts)
            l[static_cast<size_t>(t)] -=
                r.params.presence_penalty + r.params.frequency_penalty * static_cast<float>(c);
        if (r.params.ignore_eos)
            for (int32_t e : tok.eog_ids())
                if (e >= 0 && static_cast<size_t>(e) < l.size())
                    l[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
        const int32_t id = r.sampler->sample(l);
        if (r.t_first_ms < 0) r.t_first_ms = ms_since(r.t_submit);
        if (!r.params.ignore_eos && tok.is_eog(id)) return end_sample(r, FinishReason::Stop);
        r.sampler->accept(id);
        ++r.counts[id];
        ++r.generated;
        {
            std::lock_guard<std::mutex> lk(mu);
            ++st.generated_tokens;
        }
        TokenEvent ev;
        ev.sample = r.sample;
        ev.token = id;
        if (r.params.top_logprobs >= 0) {
            // Log-softmax of the model's distribution (before sampling filters).
            const float mx = *std::max_element(l.begin(), l.end());
            double sum = 0;
            for (float x : l) sum += std::exp(static_cast<double>(x - mx));
            const float lse = mx + static_cast<float>(std::log(sum));
            ev.logprob = l[static_cast<size_t>(id)] - lse;
            std::vector<int32_t> idx(l.size());
            for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
            const size_t k =
                std::min<size_t>(static_cast<size_t>(r.params.top_logprobs), idx.size());
            std::partial_sort(
                idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                [&](int32_t a, int32_t b) {
                    return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)] ||
                           (l[static_cast<size_t>(a)] == l[static_cast<size_t>(b)] && a < b);
                });
            for (size_t i = 0; i < k; ++i)
                ev.top.emplace_back(idx[i], l[static_cast<size_t>(idx[i])] - lse);
        }
        if (r.cb.on_token && !r.cb.on_token(ev)) return end_sample(r, FinishReason::Stop);
        if (r.params.n_predict >= 0 && r.generated >= r.params.n_predict)
            return end_sample(r, FinishReason::Length);
        if (session.n_past() >= session.n_ctx()) return end_sample(r, FinishReason::ContextFull);
        r.logits = session.eval(std::span<const int32_t>(&id, 1));
    }

    void end_sample(Request& r, FinishReason why) {
        if (r.cb.on_finish) r.cb.on_finish(result(r, why));
        ++r.sample;
        if (r.sample < r.params.n_samples) {
            session.truncate(static_cast<int64_t>(r.params.prompt.size()));
            start_sample(r);
        } else {
            retire();
        }
    }

    void retire() {
        session.truncate(0);
        std::lock_guard<std::mutex> lk(mu);
        cur.reset();
        update_pages_locked();
    }

    bool step() {
        std::vector<std::unique_ptr<Request>> dropped;  // cancelled while queued
        bool cancel_cur = false;
        {
            std::lock_guard<std::mutex> lk(mu);
            for (auto it = queue.begin(); it != queue.end();) {
                if (cancelled.count((*it)->id)) {
                    cancelled.erase((*it)->id);
                    dropped.push_back(std::move(*it));
                    it = queue.erase(it);
                } else {
                    ++it;
                }
            }
            if (cur && cancelled.count(cur->id)) {
                cancelled.erase(cur->id);
                cancel_cur = true;
            }
            cancelled.clear();  // ids no longer queued or running are ignored
            if (!cur && !cancel_cur && !queue.empty()) {
                cur = std::move(queue.front());
                queue.pop_front();
                cur->t_queue_ms = ms_since(cur->t_submit);
            }
            ++st.steps;
            update_pages_locked();
        }
        for (auto& r : dropped) finish_all(*r, FinishReason::Cancelled);
        if (cancel_cur) {
            finish_all(*cur, FinishReason::Cancelled);
            retire();
            return true;
        }
        if (!cur) return !dropped.empty();
        Request& r = *cur;
        try {
            if (r.prompt_logits.empty()) {
                session.truncate(0);
                r.prompt_logits = session.eval(r.params.prompt);
                {
                    std::lock_guard<std::mutex> lk(mu);
                    st.prompt_tokens += static_cast<int64_t>(r.params.prompt.size());
                    st.prefix_lookup_tokens += static_cast<int64_t>(r.params.prompt.size());
                    update_pages_locked();
                }
                start_sample(r);
            }
            decode_one(r);
        } catch (const std::exception& e) {
            finish_all(r, FinishReason::Error, e.what());
            retire();
        }
        std::lock_guard<std::mutex> lk(mu);
        update_pages_locked();
        return true;
    }
};

Engine::Engine(const model::Model& model, EngineOptions options)
    : impl_(std::make_unique<Impl>(model, options)) {}
Engine::~Engine() = default;

RequestId Engine::submit(GenParams params, RequestCallbacks callbacks) {
    auto& I = *impl_;
    if (params.prompt.empty()) throw Error("the prompt is empty");
    const int64_t n_prompt = static_cast<int64_t>(params.prompt.size());
    if (n_prompt + 1 > I.options.n_ctx)
        throw Error("the prompt has " + std::to_string(n_prompt) + " tokens; the context holds " +
                    std::to_string(I.options.n_ctx) + " (prompt + 1 generated token must fit)");
    for (int32_t t : params.prompt)
        if (t < 0 || t >= I.model.hp.n_vocab)
            throw Error("token id " + std::to_string(t) + " is out of range [0, " +
                        std::to_string(I.model.hp.n_vocab) + ")");
    if (params.n_samples < 1 || params.n_samples > I.options.n_parallel)
        throw Error("n_samples " + std::to_string(params.n_samples) + " must be in [1, " +
                    std::to_string(I.options.n_parallel) + "]");
    if (params.top_logprobs > 20) throw Error("top_logprobs must be <= 20");
    auto r = std::make_unique<Impl::Request>();
    r->params = std::move(params);
    r->cb = std::move(callbacks);
    r->t_submit = Clock::now();
    RequestId id;
    {
        std::lock_guard<std::mutex> lk(I.mu);
        id = r->id = I.next_id++;
        I.queue.push_back(std::move(r));
        I.st.waiting = static_cast<int64_t>(I.queue.size());
    }
    I.cv.notify_all();
    return id;
}

void Engine::cancel(RequestId id) {
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        impl_->cancelled.insert(id);
    }
    impl_->cv.notify_all();
}

bool Engine::step() {
    return impl_->step();
}

void Engine::wait_for_work(int ms) {
    std::unique_lock<std::mutex> lk(impl_->mu);
    impl_->cv.wait_for(lk, std::chrono::milliseconds(ms), [&] {
        return !impl_->queue.empty() || !impl_->cancelled.empty() || impl_->cur;
    });
}

bool Engine::idle() const {
    std::lock_guard<std::mutex> lk(impl_->mu);
    return impl_->queue.empty() && !impl_->cur;
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lk(impl_->mu);
    return impl_->st;
}
const model::Model& Engine::model() const {
    return impl_->model;
}
const EngineOptions& Engine::options() const {
    return impl_->options;
}

}  // namespace minfer::runtime
