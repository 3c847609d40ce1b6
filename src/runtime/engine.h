// Many sequences over one model: the runtime's scheduler for continuous
// batching. Requests are admitted between steps; every step packs each
// running sequence's next token plus prompt chunks of waiting ones (within
// the token budget n_batch) into ONE forward pass, samples each sequence
// with its own sampler, and retires finished ones. The KV cache is a pool of
// fixed-size pages shared by all sequences (no per-sequence split); full
// pages of prompt tokens are shared between sequences with the same prefix.
//
// The contract between this engine and its callers (the CLI's batched-bench,
// the HTTP server, tests). Thread safety: submit(), cancel() and stats() may
// be called from any thread; step() from one thread at a time (the caller's
// engine loop). Callbacks run on the thread calling step() and must be quick.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/pass_options.h"
#include "model/model.h"
#include "runtime/generation.h"
#include "runtime/sampler.h"
#include "structured/constraint.h"
#include "tensor/dtype.h"

namespace minfer::runtime {

using RequestId = int64_t;

struct EngineOptions {
    int64_t n_ctx = 8192;    // KV cells shared by all sequences (-c)
    int64_t n_batch = 512;   // tokens per forward pass at most (-b): the step's budget
    int32_t n_parallel = 8;  // sequences decoding at once at most (-np); each sample counts
    int n_threads = 0;       // 0: physical cores
    tensor::DType kv_type_k = tensor::DType::F16;
    tensor::DType kv_type_v = tensor::DType::F16;
    bool prefix_cache = true;  // share full pages of identical prompt prefixes
    // Hold every decode token while an admitted sequence still has prompt
    // tokens to compute (batched-bench's two phases); off: decode tokens
    // always go first.
    bool prefill_first = false;
    graph::FuseOptions fuse = graph::fuse_options_from_env();
    graph::Planner planner = graph::planner_from_env();
    // Every matmul through the GEMM path (SessionOptions::batch_invariant):
    // bitwise the logits of a sequence alone whatever the weights' layout.
    bool batch_invariant = false;
    // End-of-generation tokens; empty: the model file's tokenizer's (none
    // when the file has no vocabulary).
    std::vector<int32_t> eog_ids;
};

struct GenParams {
    std::vector<int32_t> prompt;     // token ids; must be non-empty
    int64_t n_predict = -1;          // -1: until an end-of-generation token or the context end
    SamplerParams sampling;          // temp, top_k, top_p, min_p, seed, repeat penalty
    float presence_penalty = 0.0f;   // OpenAI's: subtracted once per token seen in the output
    float frequency_penalty = 0.0f;  // OpenAI's: subtracted per occurrence in the output
    bool ignore_eos = false;
    int32_t n_samples = 1;  // parallel samples forked from one prompt (share its pages)
    // -1: no logprobs; 0..20: the chosen token's and the top N. They are the
    // model's distribution (log-softmax of its logits), before penalties and
    // before a constraint's mask, as vLLM's default: a token the grammar
    // forced shows how likely the model found it, and the top N may name
    // tokens the grammar refused (never sampled).
    int32_t top_logprobs = -1;
    // Structured output: each sample's tokens are masked to those that keep
    // its output a prefix of a sentence of this grammar, and end of
    // generation is allowed only where the output is complete; a sample whose
    // output is complete and cannot go on ends there (Stop, even with
    // ignore_eos). Its vocabulary must be the model's. null: none.
    std::shared_ptr<const structured::Constraint> constraint;
};

struct TokenEvent {
    int32_t sample = 0;  // 0 .. n_samples-1
    int32_t token = 0;
    float logprob = 0.0f;                        // when top_logprobs >= 0
    std::vector<std::pair<int32_t, float>> top;  // [top_logprobs] (token, logprob)
};

struct RequestResult {
    int32_t sample = 0;
    FinishReason reason = FinishReason::Stop;
    std::string error;          // with FinishReason::Error
    int64_t prompt_tokens = 0;  // of the request
    int64_t cached_tokens = 0;  // prompt tokens not computed: shared pages, copied cells
    int64_t generated = 0;      // tokens sampled for this sample
    double t_queue_ms = 0, t_first_token_ms = 0, t_total_ms = 0;  // from submit()
    // With a constraint: per sampled token, the microseconds of CPU time its
    // mask took to compute (on the engine's mask thread, while the forward
    // pass ran); empty without one.
    std::vector<float> mask_us;
};

struct RequestCallbacks {
    // Each sampled token. Return false to finish this sample now (stop string
    // found by the caller): reason Stop.
    std::function<bool(const TokenEvent&)> on_token;
    // Once per sample, last.
    std::function<void(const RequestResult&)> on_finish;
};

struct EngineStats {
    int64_t running = 0, waiting = 0;          // sequences
    int64_t pages_total = 0, pages_used = 0;   // used: held by at least one sequence
    int64_t pages_cached = 0, pages_free = 0;  // cached: no holder, kept for prefix reuse
    int64_t page_cells = 0;                    // cells per page
    // Prompt tokens not computed (mapped pages and copied cells) out of those
    // that could have been (every prompt token but the last): hit rate =
    // hit / lookup. copied_cells: the part copied from running sequences.
    int64_t prefix_hit_tokens = 0, prefix_lookup_tokens = 0, copied_cells = 0;
    int64_t prompt_tokens = 0, generated_tokens = 0;       // totals since start
    int64_t steps = 0, graphs_built = 0, preemptions = 0;  // steps: forward passes run
    // The last pass's tokens (padding not counted): decode tokens (one per
    // sequence whose next sample follows from its single token in the pass)
    // and prompt tokens (chunks of prompts still being computed).
    int64_t last_pass_decode_tokens = 0, last_pass_prompt_tokens = 0;
    size_t activation_bytes = 0;  // activation memory held (all plans)
    // Constrained sequences: milliseconds sampling waited for their masks
    // after the forward pass had ended (the part of the mask work the pass
    // did not hide), since start.
    double mask_wait_ms = 0;
};

// One page of the KV cache, for reports: its state and who holds it.
struct KvPageInfo {
    enum class State : uint8_t { Free, Cached, Used };
    State state = State::Free;
    std::vector<std::pair<RequestId, int32_t>> holders;  // (request, sample); > 1: shared
};

class Engine {
  public:
    Engine(const model::Model& model, EngineOptions options);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Queues a request. Throws minfer::Error, naming the counts, when it can
    // never run (empty prompt, prompt + 1 > n_ctx, a token id out of range,
    // n_samples > n_parallel): nothing is queued then.
    RequestId submit(GenParams params, RequestCallbacks callbacks);
    // Finishes every sample of the request with Cancelled and frees its
    // pages (at once when the engine is between steps, else at the end of
    // the running step). Unknown or finished ids are ignored.
    void cancel(RequestId id);
    // One step: admit, pack, one forward pass, sample, retire. Returns false
    // when there was nothing to do.
    bool step();
    // Blocks until a request is queued or `ms` pass (the caller's idle loop).
    void wait_for_work(int ms);
    bool idle() const;

    EngineStats stats() const;
    // Every page of the KV cache (waits for a running step to end).
    std::vector<KvPageInfo> kv_pages() const;
    // The page map as text, one character a page ('.' free, '-' cached,
    // 'a'..'z' the holding sequence, '#' shared by several), 64 a line.
    std::string kv_page_map() const;
    const model::Model& model() const;
    const EngineOptions& options() const;

    struct Impl;
    Impl& impl() { return *impl_; }

  private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace minfer::runtime
