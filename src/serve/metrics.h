// The server's counters and latency histograms, written in Prometheus' text
// exposition format together with the engine's own gauges (sequences
// running and waiting, KV pages, prefix-cache hits, activation memory).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace minfer::serve {

class Histogram {
  public:
    static constexpr std::array<double, 12> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                                       0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
    void observe(double seconds);
    // Lines of a histogram named `name` (seconds), cumulative buckets.
    void write(std::string& out, const std::string& name, const std::string& help) const;

  private:
    std::array<uint64_t, kBounds.size()> buckets_{};
    uint64_t count_ = 0;
    double sum_ = 0;
};

class Metrics {
  public:
    // The kinds of structured-output constraint a request may carry
    // (CompletionRequest::grammar_kind).
    static constexpr std::array<const char*, 4> kConstraintKinds = {"json_object", "json_schema",
                                                                    "grammar", "tool_call"};

    void request_done(int status);
    void first_token(double seconds);
    void inter_token(double seconds);
    // A constrained request: its kind, whether its grammar came compiled
    // from the cache, and (on a miss) the compile time.
    void constrained_request(const std::string& kind, bool cache_hit, double compile_ms);
    void constraint_refused();  // a grammar that does not compile (answered 400)
    // A constrained sample's mask time per sampled token (RequestResult::mask_us).
    void mask_times(const std::vector<float>& us);
    std::string render(const runtime::EngineStats& s, bool ready) const;

  private:
    mutable std::mutex mu_;
    uint64_t requests_ok_ = 0, requests_client_error_ = 0, requests_server_error_ = 0;
    Histogram ttft_, itl_;
    std::array<uint64_t, kConstraintKinds.size()> constrained_{};
    uint64_t constraint_hits_ = 0, constraint_misses_ = 0, constraint_refused_ = 0;
    Histogram compile_;
    // The last kMaskWindow mask times (a ring): /metrics' p50 and p99 are
    // those of recent tokens; sum and count are since start.
    static constexpr size_t kMaskWindow = 1 << 16;
    std::vector<float> mask_us_;
    size_t mask_next_ = 0;
    double mask_sum_us_ = 0;
    uint64_t mask_count_ = 0;
};

}  // namespace minfer::serve
