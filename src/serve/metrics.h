// The server's counters and latency histograms, written in Prometheus' text
// exposition format together with the engine's own gauges (sequences
// running and waiting, KV pages, prefix-cache hits, activation memory).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

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
    void request_done(int status);
    void first_token(double seconds);
    void inter_token(double seconds);
    std::string render(const runtime::EngineStats& s, bool ready) const;

  private:
    mutable std::mutex mu_;
    uint64_t requests_ok_ = 0, requests_client_error_ = 0, requests_server_error_ = 0;
    Histogram ttft_, itl_;
};

}  // namespace minfer::serve
