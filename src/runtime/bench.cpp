#include "runtime/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "util/error.h"

namespace minfer::runtime {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n_vocab, int64_t n) {
    std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(n_vocab - 1));
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = d(rng);
    return t;
}

void summarize(BenchResult& r) {
    const double n = static_cast<double>(r.samples_ts.size());
    if (r.samples_ts.empty()) return;
    double s = 0;
    for (double v : r.samples_ts) s += v;
    r.avg_ts = s / n;
    double ss = 0;
    for (double v : r.samples_ts) ss += (v - r.avg_ts) * (v - r.avg_ts);
    r.stddev_ts = r.samples_ts.size() > 1 ? std::sqrt(ss / (n - 1)) : 0.0;
}

// The weights are read in pieces of at most this many bytes (a tensor's
// tail is a shorter one), split evenly between the threads.
constexpr size_t kReadItem = size_t{512} << 10;
// How long stream_weights_gbps reads.
constexpr double kReadSeconds = 0.5;

// Sums the 64-bit words of [p, p + n) in four chains (n a multiple of 32).
uint64_t sum_words(const uint8_t* p, size_t n) {
    uint64_t s[4] = {};
    for (size_t i = 0; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
            uint64_t w;
            std::memcpy(&w, p + i + 8 * static_cast<size_t>(k), 8);
            s[k] += w;
        }
    return s[0] + s[1] + s[2] + s[3];
}

}  // namespace

double stream_weights_gbps(const model::Model& model, ThreadPool& pool, size_t limit) {
    struct Item {
        const uint8_t* p;
        size_t n;
    };
    std::vector<Item> items;
    size_t total = 0;
    for (const tensor::TensorView& w : model.weights()) {
        const auto* p = static_cast<const uint8_t*>(w.data);
        for (size_t off = 0; off + 32 <= w.nbytes && total < limit; off += kReadItem) {
            const size_t n = std::min(kReadItem, w.nbytes - off) / 32 * 32;
            items.push_back({p + off, n});
            total += n;
        }
    }
    if (total == 0) throw Error("bench: the model has no weight bytes to read");
    std::vector<uint64_t> sums(static_cast<size_t>(pool.size()) * 8, 0);  // a line per thread
    // The session's workers block after a few milliseconds idle; until then
    // they would share the cores with the reads (and the reads' workers
    // with the decode after them: the same pause at the end).
    const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
    settle();
    // Whole passes for at least kReadSeconds: the mean rate over a stretch
    // of time, as a decode repetition's is (one short read would catch a
    // lull or a burst of the host's other load).
    double bytes = 0, seconds = 0;
    const auto t0 = Clock::now();
    while (seconds < kReadSeconds) {
        // each thread its contiguous share of the items, as the MemRead
        // benchmark reads its buffer: the fastest plain read (items handed
        // out one by one read no faster)
        pool.run([&](int ith, int nth) {
            const auto share = [&](int k) {
                return items.size() * static_cast<size_t>(k) / static_cast<size_t>(nth);
            };
            uint64_t acc = 0;
            for (size_t i = share(ith); i < share(ith + 1); ++i)
                acc += sum_words(items[i].p, items[i].n);
            sums[static_cast<size_t>(ith) * 8] += acc;
        });
        bytes += static_cast<double>(total);
        seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    // the sums are used, so the reads are not dropped
    volatile uint64_t sink = 0;
    for (uint64_t v : sums) sink = sink + v;
    settle();
    return bytes / seconds / 1e9;
}

int64_t model_params(const model::Model& model) {
    int64_t n = 0;
    for (const auto& t : model.file.tensors()) n += t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    return n;
}

double decode_bytes_per_token(const model::Model& model) {
    double bytes = 0;
    for (const auto& t : model.file.tensors()) {
        if (model.tok_embd && t.name == model.tok_embd->name && !model.tied_output) {
            bytes += static_cast<double>(t.nbytes) / static_cast<double>(t.ne[1]);
            continue;
        }
        // a token reads its n_expert_used experts' slices of a 3-D expert tensor
        const bool experts = model.hp.moe() && t.name.find("_exps.") != std::string::npos;
        bytes += experts
                     ? static_cast<double>(t.nbytes) * static_cast<double>(model.hp.n_expert_used) /
                           static_cast<double>(model.hp.n_expert)
                     : static_cast<double>(t.nbytes);
    }
    return bytes;
}

double prompt_ops(const model::Model& model, int64_t n, int64_t n_depth) {
    const auto& hp = model.hp;
    const double nt = static_cast<double>(n);
    const double per_layer =
        static_cast<double>(hp.n_embd) * static_cast<double>(hp.n_embd_q() + 2 * hp.n_embd_kv()) +
        static_cast<double>(hp.n_embd_q()) * static_cast<double>(hp.n_embd) +
        3.0 * static_cast<double>(hp.n_embd) *
            static_cast<double>(hp.moe() ? hp.n_expert_used * hp.n_ff_exp + hp.n_ff_shexp
                                         : hp.n_ff) +
        (hp.moe() ? static_cast<double>(hp.n_embd) * static_cast<double>(hp.n_expert) : 0.0);
    double ops = 2.0 * nt * per_layer * static_cast<double>(hp.n_layer);
    // Attention: token t sees n_depth + t + 1 keys; QK^T and PV, head_dim
    // each, per head.
    const double pairs = nt * (nt + 1) / 2 + nt * static_cast<double>(n_depth);
    ops += 2.0 * 2.0 * pairs * static_cast<double>(hp.n_embd_q()) * static_cast<double>(hp.n_layer);
    ops += 2.0 * static_cast<double>(hp.n_embd) * static_cast<double>(hp.n_vocab);
    return ops;
}

std::vector<BenchResult> run_bench(const model::Model& model, const BenchParams& p) {
    if (p.n_prompt < 0 || p.n_gen < 0 || p.n_depth < 0)
        throw Error("bench: -p, -n and -d must be >= 0");
    if (p.reps < 1) throw Error("bench: -r must be >= 1");
    SessionOptions so = p.session;
    so.n_ctx = std::max<int64_t>(1, p.n_depth + p.n_prompt + p.n_gen);
    Session session(model, so);
    if (p.on_start) p.on_start(session);
    std::mt19937 rng(p.seed);
    const int64_t n_vocab = model.hp.n_vocab;
    std::vector<BenchResult> out;
    const std::string at_depth = p.n_depth > 0 ? " @ d" + std::to_string(p.n_depth) : "";

    // The depth, untimed and once: rows [0, n_depth) stay valid because a
    // test only writes rows from n_depth on and truncate() keeps the rest.
    if (p.n_depth > 0 && (p.n_prompt > 0 || p.n_gen > 0))
        (void)session.eval(random_tokens(rng, n_vocab, p.n_depth));

    if (p.n_prompt > 0) {
        BenchResult r;
        r.test = "pp" + std::to_string(p.n_prompt) + at_depth;
        r.n_prompt = p.n_prompt;
        r.n_depth = p.n_depth;
        const std::vector<int32_t> tokens = random_tokens(rng, n_vocab, p.n_prompt);
        for (int rep = -1; rep < p.reps; ++rep) {  // rep -1: the warm-up
            session.truncate(p.n_depth);
            const auto t0 = Clock::now();
            (void)session.eval(tokens);
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (rep >= 0) r.samples_ts.push_back(static_cast<double>(p.n_prompt) / s);
        }
        summarize(r);
        r.gops = prompt_ops(model, p.n_prompt, p.n_depth) * r.avg_ts /
                 static_cast<double>(p.n_prompt) / 1e9;
        out.push_back(std::move(r));
    }
    if (p.n_gen > 0) {
        BenchResult r;
        r.test = "tg" + std::to_string(p.n_gen) + at_depth;
        r.n_gen = p.n_gen;
        r.n_depth = p.n_depth;
        const std::vector<int32_t> tokens = random_tokens(rng, n_vocab, p.n_gen);
        const double bytes = decode_bytes_per_token(model);
        // The reads run on a pool of the session's size, pausing before and
        // after so that each pool's idle workers block before the other's
        // run (stream_weights_gbps).
        std::optional<ThreadPool> read_pool;
        if (p.roofline) read_pool.emplace(session.options().n_threads);
        double read_before = 0;
        for (int rep = -1; rep < p.reps; ++rep) {
            session.truncate(p.n_depth);
            const int64_t n = rep < 0 ? 1 : p.n_gen;  // llama-bench warms up with one token
            if (p.roofline && rep == 0) read_before = stream_weights_gbps(model, *read_pool);
            const auto t0 = Clock::now();
            for (int64_t i = 0; i < n; ++i)
                (void)session.eval(std::span<const int32_t>(&tokens[static_cast<size_t>(i)], 1));
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (rep < 0) continue;
            r.samples_ts.push_back(static_cast<double>(n) / s);
            r.samples_gbps.push_back(bytes * static_cast<double>(n) / s / 1e9);
            if (p.roofline) {
                const double read_after = stream_weights_gbps(model, *read_pool);
                r.read_gbps.push_back(std::max(read_before, read_after));
                read_before = read_after;
            }
        }
        summarize(r);
        r.gbps = bytes * r.avg_ts / 1e9;
        out.push_back(std::move(r));
    }
    if (p.on_finish) p.on_finish(session);
    return out;
}

}  // namespace minfer::runtime
