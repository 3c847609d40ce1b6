// Structured output end to end: every schema of the corpus through the
// engine, on a random-weight model with Qwen's real vocabulary (nothing but
// the mask keeps its output valid), greedy and at temperature 1, all
// requests batched together; each complete output validated by
// python3-jsonschema (scripts/validate_json.py).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/engine.h"
#include "sanitizer.h"
#include "shared_files.h"
#include "structured/constraint.h"
#include "structured/json_schema.h"
#include "structured_corpus.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"

using namespace minfer;
using minfer::testing::CorpusSchema;

TEST(StructuredEngine, EveryCorpusSchemaValidatesAtTemperatureZeroAndOne) {
    const std::string path = minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf");
    MINFER_REQUIRE_SHARED_FILES(path);
    if (!minfer::testing::python_jsonschema_available())
        GTEST_SKIP()
            << "python3 with jsonschema is missing (scripts/setup.sh installs python3-jsonschema)";
    const model::Model m = model::Model::load(path);
    const auto tok = tokenizer::Tokenizer::from_gguf(m.file);
    const auto corpus = minfer::testing::load_schema_corpus();
    ASSERT_GE(corpus.size(), 50u);
    // One constraint per schema, shared by both temperatures: each node's
    // mask over the 151,936 tokens is built once, on first use.
    structured::ConstraintCache constraints(std::make_shared<const structured::TokenVocab>(
        structured::TokenVocab::from_tokenizer(tok)));
    double compile_ms = 0;

    runtime::EngineOptions o;
    o.n_ctx = 16 * 320;
    o.n_batch = 256;
    o.n_parallel = 16;
    o.n_threads = 2;
    runtime::Engine e(m, o);
    struct Out {
        const CorpusSchema* schema = nullptr;
        float temp = 0;
        std::vector<int32_t> tokens;
        runtime::RequestResult result;
    };
    std::vector<Out> outs;
    outs.reserve(corpus.size() * 2);
    const std::vector<int32_t> prompt = tok.encode("Reply with JSON only.", false);
    for (const float temp : {0.0f, 1.0f})
        for (size_t i = 0; i < corpus.size(); ++i) {
            if (!minfer::testing::in_sanitized_subset(i)) continue;
            const auto& c = corpus[i];
            bool hit = false;
            auto constraint = constraints.get(structured::json_schema_to_gbnf(c.schema), &hit);
            if (!hit) compile_ms += constraint->compile_ms;
            outs.push_back({&c, temp, {}, {}});
            Out* out = &outs.back();
            runtime::GenParams gp;
            gp.prompt = prompt;
            // Bounded: most outputs end well before; the rest end Length.
            gp.n_predict = 160;
            gp.sampling.temp = temp;
            gp.sampling.seed = outs.size();
            gp.constraint = constraint;
            runtime::RequestCallbacks cb;
            cb.on_token = [out](const runtime::TokenEvent& ev) {
                out->tokens.push_back(ev.token);
                return true;
            };
            cb.on_finish = [out](const runtime::RequestResult& r) { out->result = r; };
            e.submit(gp, cb);
        }
    const auto t0 = std::chrono::steady_clock::now();
    for (int steps = 0; !e.idle(); ++steps) {
        ASSERT_LT(steps, 20000);
        e.step();
    }
    const double run_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::vector<std::pair<const CorpusSchema*, std::string>> complete;
    std::map<float, std::pair<int, int>> counts;  // temp -> (complete, length)
    std::vector<float> mask_us;
    for (const Out& out : outs) {
        SCOPED_TRACE(out.schema->name + " at temperature " + std::to_string(out.temp));
        mask_us.insert(mask_us.end(), out.result.mask_us.begin(), out.result.mask_us.end());
        if (out.result.reason == runtime::FinishReason::Length) {
            ++counts[out.temp].second;
            continue;
        }
        // Anything but Length is a finished output: Stop, never an error.
        ASSERT_EQ(out.result.reason, runtime::FinishReason::Stop)
            << runtime::finish_reason_name(out.result.reason) << ": " << out.result.error;
        ++counts[out.temp].first;
        complete.push_back({out.schema, tok.decode(out.tokens)});
    }
    int rc = 0;
    const std::string report = minfer::testing::validate_outputs(complete, &rc);
    EXPECT_EQ(rc, 0) << report;
    EXPECT_NE(report.find("validated " + std::to_string(complete.size()) + " outputs, 0 failed"),
              std::string::npos)
        << report;
    std::sort(mask_us.begin(), mask_us.end());
    const auto pct = [&](double p) {
        return mask_us.empty() ? 0.0f
                               : mask_us[std::min(mask_us.size() - 1,
                                                  static_cast<size_t>(p * double(mask_us.size())))];
    };
    std::printf(
        "[ info ] %zu schemas: temperature 0: %d complete (validated), %d length; temperature 1: "
        "%d complete (validated), %d length; compile %.0f ms in all; engine %.1f s; mask per "
        "token p50 %.1f us, p99 %.1f us (first uses included) over %zu tokens; sampling waited "
        "%.0f ms for masks\n",
        outs.size() / 2, counts[0.0f].first, counts[0.0f].second, counts[1.0f].first,
        counts[1.0f].second, compile_ms, run_s, pct(0.5), pct(0.99), mask_us.size(),
        e.stats().mask_wait_ms);
    // Most outputs finish within the budget (a check that the test checks
    // something: complete outputs are what is validated).
    EXPECT_GT(complete.size(), outs.size() / 2);
}
