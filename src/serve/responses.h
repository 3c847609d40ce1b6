// OpenAI's response shapes, the other half of serve/openai.h (the requests):
// the error object every failure is answered with, a whole chat.completion
// or text_completion body with its usage, the SSE events of a stream
// (chat.completion.chunk / text_completion chunks, the usage chunk, [DONE]
// or the error event that ends a reply cut short), logprobs in both the chat
// and the legacy shape, tool_calls, and /v1/models' model object. The
// server (serve/server.cpp) only decides when to send which.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/engine.h"
#include "serve/reply_parser.h"
#include "tokenizer/tokenizer.h"

namespace minfer::serve {

struct Job;

// ---- errors ----
// OpenAI's error type names for an HTTP status.
const char* error_type(int status);
// {"error":{"message","type","code","param"}}; an empty param or code is null.
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {},
                          const std::string& code = {});

// ---- pieces ----
// The JSON text of an answer. Generated text may hold invalid UTF-8 only in
// logprob pieces (a token can end inside a character): replaced, not thrown.
std::string dump_json(const nlohmann::json& j);
// One SSE data event: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& j);
// An id with a random 64-bit hex tail: "chatcmpl-…", "cmpl-…", "call_…".
std::string random_id(const char* prefix);
// Seconds since the epoch ("created").
int64_t unix_time();
// "length" for n_predict or the context's end, else "stop".
const char* finish_reason_openai(runtime::FinishReason r);
// Bytes of a piece as a JSON list (OpenAI's logprobs "bytes").
nlohmann::json bytes_of(const std::string& s);
// One token's logprob entry in chat's shape {token, logprob, bytes, top_logprobs}.
nlohmann::json logprob_entry(const tokenizer::Tokenizer& tok, const runtime::TokenEvent& ev);
// Logprob entries (chat's shape) in the legacy completions shape
// {tokens, token_logprobs, top_logprobs[, text_offset]}.
nlohmann::json completion_logprobs(const std::vector<nlohmann::json>& entries, bool with_offsets);
// A tool call part as OpenAI's {id, type: "function", function: {name, arguments}}.
nlohmann::json tool_call_json(const ReplyPart& p);

// ---- whole answers and streams (the caller holds job.mu) ----
// default_model names the model when the request did not.
// The whole chat.completion / text_completion body, usage included.
nlohmann::json final_body(Job& job, const std::string& default_model);
// A chat stream's first events: the assistant role, once per choice (as
// OpenAI streams it).
std::string role_chunks(const Job& job, const std::string& default_model);
// The SSE events for whatever the job holds that is not yet sent. With
// final_pass, also the usage chunk and [DONE] — or, for a reply cut short
// (shutdown, a failure), an error event and no [DONE], as OpenAI ends a
// failed stream: a client must not take it for a whole answer.
std::string stream_chunks(Job& job, bool final_pass, const std::string& default_model);

// ---- other routes ----
// OpenAI's model object: what /v1/models lists and /v1/models/{id} retrieves.
nlohmann::json model_object(const std::string& id, const model::Model& model, int64_t n_ctx);

}  // namespace minfer::serve
