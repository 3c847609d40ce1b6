// OpenAI's request shapes: a JSON body of /v1/chat/completions or
// /v1/completions checked field by field (wrong types and out-of-range
// values are ApiErrors naming the field, answered as 400) and turned into
// the engine's GenParams. The answers' shapes, the error object included,
// are in serve/responses.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "serve/chat_prompt.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace minfer::serve {

// An error answered as {"error":{"message","type","code","param"}}: code is
// OpenAI's machine-readable string ("invalid_api_key", "model_not_found",
// "context_length_exceeded") or, empty here, null — never the HTTP status.
class ApiError : public Error {
  public:
    ApiError(int status, const std::string& message, std::string param = {}, std::string code = {})
        : Error(message), status(status), param(std::move(param)), code(std::move(code)) {}
    int status;
    std::string param;
    std::string code;
};

// Request bodies keep their keys' order (tools are rendered into the prompt as sent).
using RequestJson = nlohmann::ordered_json;

// One parsed completion request.
struct CompletionRequest {
    bool chat = false;
    std::string model;
    runtime::GenParams gen;  // the prompt: prompts[0]
    // /v1/completions: every prompt of a list ("prompt": ["One", "Two"] or a
    // list of token-id lists), each its own engine request; chat: one.
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> stops;
    bool stream = false;
    bool include_usage = false;
    bool logprobs = false;  // chat: "logprobs": true; completions: "logprobs": N
    bool tools = false;     // chat: tools offered (replies parsed for <tool_call>)
    bool think = false;     // chat: a Qwen3 reply may open with <think> (reasoning_content)
    // Structured output: the grammar (GBNF) the reply must follow, empty for
    // none; the request field it comes from (errors name it) and what kind
    // of constraint it is (json_object, json_schema, grammar, tool_call: the
    // log and /metrics count by it). The server compiles it into gen.constraint.
    std::string grammar, grammar_param, grammar_kind;
};

// Parses a body of /v1/chat/completions (chat) or /v1/completions.
// The prompt is rendered (chat: ChatML) and tokenized here; n_ctx bounds the
// prompt (a longer one is a 400 naming both counts). Throws ApiError.
CompletionRequest parse_completion_request(const RequestJson& body, bool chat,
                                           const tokenizer::Tokenizer& tok, int64_t n_ctx,
                                           int32_t n_parallel, const ChatFlavor& flavor);

// Parses the body text as a JSON object (400 naming the parse error).
RequestJson parse_json_object(const std::string& body);

}  // namespace minfer::serve
