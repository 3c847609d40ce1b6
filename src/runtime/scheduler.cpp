#include <algorithm>
#include <chrono>

#include "runtime/scheduler_impl.h"
#include "util/error.h"

namespace minfer::runtime {

namespace {

// A pass costs about as much as this many more tokens in a pass: every
// pass streams all the weights, which takes as long as computing ~12 tokens
// (the ratio hardly depends on the model's size, both scale with its
// weights). So padding a pass by fewer tokens beats cutting them off into
// passes of their own: a 40-token prompt joining a running decode pads 41 to
// 48 in one pass rather than taking four passes (of 32, 8, 2 and 2 tokens).
constexpr int64_t kPassTokens = 12;

// Token-count buckets: powers of two and 1.5x powers of two, so padding
// wastes at most a third and a steady workload reuses a handful of graphs.
int64_t bucket_up(int64_t n, int64_t cap) {
    for (int64_t p = 1;; p *= 2) {
        if (p >= n) return std::min(p, cap);
        if (p >= 4 && p + p / 2 >= n) return std::min(p + p / 2, cap);
    }
}
int64_t bucket_down(int64_t n) {
    int64_t best = 1;
    for (int64_t p = 1; p <= n; p *= 2) {
        best = p;
        if (p >= 4 && p + p / 2 <= n) best = p + p / 2;
    }
    return best;
}

}  // namespace

Scheduler::Scheduler(const EngineOptions& opt, KvStore& kv, EngineStats& stats,
                     CopyCells copy_cells)
    : opt_(opt), kv_(kv), stats_(stats), copy_cells_(std::move(copy_cells)) {}

StepPlan Scheduler::schedule(std::vector<std::unique_ptr<Sequence>>& seqs) {
    StepPlan plan;
    admit_in_order(seqs, plan);
    grow(seqs);
    pack(seqs, plan);
    if (!plan.work.empty()) cut_to_bucket(plan);
    return plan;
}

bool Scheduler::admit(Sequence& s) {
    if (!kv_.map_prefix_and_reserve(s)) return false;
    if (opt_.prefix_cache) {
        const int64_t copied = copy_cells_(s);
        stats_.copied_cells += copied;
        s.n_done += copied;
        kv_.mark_filled_pages_ready(s);  // pages the copy filled whole
    }
    if (!s.ever_admitted) {
        s.cached_tokens = s.n_done;
        s.t_admit = std::chrono::steady_clock::now();
        stats_.prefix_hit_tokens += s.n_done;
        stats_.prefix_lookup_tokens += static_cast<int64_t>(s.tokens.size()) - 1;
        s.ever_admitted = true;
    }
    s.admit_order = ++admit_counter_;
    s.state = Sequence::State::Running;
    return true;
}

// Admit in order (preempted sequences were put first), while fewer than
// n_parallel run and their pages fit; the first that does not fit waits and
// so do all after it (no overtaking).
void Scheduler::admit_in_order(std::vector<std::unique_ptr<Sequence>>& seqs, StepPlan& plan) {
    int64_t running = 0;
    for (auto& s : seqs) running += s->running();
    std::stable_sort(seqs.begin(), seqs.end(), [](const auto& a, const auto& b) {
        // running first, by admission; then queued: preempted (admitted
        // before) first, then by arrival
        auto key = [](const Sequence& s) {
            return std::make_pair(s.running()       ? 0
                                  : s.ever_admitted ? 1
                                                    : 2,
                                  s.running() ? s.admit_order : 0);
        };
        return key(*a) < key(*b);
    });
    for (auto& s : seqs) {
        if (s->state != Sequence::State::Queued) continue;
        if (running >= opt_.n_parallel) break;
        if (!admit(*s)) {
            if (running == 0) {
                // Even an empty cache cannot hold it (pages held by nobody
                // are all available): it can never run.
                plan.rejected.push_back(s.get());
                continue;
            }
            break;
        }
        ++running;
    }
}

// A decoding sequence whose next cell starts a page needs one. When the pool
// is empty, preempt the most recently admitted running sequence (its pages
// back, recomputed later), possibly itself.
void Scheduler::grow(std::vector<std::unique_ptr<Sequence>>& seqs) {
    for (size_t i = 0; i < seqs.size(); ++i) {
        Sequence& s = *seqs[i];
        if (!s.running()) continue;
        while (s.running() && static_cast<int64_t>(s.pages.size()) * kPageCells <
                                  static_cast<int64_t>(s.tokens.size())) {
            const int32_t p = kv_.pool().take();
            if (p >= 0) {
                s.pages.push_back(p);
                break;
            }
            Sequence* victim = nullptr;
            for (auto& o : seqs)
                if (o->running() && (!victim || o->admit_order > victim->admit_order))
                    victim = o.get();
            preempt(*victim);
        }
    }
}

// Decode tokens first (one per sequence), then prompt chunks, within n_batch.
// With prefill_first, decode tokens wait while a prompt is being computed.
void Scheduler::pack(std::vector<std::unique_ptr<Sequence>>& seqs, StepPlan& plan) {
    bool hold_decode = false;
    if (opt_.prefill_first)
        for (auto& s : seqs)
            if (s->running() && (s->left() > 1 || claim_pages_or_preempt(*s))) hold_decode = true;
    for (int pass = hold_decode ? 1 : 0; pass < 2; ++pass) {
        for (auto& s : seqs) {
            if (!s->running() || plan.n_real >= opt_.n_batch) continue;
            if (claim_pages_or_preempt(*s) || !s->running()) continue;
            const int64_t left = s->left();
            if ((left == 1) != (pass == 0)) continue;
            const int64_t n = std::min(left, opt_.n_batch - plan.n_real);
            plan.work.push_back({s.get(), s->n_done, n});
            plan.n_real += n;
            if (pass == 0) ++plan.n_decode;
        }
    }
}

// Pad up to the next bucket, unless prompt tokens can be cut to the bucket
// below (left for the next pass) because the padding would waste more than
// an eighth of the pass and more than kPassTokens.
void Scheduler::cut_to_bucket(StepPlan& plan) const {
    plan.n_tok = bucket_up(plan.n_real, opt_.n_batch);
    if (plan.n_tok <= plan.n_real || plan.n_real <= plan.n_decode) return;
    const int64_t down = bucket_down(plan.n_real), pad = plan.n_tok - plan.n_real;
    if (!(pad * 8 > plan.n_real && pad > kPassTokens && down >= plan.n_decode + 1)) return;
    int64_t cut = plan.n_real - down;
    for (auto it = plan.work.rbegin(); it != plan.work.rend() && cut > 0; ++it) {
        if (it->n == 1 && it->from + 1 == static_cast<int64_t>(it->seq->tokens.size()))
            continue;  // a decode token
        const int64_t c = std::min(cut, it->n);
        it->n -= c;
        cut -= c;
    }
    auto& w = plan.work;
    w.erase(std::remove_if(w.begin(), w.end(), [](const SeqWork& x) { return x.n == 0; }), w.end());
    plan.n_real = down;
    plan.n_tok = down;
}

bool Scheduler::claim_pages_or_preempt(Sequence& s) {
    graph::KvPagePool& pool = kv_.pool();
    for (int64_t i = 0; i < s.n_hit_pages; ++i) {
        const int32_t p = s.pages[static_cast<size_t>(i)];
        if (pool.ready(p)) continue;
        if (pool.published(p)) return true;
        // Orphaned: recompute from page i on, in fresh pages.
        const auto n_keep = static_cast<size_t>(i);
        for (size_t j = n_keep; j < s.pages.size(); ++j) pool.unref(s.pages[j]);
        const int64_t n_more = static_cast<int64_t>(s.pages.size() - n_keep);
        s.pages.resize(n_keep);
        s.n_hit_pages = i;
        s.n_done = i * kPageCells;
        s.cached_tokens = std::min(s.cached_tokens, s.n_done);
        for (int64_t j = 0; j < n_more; ++j) {
            const int32_t np = pool.take();
            if (np < 0) {
                preempt(s);
                return true;
            }
            s.pages.push_back(np);
        }
        return false;
    }
    return false;
}

void Scheduler::preempt(Sequence& s) {
    kv_.release_pages(s);
    s.state = Sequence::State::Queued;
    s.admit_order = 0;
    ++stats_.preemptions;
}

}  // namespace minfer::runtime
