// The engine's step, as data (ARCHITECTURE.md "Growing it"):
//   intake (requests, cancels) -> schedule (runtime/scheduler: admit with
//   prefix pages mapped and prompt pages reserved, grow with preemption,
//   pack, cut to a token-count bucket) -> run (runtime/model_runner: one
//   forward pass, graphs cached per bucket) -> sample each sequence -> retire.
// The graph knows only token counts; which sequence a token belongs to, the
// cell it writes and its sequence's pages (runtime/kv_store) reach it as
// named inputs.
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "graph/cache.h"
#include "runtime/engine_impl.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace minfer::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The options, checked, with the defaults filled in.
EngineOptions checked(EngineOptions opt) {
    if (opt.n_ctx < 1) throw Error("the context size (-c) must be at least 1");
    if (opt.n_batch < 1) throw Error("the batch size (-b) must be at least 1");
    if (opt.n_batch > (1 << 15)) throw Error("the batch size (-b) is limited to 32768 tokens");
    if (opt.n_parallel < 1) throw Error("the number of parallel sequences must be at least 1");
    if (opt.kv_type_k != opt.kv_type_v)
        throw Error(std::string("the K and V caches must have one type (got -ctk ") +
                    std::string(tensor::dtype_name(opt.kv_type_k)) + ", -ctv " +
                    std::string(tensor::dtype_name(opt.kv_type_v)) + ")");
    if (opt.kv_type_k != tensor::DType::F32 && opt.kv_type_k != tensor::DType::F16)
        throw Error("the KV cache type must be f32 or f16, got " +
                    std::string(tensor::dtype_name(opt.kv_type_k)));
    if (opt.n_threads <= 0) opt.n_threads = ThreadPool::physical_cores();
    return opt;
}

RunnerOptions runner_options(const EngineOptions& o) {
    RunnerOptions r;
    r.n_threads = o.n_threads;
    r.batch_invariant = o.batch_invariant;
    r.planner = o.planner;
    r.max_graphs = 8;  // token-count buckets kept at once
    return r;
}

graph::CParams engine_cparams(const EngineOptions& o, const KvStore& kv) {
    graph::CParams c;
    c.n_ctx = kv.n_ctx_cells();
    c.fuse_qkv = o.fuse.qkv;
    c.fuse_ffn = o.fuse.ffn;
    c.kv_type = o.kv_type_k;
    c.kv_page = kPageCells;
    return c;
}

}  // namespace

Engine::Impl::Impl(const model::Model& m, const EngineOptions& o)
    : model(m),
      opt(checked(o)),
      kv(opt.n_ctx, opt.prefix_cache),
      runner(m, runner_options(opt), engine_cparams(opt, kv)) {
    eog = opt.eog_ids;
    if (eog.empty()) {
        try {
            eog = tokenizer::Tokenizer::from_gguf(model.file).eog_ids();
        } catch (const Error&) {
            // a model without a vocabulary (tests): no end-of-generation token
        }
    }
    // The KV pools are committed now (the first plan makes the regions).
    prepare(1, 1);
    kv.attach_regions(runner.allocator(), model.hp.n_embd_kv(), runner.cparams().kv_type);
    publish_stats();
}

Engine::Impl::~Impl() = default;

graph::Graph& Engine::Impl::prepare(int64_t n_tokens, int64_t n_out) {
    graph::GraphParams params;
    params.n_tokens = n_tokens;
    params.n_out = n_out;
    params.n_seqs = n_tokens;
    params.kind = static_cast<int>(n_tokens * 65536 + n_out);
    return runner.prepare(params);
}

// ---- the mask thread ----------------------------------------------------------

MaskThread::~MaskThread() {
    if (!thread_.joinable()) return;
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void MaskThread::start(std::vector<SequenceSampler*> samplers) {
    if (samplers.empty()) return;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    {
        std::lock_guard<std::mutex> lk(mu_);
        MINFER_ASSERT(!busy_);
        jobs_ = std::move(samplers);
        busy_ = true;
    }
    cv_.notify_all();
}

void MaskThread::wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !busy_; });
}

void MaskThread::loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return busy_ || stop_; });
        if (stop_) return;
        std::vector<SequenceSampler*> jobs = std::move(jobs_);
        lk.unlock();
        for (SequenceSampler* s : jobs) {
            try {
                s->prepare_mask();
            } catch (...) {
                // left not ready: sample() computes it again and reports the error
            }
        }
        lk.lock();
        busy_ = false;
        cv_.notify_all();
    }
}

// ---- finishing --------------------------------------------------------------

void Engine::Impl::finish(Seq& s, FinishReason reason, std::string error) {
    if (s.state == Seq::State::Finished) return;
    kv.release_pages(s);
    s.state = Seq::State::Finished;
    RequestResult r;
    r.sample = s.sample;
    r.reason = reason;
    r.error = std::move(error);
    r.prompt_tokens = static_cast<int64_t>(s.req->params.prompt.size());
    r.cached_tokens = s.cached_tokens;
    r.generated = s.generated;
    const auto t_submit = s.req->t_submit;
    r.t_queue_ms = s.ever_admitted
                       ? std::chrono::duration<double, std::milli>(s.t_admit - t_submit).count()
                       : ms_since(t_submit);
    r.t_first_token_ms =
        s.generated > 0 ? std::chrono::duration<double, std::milli>(s.t_first - t_submit).count()
                        : 0.0;
    r.t_total_ms = ms_since(t_submit);
    r.mask_us = std::move(s.mask_us);
    finished.push_back({s.req, r});
}

void Engine::Impl::deliver_finished() {
    for (auto& [req, r] : finished)
        if (req->callbacks.on_finish) req->callbacks.on_finish(r);
    finished.clear();
}

void Engine::Impl::apply_cancels(const std::vector<RequestId>& ids) {
    for (RequestId id : ids)
        for (auto& s : seqs)
            if (s->req->id == id) finish(*s, FinishReason::Cancelled);
    retire();
}

void Engine::Impl::retire() {
    seqs.erase(std::remove_if(seqs.begin(), seqs.end(),
                              [](const auto& s) { return s->state == Seq::State::Finished; }),
               seqs.end());
}

// ---- sampling ---------------------------------------------------------------

// Returns false when the sequence finished.
bool Engine::Impl::sample(Seq& s, const float* logits) {
    const GenParams& gp = s.req->params;
    const std::span<const float> row(logits, static_cast<size_t>(model.hp.n_vocab));
    const GenerationState state{.n_sampled = s.generated,
                                .n_predict = gp.n_predict,
                                .n_cached = static_cast<int64_t>(s.tokens.size()),
                                .n_ctx = opt.n_ctx};
    const auto emit = [&](int32_t tok) {
        TokenEvent ev;
        ev.sample = s.sample;
        ev.token = tok;
        if (gp.top_logprobs >= 0) {
            TokenLogprobs lp = token_logprobs(row, tok, std::min<int32_t>(gp.top_logprobs, 20));
            ev.logprob = lp.logprob;
            ev.top = std::move(lp.top);
        }
        return !s.req->callbacks.on_token || s.req->callbacks.on_token(ev);
    };
    NextToken next;
    try {
        next = next_token(*s.sampler, row, state, emit);
    } catch (const Error& e) {
        finish(s, FinishReason::Error, e.what());  // a constraint with no token allowed
        return false;
    }
    if (next.token >= 0) {
        if (s.sampler->constrained()) s.mask_us.push_back(s.sampler->mask_us());
        if (s.generated == 0) s.t_first = Clock::now();
        ++s.generated;
        ++stats.generated_tokens;
    }
    if (next.end) {
        finish(s, *next.end);
        return false;
    }
    s.tokens.push_back(next.token);
    return true;
}

// ---- one step ------------------------------------------------------------------

bool Engine::Impl::take_incoming() {
    std::vector<std::shared_ptr<Request>> fresh;
    std::vector<RequestId> cancel_ids;
    {
        std::lock_guard<std::mutex> lk(mu);
        fresh.swap(incoming);
        cancel_ids.swap(cancels);
    }
    bool did = !finished.empty() || !fresh.empty();
    deliver_finished();
    for (auto& req : fresh) enqueue(req);
    if (!cancel_ids.empty()) {
        apply_cancels(cancel_ids);
        did = true;
    }
    return did;
}

// A sequence per sample of the request, each with its own sampler.
void Engine::Impl::enqueue(const std::shared_ptr<Request>& req) {
    for (int32_t k = 0; k < req->params.n_samples; ++k) {
        auto s = std::make_unique<Seq>();
        s->req = req;
        s->sample = k;
        s->tokens = req->params.prompt;
        SequenceSampling sp;
        sp.sampler = req->params.sampling;
        sp.sampler.seed += static_cast<uint64_t>(k);  // forks draw differently
        sp.presence_penalty = req->params.presence_penalty;
        sp.frequency_penalty = req->params.frequency_penalty;
        sp.ignore_eos = req->params.ignore_eos;
        sp.constraint = req->params.constraint;
        s->sampler = std::make_unique<SequenceSampler>(sp, eog);
        s->sampler->start_reply(s->tokens);
        stats.prompt_tokens += static_cast<int64_t>(s->tokens.size());
        seqs.push_back(std::move(s));
    }
}

bool Engine::Impl::step() {
    bool did = take_incoming();
    const StepPlan plan = sched.schedule(seqs);
    for (Seq* s : plan.rejected) finish(*s, FinishReason::ContextFull, "");
    if (plan.work.empty()) {
        retire();
        did |= !finished.empty();
        deliver_finished();
        publish_stats();
        return did;
    }
    const PassResult pass = run(plan);
    // KV written: advance, mark filled prompt pages ready.
    for (const SeqWork& w : plan.work) {
        w.seq->n_done = w.from + w.n;
        kv.mark_filled_pages_ready(*w.seq);
    }
    sample_pass(pass);
    retire();
    deliver_finished();
    publish_stats();
    return true;
}

// Each sequence of the pass gets a page-table row; padding tokens use one
// more row that maps the trash page and store nothing.
void Engine::Impl::fill_inputs(const StepPlan& plan, PassResult& pass) {
    const int64_t n_tok = plan.n_tok;
    const int64_t per_seq = runner.cparams().n_ctx / kPageCells;
    tok_ids.assign(static_cast<size_t>(n_tok), 0);
    positions.assign(static_cast<size_t>(n_tok), 0);
    cells.assign(static_cast<size_t>(n_tok), -1);
    rows.assign(static_cast<size_t>(n_tok), 0);
    page_rows.assign(static_cast<size_t>(n_tok * per_seq), kv.trash_page());
    int64_t t = 0, r = 0;
    for (const SeqWork& w : plan.work) {
        Seq& s = *w.seq;
        std::copy(s.pages.begin(), s.pages.end(), page_rows.begin() + r * per_seq);
        for (int64_t i = 0; i < w.n; ++i, ++t) {
            const int64_t p = w.from + i;
            tok_ids[static_cast<size_t>(t)] = s.tokens[static_cast<size_t>(p)];
            positions[static_cast<size_t>(t)] = static_cast<int32_t>(p);
            cells[static_cast<size_t>(t)] =
                s.pages[static_cast<size_t>(p / kPageCells)] * kPageCells + p % kPageCells;
            rows[static_cast<size_t>(t)] = static_cast<int32_t>(r);
        }
        if (w.from + w.n == static_cast<int64_t>(s.tokens.size()))
            pass.want.emplace_back(&s, t - 1);
        ++r;
    }
    for (; t < n_tok; ++t) rows[static_cast<size_t>(t)] = static_cast<int32_t>(r);
    const int64_t n_want = std::max<int64_t>(1, static_cast<int64_t>(pass.want.size()));
    // Logits rows: a power of two (fewer graph shapes), the wanted rows first.
    pass.n_tok = n_tok;
    pass.n_out = 1;
    while (pass.n_out < n_want) pass.n_out *= 2;
    pass.n_out = std::min(pass.n_out, n_tok);
    if (pass.n_out < n_tok) {
        const auto& want = pass.want;
        tail.assign(static_cast<size_t>(pass.n_out),
                    want.empty() ? 0 : static_cast<int32_t>(want.back().second));
        for (size_t i = 0; i < want.size(); ++i) tail[i] = static_cast<int32_t>(want[i].second);
    }
}

Engine::Impl::PassResult Engine::Impl::run(const StepPlan& plan) {
    PassResult pass;
    fill_inputs(plan, pass);
    graph::Graph& g = prepare(pass.n_tok, pass.n_out);
    pass.g = &g;
    runner.fill(g, "token_ids", tok_ids);
    runner.fill(g, "positions", positions);
    runner.fill(g, "kv_cells", cells);
    runner.fill(g, "kv_rows", rows);
    runner.fill(g, "kv_pages", page_rows);
    if (pass.n_out < pass.n_tok) runner.fill(g, "tail_ids", tail);
    // The constrained sequences' masks for this pass's samples, computed
    // while it runs; waited for before sampling (also when the pass throws:
    // the thread reads their samplers).
    mask_jobs.clear();
    for (const auto& [s, t_index] : pass.want)
        if (s->sampler->constrained() && !s->sampler->mask_ready())
            mask_jobs.push_back(s->sampler.get());
    struct WaitMasks {
        MaskThread& m;
        ~WaitMasks() { m.wait(); }
    } wait_masks{mask_thread};
    mask_thread.start(mask_jobs);
    runner.execute(g);
    if (!mask_jobs.empty()) {
        const auto t_wait = Clock::now();
        mask_thread.wait();
        stats.mask_wait_ms += ms_since(t_wait);
    }
    ++stats.steps;
    stats.last_pass_decode_tokens = plan.n_decode;
    stats.last_pass_prompt_tokens = plan.n_real - plan.n_decode;
    return pass;
}

void Engine::Impl::sample_pass(const PassResult& pass) {
    logits_row.resize(static_cast<size_t>(model.hp.n_vocab));
    for (size_t i = 0; i < pass.want.size(); ++i) {
        Seq& s = *pass.want[i].first;
        const size_t out_row =
            pass.n_out == pass.n_tok ? static_cast<size_t>(pass.want[i].second) : i;
        runner.read_logits(*pass.g, static_cast<int64_t>(out_row), 1, logits_row.data());
        if (logits_hook) logits_hook(s.req->id, s.sample, s.n_done - 1, logits_row);
        sample(s, logits_row.data());
    }
}

void Engine::Impl::publish_stats() {
    std::lock_guard<std::mutex> lk(mu);
    stats.running = 0;
    stats.waiting = static_cast<int64_t>(incoming.size());
    for (auto& s : seqs) {
        if (s->state == Seq::State::Running)
            ++stats.running;
        else
            ++stats.waiting;
    }
    stats.pages_total = kv.n_pages();
    stats.pages_used = kv.pool().n_used();
    stats.pages_cached = kv.pool().n_cached();
    stats.pages_free = kv.pool().n_free();
    stats.page_cells = kPageCells;
    stats.graphs_built = runner.graphs_built();
    stats.activation_bytes = runner.plan_bytes();
    snapshot = stats;
    finished_pending = static_cast<int64_t>(finished.size());
}

void Engine::Impl::check_pages() const {
    kv.check(seqs);
}

// ---- the public face -------------------------------------------------------

Engine::Engine(const model::Model& model, EngineOptions options)
    : impl_(std::make_unique<Impl>(model, options)) {}

Engine::~Engine() {
    // Shutdown: every unfinished sample ends Cancelled.
    for (auto& s : impl_->seqs) impl_->finish(*s, FinishReason::Cancelled);
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        for (auto& req : impl_->incoming)
            for (int32_t k = 0; k < req->params.n_samples; ++k) {
                RequestResult r;
                r.sample = k;
                r.reason = FinishReason::Cancelled;
                r.prompt_tokens = static_cast<int64_t>(req->params.prompt.size());
                impl_->finished.push_back({req, r});
            }
        impl_->incoming.clear();
    }
    impl_->deliver_finished();
}

RequestId Engine::submit(GenParams params, RequestCallbacks callbacks) {
    Impl& im = *impl_;
    const int64_t n_prompt = static_cast<int64_t>(params.prompt.size());
    if (n_prompt == 0) throw Error("the prompt is empty");
    if (n_prompt + 1 > im.opt.n_ctx)
        throw Error("the prompt has " + std::to_string(n_prompt) +
                    " tokens; with one generated token that exceeds the context of " +
                    std::to_string(im.opt.n_ctx) + " cells");
    for (int32_t t : params.prompt)
        if (t < 0 || t >= im.model.hp.n_vocab)
            throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                        std::to_string(im.model.hp.n_vocab - 1) + ")");
    if (params.n_samples < 1 || params.n_samples > im.opt.n_parallel)
        throw Error("n_samples = " + std::to_string(params.n_samples) +
                    " must be between 1 and the parallel sequences (" +
                    std::to_string(im.opt.n_parallel) + ")");
    if (params.top_logprobs > 20) throw Error("top_logprobs is limited to 20");
    if (params.constraint && params.constraint->masker->vocab().n_vocab() > im.model.hp.n_vocab)
        throw Error("the constraint's vocabulary has " +
                    std::to_string(params.constraint->masker->vocab().n_vocab()) +
                    " tokens, the model " + std::to_string(im.model.hp.n_vocab) +
                    ": it was compiled for another vocabulary");
    auto req = std::make_shared<Impl::Request>();
    req->params = std::move(params);
    req->callbacks = std::move(callbacks);
    req->t_submit = Clock::now();
    {
        std::lock_guard<std::mutex> lk(im.mu);
        req->id = im.next_id++;
        im.incoming.push_back(req);
    }
    im.cv.notify_all();
    return req->id;
}

void Engine::cancel(RequestId id) {
    Impl& im = *impl_;
    // Between steps (the step lock is free): the pages are freed at once;
    // the callbacks still run on the step thread, at the next step().
    // From a callback on the step thread: the step ends it.
    std::unique_lock<std::mutex> step_lk(im.step_mu, std::defer_lock);
    if (im.stepping_thread.load() != std::this_thread::get_id()) step_lk.try_lock();
    {
        std::lock_guard<std::mutex> lk(im.mu);
        // Not admitted yet: drop it from the queue.
        for (auto it = im.incoming.begin(); it != im.incoming.end(); ++it)
            if ((*it)->id == id) {
                for (int32_t k = 0; k < (*it)->params.n_samples; ++k) {
                    RequestResult r;
                    r.sample = k;
                    r.reason = FinishReason::Cancelled;
                    r.prompt_tokens = static_cast<int64_t>((*it)->params.prompt.size());
                    im.cancelled_queued.push_back({*it, r});
                }
                im.incoming.erase(it);
                break;
            }
        if (!step_lk.owns_lock()) im.cancels.push_back(id);
    }
    if (step_lk.owns_lock()) {
        im.apply_cancels({id});
        im.publish_stats();
    }
    im.cv.notify_all();
}

bool Engine::step() {
    Impl& im = *impl_;
    std::lock_guard<std::mutex> step_lk(im.step_mu);
    im.stepping_thread = std::this_thread::get_id();
    struct Clear {
        std::atomic<std::thread::id>& t;
        ~Clear() { t = std::thread::id(); }
    } clear{im.stepping_thread};
    {
        std::lock_guard<std::mutex> lk(im.mu);
        for (auto& f : im.cancelled_queued) im.finished.push_back(std::move(f));
        im.cancelled_queued.clear();
    }
    bool did = im.step();
    // Cancels that arrived during the step: freed now, reported next step.
    std::vector<RequestId> late;
    {
        std::lock_guard<std::mutex> lk(im.mu);
        late.swap(im.cancels);
    }
    if (!late.empty()) {
        im.apply_cancels(late);
        im.deliver_finished();
        im.publish_stats();
        did = true;
    }
    return did;
}

void Engine::wait_for_work(int ms) {
    Impl& im = *impl_;
    std::unique_lock<std::mutex> lk(im.mu);
    im.cv.wait_for(lk, std::chrono::milliseconds(ms), [&] {
        return !im.incoming.empty() || !im.cancels.empty() || !im.cancelled_queued.empty() ||
               im.finished_pending > 0;
    });
}

bool Engine::idle() const {
    const Impl& im = *impl_;
    std::lock_guard<std::mutex> lk(im.mu);
    return im.incoming.empty() && im.cancelled_queued.empty() && im.cancels.empty() &&
           im.snapshot.running == 0 && im.snapshot.waiting == 0 && im.finished_pending == 0;
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lk(impl_->mu);
    return impl_->snapshot;
}

std::vector<KvPageInfo> Engine::kv_pages() const {
    Impl& im = *impl_;
    std::lock_guard<std::mutex> step_lk(im.step_mu);
    std::vector<KvPageInfo> out(static_cast<size_t>(im.kv.n_pages()));
    for (int32_t p = 0; p < im.kv.n_pages(); ++p) {
        auto& info = out[static_cast<size_t>(p)];
        info.state = im.kv.pool().refs(p) > 0    ? KvPageInfo::State::Used
                     : im.kv.pool().published(p) ? KvPageInfo::State::Cached
                                                 : KvPageInfo::State::Free;
    }
    for (const auto& s : im.seqs)
        for (int32_t p : s->pages)
            out[static_cast<size_t>(p)].holders.emplace_back(s->req->id, s->sample);
    return out;
}

std::string Engine::kv_page_map() const {
    const std::vector<KvPageInfo> pages = kv_pages();
    std::map<std::pair<RequestId, int32_t>, char> letter;
    std::string out;
    int64_t used = 0, shared = 0, cached = 0, free = 0;
    for (size_t p = 0; p < pages.size(); ++p) {
        const auto& info = pages[p];
        char c = '.';
        if (info.state == KvPageInfo::State::Cached) {
            c = '-';
            ++cached;
        } else if (info.state == KvPageInfo::State::Used) {
            ++used;
            if (info.holders.size() > 1) {
                c = '#';
                ++shared;
            } else if (!info.holders.empty()) {
                auto [it, fresh] =
                    letter.emplace(info.holders[0], static_cast<char>('a' + letter.size() % 26));
                c = it->second;
            }
        } else {
            ++free;
        }
        out += c;
        if (p % 64 == 63) out += '\n';
    }
    if (!out.empty() && out.back() != '\n') out += '\n';
    return "KV pages (" + std::to_string(pages.size()) + " x " +
           std::to_string(graph::kKvPageCells) + " cells): " + std::to_string(used) + " used (" +
           std::to_string(shared) + " shared, #), " + std::to_string(cached) + " cached (-), " +
           std::to_string(free) + " free (.); a..z: the sequence holding the page\n" + out;
}

const model::Model& Engine::model() const {
    return impl_->model;
}
const EngineOptions& Engine::options() const {
    return impl_->opt;
}

}  // namespace minfer::runtime
