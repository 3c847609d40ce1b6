#include "serve/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "util/quantile.h"

namespace minfer::serve {

void Histogram::observe(double s) {
    for (size_t i = 0; i < kBounds.size(); ++i)
        if (s <= kBounds[i]) ++buckets_[i];
    ++count_;
    sum_ += s;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
    char line[256];
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (size_t i = 0; i < kBounds.size(); ++i) {
        std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name.c_str(), kBounds[i],
                      static_cast<unsigned long long>(buckets_[i]));
        out += line;
    }
    std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n",
                  name.c_str(), static_cast<unsigned long long>(count_), name.c_str(), sum_,
                  name.c_str(), static_cast<unsigned long long>(count_));
    out += line;
}

void Metrics::constrained_request(const std::string& kind, bool cache_hit, double compile_ms) {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < kConstraintKinds.size(); ++i)
        if (kind == kConstraintKinds[i]) ++constrained_[i];
    if (cache_hit) {
        ++constraint_hits_;
    } else {
        ++constraint_misses_;
        compile_.observe(compile_ms / 1e3);
    }
}

void Metrics::mask_times(const std::vector<float>& us) {
    std::lock_guard<std::mutex> lk(mu_);
    for (float x : us) {
        if (mask_us_.size() < kMaskWindow)
            mask_us_.push_back(x);
        else
            mask_us_[mask_next_] = x;
        mask_next_ = (mask_next_ + 1) % kMaskWindow;
        mask_sum_us_ += x;
        ++mask_count_;
    }
}

void Metrics::constraint_refused() {
    std::lock_guard<std::mutex> lk(mu_);
    ++constraint_refused_;
}

void Metrics::request_done(int status) {
    std::lock_guard<std::mutex> lk(mu_);
    if (status < 400)
        ++requests_ok_;
    else if (status < 500)
        ++requests_client_error_;
    else
        ++requests_server_error_;
}

void Metrics::first_token(double s) {
    std::lock_guard<std::mutex> lk(mu_);
    ttft_.observe(s);
}

void Metrics::inter_token(double s) {
    std::lock_guard<std::mutex> lk(mu_);
    itl_.observe(s);
}

std::string Metrics::render(const runtime::EngineStats& s, bool ready) const {
    std::string out;
    auto gauge = [&](const char* name, const char* help, double v, const char* type = "gauge") {
        char line[512];
        std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                      type, name, v);
        out += line;
    };
    gauge("minfer_ready", "1 once the model is loaded", ready ? 1 : 0);
    gauge("minfer_requests_running", "sequences being decoded", static_cast<double>(s.running));
    gauge("minfer_requests_waiting", "sequences queued", static_cast<double>(s.waiting));
    gauge("minfer_prompt_tokens_total", "prompt tokens evaluated",
          static_cast<double>(s.prompt_tokens), "counter");
    gauge("minfer_generated_tokens_total", "tokens generated",
          static_cast<double>(s.generated_tokens), "counter");
    gauge("minfer_kv_pages_total", "KV cache pages", static_cast<double>(s.pages_total));
    gauge("minfer_kv_pages_used", "KV pages held by at least one sequence",
          static_cast<double>(s.pages_used));
    gauge("minfer_kv_pages_cached", "KV pages held by none, kept for prefix reuse",
          static_cast<double>(s.pages_cached));
    gauge("minfer_kv_pages_free", "KV pages free", static_cast<double>(s.pages_free));
    gauge("minfer_kv_page_cells", "token cells per KV page", static_cast<double>(s.page_cells));
    gauge("minfer_prefix_cache_hit_tokens_total",
          "prompt tokens not computed: taken from shared pages or copied from running sequences",
          static_cast<double>(s.prefix_hit_tokens), "counter");
    gauge("minfer_prefix_cache_lookup_tokens_total",
          "prompt tokens that could have been taken (all but each prompt's last)",
          static_cast<double>(s.prefix_lookup_tokens), "counter");
    gauge("minfer_prefix_cache_copied_cells_total",
          "of the hit tokens, those copied from running sequences' pages",
          static_cast<double>(s.copied_cells), "counter");
    gauge("minfer_engine_steps_total", "engine steps (forward passes)",
          static_cast<double>(s.steps), "counter");
    gauge("minfer_activation_bytes", "activation memory held",
          static_cast<double>(s.activation_bytes));
    std::lock_guard<std::mutex> lk(mu_);
    out +=
        "# HELP minfer_http_requests_total HTTP requests answered, by status class\n"
        "# TYPE minfer_http_requests_total counter\n";
    out += "minfer_http_requests_total{class=\"2xx\"} " + std::to_string(requests_ok_) + "\n";
    out += "minfer_http_requests_total{class=\"4xx\"} " + std::to_string(requests_client_error_) +
           "\n";
    out += "minfer_http_requests_total{class=\"5xx\"} " + std::to_string(requests_server_error_) +
           "\n";
    ttft_.write(out, "minfer_time_to_first_token_seconds", "time from request to first token");
    itl_.write(out, "minfer_inter_token_latency_seconds", "time between streamed tokens");
    out +=
        "# HELP minfer_constrained_requests_total requests whose reply follows a grammar, by "
        "kind\n# TYPE minfer_constrained_requests_total counter\n";
    for (size_t i = 0; i < kConstraintKinds.size(); ++i)
        out += std::string("minfer_constrained_requests_total{kind=\"") + kConstraintKinds[i] +
               "\"} " + std::to_string(constrained_[i]) + "\n";
    gauge("minfer_constraint_cache_hits_total",
          "constrained requests whose grammar was already compiled (cached by its text)",
          static_cast<double>(constraint_hits_), "counter");
    gauge("minfer_constraint_cache_misses_total", "constrained requests whose grammar was compiled",
          static_cast<double>(constraint_misses_), "counter");
    gauge("minfer_constraint_refused_total",
          "grammars that did not compile (the request answered 400)",
          static_cast<double>(constraint_refused_), "counter");
    compile_.write(out, "minfer_constraint_compile_seconds",
                   "time to parse and compile a grammar (cache misses)");
    char line[256];
    out +=
        "# HELP minfer_constraint_mask_microseconds time to compute a constrained token's mask "
        "(CPU, on the mask thread; quantiles of the last 65536 tokens)\n"
        "# TYPE minfer_constraint_mask_microseconds summary\n";
    for (double q : {0.5, 0.99}) {
        std::snprintf(line, sizeof line,
                      "minfer_constraint_mask_microseconds{quantile=\"%g\"} %.17g\n", q,
                      quantile(mask_us_, q));
        out += line;
    }
    std::snprintf(line, sizeof line,
                  "minfer_constraint_mask_microseconds_sum %.17g\n"
                  "minfer_constraint_mask_microseconds_count %llu\n",
                  mask_sum_us_, static_cast<unsigned long long>(mask_count_));
    out += line;
    gauge("minfer_constraint_mask_wait_seconds_total",
          "time sampling waited for masks after the forward pass had ended (the mask work the "
          "pass did not hide)",
          s.mask_wait_ms / 1e3, "counter");
    return out;
}

}  // namespace minfer::serve
