// One generation request as the server holds it while the engine runs it:
// the engine's callbacks (engine thread) fill it, the HTTP worker reads it
// and makes the answer from it (serve/responses.h). Internal to serve/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sample_text.h"
#include "serve/openai.h"
#include "serve/reply_parser.h"

namespace minfer::serve {

using Clock = std::chrono::steady_clock;

// A completions request with a list of prompts is one engine request per
// prompt; its choices are prompt-major (prompt p's sample k is choice
// p * n + k, as OpenAI and llama-server order them). Every field is read
// and written under mu.
struct Job {
    struct Sample {
        std::unique_ptr<runtime::SampleText> text;
        std::unique_ptr<ReplyParser> parser;  // chat with tools or thinking
        // The reply as split so far: the stream's deltas and the whole
        // answer are both made of these (advance_reply()), so they are equal.
        std::string content, reasoning;
        nlohmann::json tool_calls = nlohmann::json::array();  // [{id, type, function}]
        bool drained = false;                                 // finished, and all its text split
        nlohmann::json logprobs = nlohmann::json::array();    // chat: content entries
        std::vector<nlohmann::json> pending_logprobs;         // not yet streamed
        bool finished = false;
        bool finish_sent = false;
        runtime::RequestResult result;
        Clock::time_point last_token;
        bool any_token = false;
        int64_t n_tokens = 0;  // seen so far (the result's count arrives last)
    };
    std::mutex mu;
    std::condition_variable cv;
    CompletionRequest req;
    std::vector<Sample> samples;
    int n_finished = 0;
    bool first_event = false;
    bool role_sent = false;               // chat streams: the assistant role chunk went out
    uint64_t events = 0;                  // callbacks so far (the stream wakes on a change)
    std::vector<runtime::RequestId> ids;  // one per prompt
    std::string oai_id;
    int64_t created = 0;
    Clock::time_point t_start;
    Clock::time_point t_first_token;  // the first token of any sample
    bool any_token = false;

    bool done() const { return n_finished == static_cast<int>(samples.size()); }
    // A sample cut short: cancelled (shutdown) or failed.
    bool failed() const {
        for (const auto& s : samples)
            if (s.finished && (s.result.reason == runtime::FinishReason::Cancelled ||
                               s.result.reason == runtime::FinishReason::Error))
                return true;
        return false;
    }
    // Prompt p's first sample: its result carries the prompt's counts.
    const runtime::RequestResult& prompt_result(size_t p) const {
        return samples[p * static_cast<size_t>(req.gen.n_samples)].result;
    }
};

}  // namespace minfer::serve
