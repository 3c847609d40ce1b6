// Tool calls and Qwen3 reasoning through the real server: a scripted model
// (its weights make it write one fixed reply, token by token) behind a
// Server on an ephemeral loopback port. The reply goes the whole way a real
// model's does — sampled by the engine, decoded, split by the reply parser,
// streamed or answered whole — so what is checked is the server's handling
// of `tool_calls`, `reasoning_content` and `finish_reason: "tool_calls"`,
// and the follow-up turn that sends the calls and their results back.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "serve/server.h"
#include "serve_client.h"
#include "tiny_model.h"

namespace {

using minfer::serve::Server;
using minfer::serve::ServerOptions;
using nlohmann::json;
namespace gguf = minfer::gguf;
namespace tensor = minfer::tensor;

// The reply the model writes after a prompt that ends in "\n" (every chat
// prompt: "<|im_start|>assistant\n"): Qwen3's think block, content that
// ends in blanks, one tool call, blanks, the end of the turn.
const std::vector<std::string> kScript = {
    "<think>",      "\nI should call the tool.\n",
    "</think>",     "\n\nLet me check. \n",
    "<tool_call>",  "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
    "</tool_call>", "\n \n",
    "<|im_end|>",
};
// Second choices (half the logit of the script's next token): what the
// model writes where a grammar forbids its first choice. A forced call
// skips the content after </think> and the blanks after </tool_call>. Every
// other token has logit 0: where the grammar forbids the script, greedy
// decoding takes the lowest allowed token id.
const std::vector<std::pair<std::string, std::string>> kSecondChoice = {
    {"</think>", "<tool_call>"},
    {"</tool_call>", "<|im_end|>"},
};

// Bytes in GPT-2's byte-to-unicode spelling (how a normal token is stored).
std::string byte_level(const std::string& bytes) {
    std::string out;
    for (unsigned char c : bytes) out += minfer::testing::byte_token_text(c);
    return out;
}

// A one-layer qwen3 whose next token depends only on the current one (a
// bigram table): the layers add nothing (attention output and FFN down
// projections are zero), token t's embedding is the unit vector of its slot
// in the chain "\n" -> kScript[0] -> kScript[1] -> ..., and the output
// matrix maps slot i to the chain's next token with logit ~57 (all others 0).
std::vector<uint8_t> scripted_model() {
    gguf::Writer w;
    const int64_t E = 32, H = 2, D = 16, F = 32;
    w.set_string("general.architecture", "qwen3");
    w.set_string("general.name", "scripted-qwen3");
    w.set_u32("qwen3.context_length", 512);
    w.set_u32("qwen3.embedding_length", E);
    w.set_u32("qwen3.block_count", 1);
    w.set_u32("qwen3.feed_forward_length", F);
    w.set_u32("qwen3.attention.head_count", H);
    w.set_u32("qwen3.attention.head_count_kv", 1);
    w.set_u32("qwen3.attention.key_length", D);
    w.set_u32("qwen3.attention.value_length", D);
    w.set_f32("qwen3.rope.freq_base", 10000.0f);
    w.set_f32("qwen3.attention.layer_norm_rms_epsilon", 1e-6f);

    // 256 byte tokens, then the control and tag tokens, then the script's text tokens.
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(minfer::testing::byte_token_text(b));
        types.push_back(1);
    }
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        tokens.push_back(s);
        types.push_back(3);  // control
    }
    std::vector<int32_t> chain = {'\n'};
    auto find = [&](const std::string& piece) {
        for (size_t i = 256; i < tokens.size(); ++i)
            if (tokens[i] == piece || tokens[i] == byte_level(piece))
                return static_cast<int32_t>(i);
        return -1;
    };
    for (const auto& piece : kScript) {
        int32_t id = find(piece);
        if (id < 0) {
            const bool tag = piece.front() == '<';
            id = static_cast<int32_t>(tokens.size());
            tokens.push_back(tag ? piece : byte_level(piece));
            types.push_back(tag ? 4
                                : 1);  // user-defined (as Qwen's <think>, <tool_call>) or normal
        }
        chain.push_back(id);
    }
    const auto n_vocab = static_cast<int64_t>(tokens.size());
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_string_array("tokenizer.ggml.merges", {});
    w.set_u32("tokenizer.ggml.eos_token_id", 256);
    w.set_u32("tokenizer.ggml.padding_token_id", 256);
    w.set_bool("tokenizer.ggml.add_bos_token", false);
    w.set_string("tokenizer.chat_template", "{%- if enable_thinking is defined %}");

    auto add = [&](const std::string& name, std::vector<int64_t> ne, const std::vector<float>& x) {
        w.add_tensor(name, tensor::DType::F32, ne,
                     minfer::testing::encode_tensor(tensor::DType::F32, x, ne[0]));
    };
    auto zeros = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); };
    auto ones = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 1.0f); };
    std::vector<float> embd = zeros(E * n_vocab), out = zeros(E * n_vocab);
    for (size_t slot = 0; slot + 1 < chain.size(); ++slot) {
        embd[static_cast<size_t>(chain[slot] * E) + slot] = 1.0f;
        out[static_cast<size_t>(chain[slot + 1] * E) + slot] = 10.0f;
    }
    for (const auto& [piece, second] : kSecondChoice) {
        const auto slot =
            static_cast<size_t>(std::find(chain.begin(), chain.end(), find(piece)) - chain.begin());
        out[static_cast<size_t>(find(second) * E) + slot] = 5.0f;
    }
    add("token_embd.weight", {E, n_vocab}, embd);
    add("output.weight", {E, n_vocab}, out);
    add("output_norm.weight", {E}, ones(E));
    const std::string p = "blk.0.";
    add(p + "attn_norm.weight", {E}, ones(E));
    add(p + "attn_q.weight", {E, H * D}, zeros(E * H * D));
    add(p + "attn_k.weight", {E, D}, zeros(E * D));
    add(p + "attn_v.weight", {E, D}, zeros(E * D));
    add(p + "attn_q_norm.weight", {D}, ones(D));
    add(p + "attn_k_norm.weight", {D}, ones(D));
    add(p + "attn_output.weight", {H * D, E}, zeros(H * D * E));
    add(p + "ffn_norm.weight", {E}, ones(E));
    add(p + "ffn_gate.weight", {E, F}, zeros(E * F));
    add(p + "ffn_up.weight", {E, F}, zeros(E * F));
    add(p + "ffn_down.weight", {F, E}, zeros(F * E));
    return w.to_bytes();
}

class ServeTools : public ::testing::Test {
  protected:
    static inline std::vector<uint8_t>* bytes_ = nullptr;
    static inline minfer::model::Model* model_ = nullptr;
    static inline Server* server_ = nullptr;
    static inline int port_ = 0;

    static void SetUpTestSuite() {
        bytes_ = new std::vector<uint8_t>(scripted_model());
        model_ = new minfer::model::Model(
            minfer::model::Model::from_file(gguf::File::parse(bytes_->data(), bytes_->size())));
        ServerOptions o;
        o.model_name = "scripted";
        o.n_parallel = 2;
        o.log_requests = false;
        minfer::runtime::EngineOptions eo;
        eo.n_ctx = 2048;
        eo.n_parallel = 2;
        eo.n_threads = 1;
        server_ = minfer::testing::start_test_server(*model_, o, eo);
        port_ = server_->port();
    }
    static void TearDownTestSuite() {
        minfer::testing::delete_server_then(server_, model_, bytes_);
    }
    static httplib::Result post(const std::string& path, const json& body) {
        auto c = minfer::testing::test_client(port_);
        return c.Post(path.c_str(), body.dump(), "application/json");
    }
};

const json kWeatherTool = json::parse(R"({"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}})");

json weather_request(bool stream) {
    return {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
            {"tools", {kWeatherTool}},
            {"max_tokens", 32},
            {"temperature", 0},
            {"stream", stream}};
}

// The assistant message of a whole answer, or the one the stream's deltas add up to.
struct Reply {
    std::string content, reasoning, finish;
    bool content_null = false;
    json calls = json::array();  // [{id, type, function: {name, arguments}}]
};

Reply whole_reply(const json& j) {
    Reply r;
    const json& c = j["choices"][0];
    r.finish = c["finish_reason"];
    const json& m = c["message"];
    EXPECT_EQ(m["role"], "assistant");
    r.content_null = m["content"].is_null();
    if (!r.content_null) r.content = m["content"];
    if (m.contains("reasoning_content")) r.reasoning = m["reasoning_content"];
    if (m.contains("tool_calls")) r.calls = m["tool_calls"];
    return r;
}

Reply streamed_reply(const std::string& body) {
    Reply r;
    size_t pos = 0;
    bool done = false;
    while ((pos = body.find("data: ", pos)) != std::string::npos) {
        const size_t end = body.find("\n\n", pos);
        const std::string data = body.substr(pos + 6, end - pos - 6);
        pos = end;
        if (data == "[DONE]") {
            done = true;
            continue;
        }
        const json e = json::parse(data);
        for (const auto& c : e["choices"]) {
            const json& d = c["delta"];
            if (d.contains("content") && d["content"].is_string()) r.content += d["content"];
            if (d.contains("reasoning_content")) r.reasoning += d["reasoning_content"];
            if (d.contains("tool_calls"))
                for (const auto& call : d["tool_calls"]) {
                    EXPECT_EQ(call["index"], r.calls.size()) << "tool call deltas in order";
                    json whole = call;
                    whole.erase("index");
                    r.calls.push_back(whole);
                }
            if (!c["finish_reason"].is_null()) r.finish = c["finish_reason"];
        }
    }
    EXPECT_TRUE(done) << "no data: [DONE]";
    return r;
}

void expect_weather_call(const Reply& r) {
    EXPECT_EQ(r.finish, "tool_calls");
    EXPECT_EQ(r.reasoning, "\nI should call the tool.\n");
    // Blanks before the call are the template's separator, not content.
    EXPECT_EQ(r.content, "Let me check.");
    ASSERT_EQ(r.calls.size(), 1u) << r.calls.dump();
    const json& call = r.calls[0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u) << call.dump();
    EXPECT_EQ(call["function"]["name"], "get_weather");
    EXPECT_EQ(call["function"]["arguments"], R"({"city":"Paris"})");
}

TEST_F(ServeTools, ToolCallsComeBackWholeAndStreamedAlike) {
    auto whole = post("/v1/chat/completions", weather_request(false));
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200) << whole->body;
    const Reply a = whole_reply(json::parse(whole->body));
    {
        SCOPED_TRACE("not streamed");
        expect_weather_call(a);
    }
    auto streamed = post("/v1/chat/completions", weather_request(true));
    ASSERT_TRUE(streamed);
    ASSERT_EQ(streamed->status, 200) << streamed->body;
    const Reply b = streamed_reply(streamed->body);
    {
        SCOPED_TRACE("streamed");
        expect_weather_call(b);
    }
    // The same text either way (README: streamed equals not streamed at temperature 0).
    EXPECT_EQ(a.content, b.content);
    EXPECT_EQ(a.reasoning, b.reasoning);

    // With tool_choice "none" the tags are text: no calls, finish_reason "stop".
    json none = weather_request(false);
    none["tool_choice"] = "none";
    auto plain = post("/v1/chat/completions", none);
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->status, 200) << plain->body;
    const Reply c = whole_reply(json::parse(plain->body));
    EXPECT_TRUE(c.calls.empty());
    EXPECT_EQ(c.finish, "stop");
    EXPECT_NE(c.content.find("<tool_call>"), std::string::npos) << c.content;
}

// Without tools, Qwen3's thinking alone: the tags are text, and the content
// is the same streamed and not (its closing blanks dropped by the one parser
// both go through).
TEST_F(ServeTools, ReasoningAndContentStreamedEqualWhole) {
    json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                 {"max_tokens", 32},
                 {"temperature", 0}};
    auto whole = post("/v1/chat/completions", body);
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200) << whole->body;
    body["stream"] = true;
    auto streamed = post("/v1/chat/completions", body);
    ASSERT_TRUE(streamed);
    ASSERT_EQ(streamed->status, 200) << streamed->body;
    const Reply a = whole_reply(json::parse(whole->body)), b = streamed_reply(streamed->body);
    EXPECT_EQ(a.reasoning, "\nI should call the tool.\n");
    EXPECT_EQ(a.content,
              "Let me check. \n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
              "\"Paris\"}}\n</tool_call>");
    EXPECT_EQ(b.reasoning, a.reasoning);
    EXPECT_EQ(b.content, a.content);
    EXPECT_EQ(a.finish, "stop");
    EXPECT_EQ(b.finish, "stop");
}

// The follow-up turn: the assistant's tool_calls (content null) and a
// role "tool" message are accepted and rendered as Qwen3's template does
// (the prompt counted is that text, token for token).
TEST_F(ServeTools, ToolResultsAreSentBack) {
    auto first = post("/v1/chat/completions", weather_request(false));
    ASSERT_TRUE(first);
    ASSERT_EQ(first->status, 200) << first->body;
    const json msg = json::parse(first->body)["choices"][0]["message"];
    ASSERT_TRUE(msg.contains("tool_calls")) << msg.dump();
    json next = weather_request(false);
    json assistant = {{"role", "assistant"},
                      {"content", nullptr},
                      {"reasoning_content", msg["reasoning_content"]},
                      {"tool_calls", msg["tool_calls"]}};
    next["messages"].push_back(assistant);
    next["messages"].push_back({{"role", "tool"},
                                {"tool_call_id", msg["tool_calls"][0]["id"]},
                                {"content", "{\"temp\": 21}"}});
    auto second = post("/v1/chat/completions", next);
    ASSERT_TRUE(second);
    ASSERT_EQ(second->status, 200) << second->body;
    const std::string want =
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the "
        "user query.\n\nYou are provided with function signatures within <tools></tools> XML "
        "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"description\": \"The weather in a city now\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
        "</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI should call the tool.\n</think>\n\n<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n";
    auto tok = post("/tokenize", {{"content", want}});
    ASSERT_TRUE(tok);
    ASSERT_EQ(tok->status, 200);
    EXPECT_EQ(json::parse(second->body)["usage"]["prompt_tokens"],
              json::parse(tok->body)["tokens"].size());
    // The model (a fixed script) calls the tool again: the turn ran through.
    EXPECT_EQ(json::parse(second->body)["choices"][0]["finish_reason"], "tool_calls");
}

// ---------------------------------------------------------------------------
// Forced tool calls: the reply is constrained to Qwen's tool-call format.

const json kTimeTool = json::parse(R"({"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object",
        "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": false}}})");

// The reply to a chat request to the server on `port`, whole or streamed
// (empty, after a failure, when the answer is not a 200).
Reply reply_to(int port, const json& body, bool stream) {
    auto c = minfer::testing::test_client(port);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : std::string("no answer"));
    if (!r || r->status != 200) return {};
    return stream ? streamed_reply(r->body) : whole_reply(json::parse(r->body));
}

// tool_choice "required": the script's content ("Let me check.") is not
// allowed, so the model takes its second choice after </think>, the call;
// the think block stays (reasoning_content). Whole and streamed alike.
TEST_F(ServeTools, RequiredToolChoiceIsACallOnly) {
    for (bool stream : {false, true}) {
        SCOPED_TRACE(stream ? "streamed" : "not streamed");
        json body = weather_request(stream);
        body["tool_choice"] = "required";
        const Reply reply = reply_to(port_, body, stream);
        EXPECT_EQ(reply.finish, "tool_calls");
        EXPECT_EQ(reply.reasoning, "\nI should call the tool.\n");
        EXPECT_EQ(reply.content, "") << "content in a forced call";
        if (!stream) {
            EXPECT_TRUE(reply.content_null);
        }
        ASSERT_EQ(reply.calls.size(), 1u) << reply.calls.dump();
        EXPECT_EQ(reply.calls[0]["function"]["name"], "get_weather");
        EXPECT_EQ(reply.calls[0]["function"]["arguments"], R"({"city":"Paris"})");
    }
}

// A named function the script does not call: the grammar writes its name
// and its arguments (an enum) where the script would name get_weather.
TEST_F(ServeTools, NamedToolChoiceCallsThatFunction) {
    for (bool stream : {false, true}) {
        SCOPED_TRACE(stream ? "streamed" : "not streamed");
        json body = weather_request(stream);
        body["tools"] = {kWeatherTool, kTimeTool};
        body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
        body["max_tokens"] = 80;  // written byte by byte where the script is refused
        body["parallel_tool_calls"] = false;
        const Reply reply = reply_to(port_, body, stream);
        EXPECT_EQ(reply.finish, "tool_calls");
        EXPECT_EQ(reply.content, "");
        ASSERT_EQ(reply.calls.size(), 1u) << reply.calls.dump();
        EXPECT_EQ(reply.calls[0]["function"]["name"], "get_time");
        const json args = json::parse(reply.calls[0]["function"]["arguments"].get<std::string>());
        ASSERT_TRUE(args.is_object()) << args.dump();
        ASSERT_EQ(args.size(), 1u) << args.dump();
        EXPECT_TRUE(args["tz"] == "UTC" || args["tz"] == "CET") << args.dump();
    }
}

// Thinking off (Qwen3's enable_thinking false; the Qwen2.5 case): the
// grammar has no think block, so the script's <think> is refused too and
// the reply is the call alone.
TEST_F(ServeTools, RequiredToolChoiceWithoutThinking) {
    json body = weather_request(false);
    body["tools"] = {kWeatherTool, kTimeTool};
    body["tool_choice"] = "required";
    body["max_tokens"] = 80;  // written byte by byte where the script is refused
    body["parallel_tool_calls"] = false;
    body["chat_template_kwargs"] = {{"enable_thinking", false}};
    const Reply reply = reply_to(port_, body, false);
    EXPECT_EQ(reply.finish, "tool_calls");
    EXPECT_TRUE(reply.content_null) << reply.content;
    EXPECT_EQ(reply.reasoning, "");
    ASSERT_EQ(reply.calls.size(), 1u) << reply.calls.dump();
    const std::string name = reply.calls[0]["function"]["name"];
    const json args = json::parse(reply.calls[0]["function"]["arguments"].get<std::string>());
    if (name == "get_time")
        EXPECT_TRUE(args == json::parse(R"({"tz": "UTC"})") ||
                    args == json::parse(R"({"tz": "CET"})"))
            << args.dump();
    else
        EXPECT_EQ(name, "get_weather");
}

}  // namespace
