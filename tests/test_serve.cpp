// `minfer serve` end to end: a Server on an ephemeral 127.0.0.1 port with
// the built-in tiny model, driven over HTTP with cpp-httplib's client. Every
// endpoint, every error status, streaming equal to non-streaming at
// temperature 0, cancellation freeing the KV pages, concurrent requests.
// The model's weights are regrouped as `minfer serve` does, so a sequence's
// logits do not depend on the batch (README) and concurrent requests can be
// compared with the same requests alone bit for bit.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/isa.h"
#include "backend/cpu/ops.h"
#include "cli_runner.h"
#include "model/model.h"
#include "runtime/engine_impl.h"
#include "runtime/session.h"
#include "serve/server.h"
#include "serve_client.h"

namespace {

using minfer::serve::Server;
using minfer::serve::ServerOptions;
using nlohmann::json;

const char* kKey = "test-key";
const std::string kModelPath = std::string(MINFER_SOURCE_DIR) + "/models/kjv-tiny-q8_0.gguf";

httplib::Headers auth() {
    return {{"Authorization", std::string("Bearer ") + kKey}};
}

// One server for the suite: loading the model once keeps the tests fast.
class Serve : public ::testing::Test {
  protected:
    static inline minfer::model::Model* model_ = nullptr;
    static inline Server* server_ = nullptr;
    static inline int port_ = 0;
    static inline minfer::testing::RequestLog* log_ = nullptr;
    static constexpr int kParallel = 8;

    static void SetUpTestSuite() {
        model_ = new minfer::model::Model(minfer::model::Model::load(kModelPath));
        minfer::runtime::regroup_weights_for_cpu(*model_);  // as `minfer serve` loads it
        log_ = new minfer::testing::RequestLog("minfer_serve_test");
        ServerOptions o;
        o.api_key = kKey;
        o.model_name = "kjv-tiny";
        o.max_body_bytes = 64 * 1024;
        o.queue_limit = 8;
        o.n_parallel = kParallel;
        o.log_requests = log_->file() != nullptr;
        o.log = log_->file();
        minfer::runtime::EngineOptions eo;
        eo.n_ctx = 4096;  // room for a request that generates for a good while (ClientGone*)
        eo.n_parallel = kParallel;
        eo.n_threads = 1;
        server_ = minfer::testing::start_test_server(*model_, o, eo);
        port_ = server_->port();
    }
    static void TearDownTestSuite() { minfer::testing::delete_server_then(server_, model_, log_); }
    static std::vector<std::string> log_lines() { return log_->lines(); }
    static std::string wait_log_line(size_t skip, const std::string& pattern) {
        return log_->wait_line(skip, pattern);
    }

    static httplib::Client client() { return minfer::testing::test_client(port_); }
    static httplib::Result post(const std::string& path, const json& body) {
        auto c = client();
        return c.Post(path.c_str(), auth(), body.dump(), "application/json");
    }
    static json post_ok(const std::string& path, const json& body) {
        auto r = post(path, body);
        EXPECT_TRUE(r) << "no answer from " << path;
        if (!r) return {};
        EXPECT_EQ(r->status, 200) << r->body;
        return json::parse(r->body);
    }
    static std::vector<json> sse_events(const std::string& body) {
        return minfer::testing::sse_events(body);
    }
    // A gauge's value from /metrics (-1: no answer, -2: no such line).
    static double metric(const std::string& name) {
        auto c = client();
        auto r = c.Get("/metrics");
        if (!r || r->status != 200) return -1;
        const double v = minfer::testing::metric_value(r->body, name);
        return v < 0 ? -2 : v;
    }
    static bool wait_idle(double seconds) {
        const auto end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<int>(seconds * 1000));
        while (std::chrono::steady_clock::now() < end) {
            if (metric("minfer_kv_pages_used") == 0 && metric("minfer_requests_running") == 0 &&
                metric("minfer_requests_waiting") == 0)
                return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }
    static void expect_error(const httplib::Result& r, int status, const std::string& needle) {
        minfer::testing::expect_api_error(r, status, needle);
    }
};

// A POST whose answer is read piece by piece; on_data returns false to hang up.
httplib::Result post_receiving(httplib::Client& c, const std::string& path,
                               httplib::Headers headers, const std::string& body,
                               std::function<bool(const char*, size_t)> on_data) {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = std::move(headers);
    req.headers.emplace("Content-Type", "application/json");
    req.body = body;
    req.content_receiver = [on_data](const char* d, size_t n, uint64_t, uint64_t) {
        return on_data(d, n);
    };
    return c.send(req);
}

json chat_body(const std::string& user, int max_tokens, bool stream = false) {
    return {{"model", "anything"},
            {"messages",
             {{{"role", "system"}, {"content", "You are a preacher."}},
              {{"role", "user"}, {"content", user}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"ignore_eos", true},
            {"stream", stream}};
}

TEST_F(Serve, HealthModelsAndChatPage) {
    auto c = client();
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(json::parse(h->body)["status"], "ok");

    auto m = c.Get("/v1/models", auth());
    ASSERT_TRUE(m);
    ASSERT_EQ(m->status, 200) << m->body;
    json mj = json::parse(m->body);
    EXPECT_EQ(mj["object"], "list");
    ASSERT_EQ(mj["data"].size(), 1u);
    EXPECT_EQ(mj["data"][0]["id"], "kjv-tiny");
    EXPECT_EQ(mj["data"][0]["object"], "model");
    // OpenAI's retrieve-model: the served id, and 404 model_not_found otherwise.
    auto one = c.Get("/v1/models/kjv-tiny", auth());
    ASSERT_TRUE(one);
    ASSERT_EQ(one->status, 200) << one->body;
    EXPECT_EQ(json::parse(one->body)["id"], "kjv-tiny");
    EXPECT_EQ(json::parse(one->body)["object"], "model");
    auto other = c.Get("/v1/models/gpt-4o", auth());
    expect_error(other, 404, "'gpt-4o' does not exist");
    EXPECT_EQ(json::parse(other->body)["error"]["code"], "model_not_found");
    EXPECT_EQ(json::parse(other->body)["error"]["type"], "invalid_request_error");

    auto page = c.Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
    EXPECT_NE(page->body.find("v1/chat/completions"), std::string::npos);
    // Offline: nothing fetched from elsewhere.
    EXPECT_EQ(page->body.find("http://"), std::string::npos);
    EXPECT_EQ(page->body.find("https://"), std::string::npos);
}

TEST_F(Serve, ChatCompletionShapeAndUsage) {
    json j = post_ok("/v1/chat/completions", chat_body("And God said", 8));
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(j["model"], "anything");  // any model name is accepted and echoed
    ASSERT_EQ(j["choices"].size(), 1u);
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
    EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 8);
    // The prompt counted is the rendered conversation, token for token.
    json tk = post_ok("/tokenize",
                      {{"content",
                        "<|im_start|>system\nYou are a preacher.<|im_end|>\n<|im_start|>user\nAnd "
                        "God said<|im_end|>\n<|im_start|>assistant\n"}});
    EXPECT_EQ(j["usage"]["prompt_tokens"], tk["tokens"].size());
    EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 8);
    EXPECT_TRUE(j["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

// The next turn of a chat maps the pages of the last one, its reply's
// included (a finished sequence's full pages stay cached): every full page
// of the cells the first turn computed (its prompt and all but its last
// sampled token), not only its prompt's.
TEST_F(Serve, TheNextTurnOfAChatMapsThePreviousReply) {
    json first =
        chat_body("Tell me of the children of Israel in the wilderness, and of Moses.", 80);
    first["messages"][0]["content"] = "You are a scribe who writes at length of the old days.";
    const json a = post_ok("/v1/chat/completions", first);
    const int64_t p1 = a["usage"]["prompt_tokens"], c1 = a["usage"]["completion_tokens"];
    ASSERT_GT(c1, 40);
    json next = first;
    next["messages"].push_back(
        {{"role", "assistant"}, {"content", a["choices"][0]["message"]["content"]}});
    next["messages"].push_back({{"role", "user"}, {"content", "And then?"}});
    next["max_tokens"] = 2;
    const json b = post_ok("/v1/chat/completions", next);
    const int64_t cached = b["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_EQ(cached, (p1 + c1 - 1) / 32 * 32) << "first turn: " << p1 << " + " << c1;
    EXPECT_GT(cached, (p1 - 1) / 32 * 32) << "more than the first prompt's own pages";
}

TEST_F(Serve, StreamingEqualsNonStreamingAtTemperatureZero) {
    json plain = post_ok("/v1/chat/completions", chat_body("In the beginning", 24));
    json body = chat_body("In the beginning", 24, true);
    body["stream_options"] = {{"include_usage", true}};
    auto r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    auto events = sse_events(r->body);
    ASSERT_GE(events.size(), 3u);
    EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
    std::string text, finish;
    json usage;
    for (const auto& e : events) {
        EXPECT_EQ(e["object"], "chat.completion.chunk");
        EXPECT_EQ(e["id"], events[0]["id"]);
        if (!e["usage"].is_null()) usage = e["usage"];
        for (const auto& c : e["choices"]) {
            if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
            if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
        }
    }
    EXPECT_EQ(text, plain["choices"][0]["message"]["content"]);
    EXPECT_EQ(finish, plain["choices"][0]["finish_reason"]);
    EXPECT_EQ(usage["completion_tokens"], plain["usage"]["completion_tokens"]);
    EXPECT_EQ(usage["prompt_tokens"], plain["usage"]["prompt_tokens"]);
    EXPECT_TRUE(events.back()["choices"].empty());  // the usage chunk is last
}

TEST_F(Serve, CompletionsTextAndTokenIdsAgree) {
    json a = post_ok("/v1/completions", {{"prompt", "And the earth was"},
                                         {"max_tokens", 12},
                                         {"temperature", 0},
                                         {"ignore_eos", true}});
    EXPECT_EQ(a["object"], "text_completion");
    ASSERT_EQ(a["choices"].size(), 1u);
    EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(a["usage"]["completion_tokens"], 12);
    json ids = post_ok("/tokenize", {{"content", "And the earth was"}})["tokens"];
    EXPECT_EQ(a["usage"]["prompt_tokens"], ids.size());
    json b =
        post_ok("/v1/completions",
                {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}});
    EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);

    // Streamed completions carry the same text.
    auto r = post("/v1/completions", {{"prompt", "And the earth was"},
                                      {"max_tokens", 12},
                                      {"temperature", 0},
                                      {"ignore_eos", true},
                                      {"stream", true}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    std::string text;
    for (const auto& e : sse_events(r->body)) text += e["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, a["choices"][0]["text"]);
}

TEST_F(Serve, TokenizeDetokenizeRoundTrip) {
    const std::string s = "And God said, Let there be light: and there was light.";
    json t = post_ok("/tokenize", {{"content", s}});
    ASSERT_TRUE(t["tokens"].is_array());
    ASSERT_GT(t["tokens"].size(), 3u);
    json d = post_ok("/detokenize", {{"tokens", t["tokens"]}});
    EXPECT_EQ(d["content"], s);
    json p = post_ok("/tokenize", {{"content", s}, {"with_pieces", true}});
    std::string joined;
    for (const auto& x : p["tokens"]) joined += x["piece"].get<std::string>();
    EXPECT_EQ(joined, s);
}

TEST_F(Serve, StopStringEndsTheReply) {
    json full = post_ok(
        "/v1/completions",
        {{"prompt", "And God said"}, {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true}});
    const std::string text = full["choices"][0]["text"];
    ASSERT_GT(text.size(), 12u);
    const std::string stop = text.substr(8, 3);
    const size_t at = text.find(stop);
    for (bool stream : {false, true}) {
        auto r = post("/v1/completions", {{"prompt", "And God said"},
                                          {"max_tokens", 30},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"stop", {"never-in-the-bible", stop}},
                                          {"stream", stream}});
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        std::string got, finish;
        if (stream) {
            for (const auto& e : sse_events(r->body)) {
                got += e["choices"][0]["text"].get<std::string>();
                if (!e["choices"][0]["finish_reason"].is_null())
                    finish = e["choices"][0]["finish_reason"];
            }
        } else {
            json j = json::parse(r->body);
            got = j["choices"][0]["text"];
            finish = j["choices"][0]["finish_reason"];
        }
        EXPECT_EQ(got, text.substr(0, at)) << "stream=" << stream;
        EXPECT_EQ(finish, "stop");
    }
}

TEST_F(Serve, SeveralSamplesAndLogprobs) {
    json body = chat_body("And God said", 6);
    body["n"] = 2;
    body["logprobs"] = true;
    body["top_logprobs"] = 3;
    json j = post_ok("/v1/chat/completions", body);
    ASSERT_EQ(j["choices"].size(), 2u);
    // Greedy: both samples agree.
    EXPECT_EQ(j["choices"][0]["message"]["content"], j["choices"][1]["message"]["content"]);
    EXPECT_EQ(j["usage"]["completion_tokens"], 12);
    const json& lp = j["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(lp.size(), 6u);
    std::string joined;
    for (const auto& e : lp) {
        EXPECT_LE(e["logprob"].get<double>(), 0.0);
        ASSERT_EQ(e["top_logprobs"].size(), 3u);
        // Greedy picks the most likely token: it heads the list.
        EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
        EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(),
                  e["top_logprobs"][1]["logprob"].get<double>());
        joined += e["token"].get<std::string>();
    }
    EXPECT_EQ(joined, j["choices"][0]["message"]["content"]);
}

TEST_F(Serve, ErrorStatusesAsOpenAIShapesThem) {
    auto c = client();
    // 400: malformed JSON, wrong types, out-of-range values, unsupported features.
    expect_error(c.Post("/v1/chat/completions", auth(), "{\"messages\": [", "application/json"),
                 400, "not valid JSON");
    expect_error(c.Post("/v1/chat/completions", auth(), "[1,2]", "application/json"), 400,
                 "JSON object");
    json b = chat_body("hi", 4);
    b["temperature"] = "hot";
    expect_error(post("/v1/chat/completions", b), 400, "temperature");
    b = chat_body("hi", 4);
    b["temperature"] = 7;
    expect_error(post("/v1/chat/completions", b), 400, "temperature");
    b = chat_body("hi", 4);
    b["max_tokens"] = -3;
    expect_error(post("/v1/chat/completions", b), 400, "max_tokens");
    b = chat_body("hi", 4);
    b["n"] = 99;
    expect_error(post("/v1/chat/completions", b), 400, "'n'");
    b = chat_body("hi", 4);
    b["messages"] = "hello";
    expect_error(post("/v1/chat/completions", b), 400, "messages");
    b = chat_body("hi", 4);
    b["messages"][1]["role"] = "wizard";
    expect_error(post("/v1/chat/completions", b), 400, "role");
    b = chat_body("hi", 4);
    b["response_format"] = {{"type", "yaml"}};
    expect_error(post("/v1/chat/completions", b), 400, "response_format");
    // A user message without content would generate from nothing: refused by name.
    b = chat_body("hi", 4);
    b["messages"][1]["content"] = nullptr;
    auto null_content = post("/v1/chat/completions", b);
    expect_error(null_content, 400, "'messages[1].content' is null");
    EXPECT_EQ(json::parse(null_content->body)["error"]["param"], "messages[1].content");
    b["messages"][1].erase("content");
    expect_error(post("/v1/chat/completions", b), 400, "'messages[1].content' is missing");
    // An assistant turn of tool calls has no content in OpenAI's API: accepted.
    b = chat_body("hi", 2);
    b["messages"].push_back({{"role", "assistant"},
                             {"content", nullptr},
                             {"tool_calls",
                              {{{"id", "call_1"},
                                {"type", "function"},
                                {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}});
    b["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "ok"}});
    EXPECT_EQ(post_ok("/v1/chat/completions", b)["usage"]["completion_tokens"], 2);
    expect_error(post("/v1/completions", {{"prompt", {1, 2, 999999}}}), 400, "token ids");
    expect_error(post("/v1/completions", {{"max_tokens", 3}}), 400, "prompt");
    expect_error(post("/detokenize", {{"tokens", "abc"}}), 400, "tokens");
    // A prompt longer than the context: 400 with both counts.
    std::string long_prompt;
    for (int i = 0; i < 1600; ++i) long_prompt += "And God said ";
    auto r = post("/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 4}});
    expect_error(r, 400, "the context holds 4096");
    EXPECT_NE(r->body.find("tokens"), std::string::npos);
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");

    // 401: no key, wrong key (either header spelling).
    auto no_key = c.Post("/v1/chat/completions", chat_body("hi", 2).dump(), "application/json");
    expect_error(no_key, 401, "API key");
    EXPECT_EQ(json::parse(no_key->body)["error"]["code"], "invalid_api_key");
    expect_error(c.Post("/v1/chat/completions", {{"Authorization", "Bearer nope"}},
                        chat_body("hi", 2).dump(), "application/json"),
                 401, "API key");
    auto ok = c.Post("/tokenize", {{"x-api-key", kKey}}, R"({"content":"x"})", "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);

    // 404: unknown route.
    expect_error(c.Get("/v1/nothing-here", auth()), 404, "/v1/nothing-here");
    // 413: a body over the limit (64 KiB here).
    std::string big = "{\"prompt\": \"" + std::string(100 * 1024, 'a') + "\"}";
    auto r413 = c.Post("/v1/completions", auth(), big, "application/json");
    ASSERT_TRUE(r413);
    EXPECT_EQ(r413->status, 413);
}

TEST_F(Serve, CorsPreflight) {
    auto c = client();
    auto r = c.Options("/v1/chat/completions",
                       {{"Origin", "http://example.test"},
                        {"Access-Control-Request-Method", "POST"},
                        {"Access-Control-Request-Headers", "authorization, content-type"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 204);
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "*");
    EXPECT_NE(r->get_header_value("Access-Control-Allow-Headers").find("Authorization"),
              std::string::npos);
    auto h = c.Get("/health");
    EXPECT_EQ(h->get_header_value("Access-Control-Allow-Origin"), "*");
}

// A streaming client that hangs up after a few events: the request is
// cancelled (generation stops well short of its 3500 tokens) and its pages
// are freed at once; the log line says when its first token came.
TEST_F(Serve, ClientGoneCancelsAndFreesPages) {
    ASSERT_TRUE(wait_idle(10));
    const int max_tokens = 3500;  // ~0.5 s or more of generation on the tiny model
    const double generated_before = metric("minfer_generated_tokens_total");
    ASSERT_GE(generated_before, 0);
    const size_t log_mark = log_lines().size();
    json body = chat_body("And God said", max_tokens, true);
    auto c = client();
    int chunks = 0;
    double pages_while_running = -1;
    auto r =
        post_receiving(c, "/v1/chat/completions", auth(), body.dump(), [&](const char*, size_t) {
            if (++chunks == 3) pages_while_running = metric("minfer_kv_pages_used");
            return chunks < 3;  // hang up after a few events
        });
    EXPECT_FALSE(r);  // the client aborted
    EXPECT_GT(pages_while_running, 0);
    EXPECT_TRUE(wait_idle(10)) << "pages still used after the client left: "
                               << metric("minfer_kv_pages_used");
    // A stream notices a hang-up at its next writes (one succeeds into the
    // socket buffer, the next fails): a few steps, far from 3500 tokens.
    const double generated = metric("minfer_generated_tokens_total") - generated_before;
    EXPECT_LT(generated, max_tokens / 10) << "the stream kept generating after its client left";
    std::printf("abandoned stream: %.0f tokens generated of %d\n", generated, max_tokens);
    const std::string line = wait_log_line(log_mark, "client gone");
    ASSERT_FALSE(line.empty()) << "no log line for the abandoned stream";
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, std::regex("ttft=([0-9.]+) ms"))) << line;
    EXPECT_GT(std::stod(m[1]), 0.0) << "tokens arrived, so the first one has a time: " << line;
    // The server still answers.
    json j = post_ok("/v1/chat/completions", chat_body("And God said", 3));
    EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

// The same for a non-streaming request: nothing has been written when the
// client gives up, and the server still notices and stops generating.
TEST_F(Serve, ClientGoneWithoutStreamingCancelsToo) {
    ASSERT_TRUE(wait_idle(10));
    const int max_tokens = 3500;  // ~0.5 s or more of generation on the tiny model
    const double generated_before = metric("minfer_generated_tokens_total");
    ASSERT_GE(generated_before, 0);
    auto c = client();
    c.set_read_timeout(0, 100 * 1000);  // give up after 100 ms: the client closes the socket
    auto r = c.Post("/v1/chat/completions", auth(), chat_body("And God said", max_tokens).dump(),
                    "application/json");
    EXPECT_FALSE(r) << "the answer came within 100 ms; the test needs a longer generation";
    EXPECT_TRUE(wait_idle(10)) << "pages still used after the client left: "
                               << metric("minfer_kv_pages_used");
    const double generated = metric("minfer_generated_tokens_total") - generated_before;
    EXPECT_LT(generated, max_tokens) << "the request ran to its end after its client left";
    json j = post_ok("/v1/chat/completions", chat_body("And God said", 3));
    EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

// The tokens and logprobs (the chosen token's and the top 5: log-softmax
// over the whole logits row) of one chat request, streamed or not.
struct Answer {
    json entries = json::array();  // logprobs.content entries, in order
    std::string text;
};

Answer chat_answer(const httplib::Result& r, bool stream) {
    Answer a;
    if (!r || r->status != 200) return a;
    std::vector<json> events;
    if (stream) {
        size_t pos = 0;
        while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
            const size_t end = r->body.find("\n\n", pos);
            const std::string data = r->body.substr(pos + 6, end - pos - 6);
            pos = end;
            if (data != "[DONE]") events.push_back(json::parse(data));
        }
    } else {
        json j = json::parse(r->body);
        a.text = j["choices"][0]["message"]["content"];
        a.entries = j["choices"][0]["logprobs"]["content"];
        return a;
    }
    for (const auto& e : events)
        for (const auto& c : e["choices"]) {
            if (c["delta"].contains("content")) a.text += c["delta"]["content"];
            if (c["logprobs"].is_object())
                for (const auto& x : c["logprobs"]["content"]) a.entries.push_back(x);
        }
    return a;
}

// -np 8 and 8 requests at once (half streamed): each gets the logprobs it
// gets alone, bit for bit — the weights are regrouped, so a sequence's logits
// do not depend on the batch. The engine is held at its first sampled row
// until all 8 requests are in it, and the test checks that one pass sampled
// all 8: they really ran together.
TEST_F(Serve, ConcurrentRequestsGetTheirOwnAnswers) {
    auto& im = server_->engine()->impl();
    bool invariant = minfer::cpu::matmul_batch_invariant(*model_->output);
    for (const auto& L : model_->layers)
        for (const minfer::tensor::TensorView* w :
             {L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down})
            invariant = invariant && minfer::cpu::matmul_batch_invariant(*w);
#if defined(__x86_64__)
    const auto level = minfer::cpu::isa_level();
    if (level == minfer::cpu::IsaLevel::Avx512 || level == minfer::cpu::IsaLevel::Avx2) {
        EXPECT_TRUE(invariant) << "kjv-tiny is Q8_0 with 16-row multiples: regrouped at this level";
    }
#endif
    const std::vector<std::string> prompts = {
        "And God said",      "In the beginning",   "The LORD is my shepherd", "Blessed are",
        "And Moses went up", "Let there be light", "Thou shalt not",          "Jesus wept"};
    ASSERT_EQ(prompts.size(), static_cast<size_t>(kParallel));
    auto body = [](const std::string& p, bool stream) {
        json b = chat_body(p, 16, stream);
        b["logprobs"] = true;
        b["top_logprobs"] = 5;
        return b;
    };
    ASSERT_TRUE(wait_idle(10));
    std::vector<Answer> alone;
    for (size_t i = 0; i < prompts.size(); ++i) {
        alone.push_back(chat_answer(post("/v1/chat/completions", body(prompts[i], false)), false));
        ASSERT_EQ(alone.back().entries.size(), 16u) << prompts[i];
    }

    // Hold the engine at the first row it samples until every request is in
    // it (admitted or queued), and note which requests each pass sampled.
    std::map<int64_t, std::set<minfer::runtime::RequestId>> sampled_by_pass;
    {
        std::lock_guard<std::mutex> step_lk(im.step_mu);  // the engine thread reads the hook
        im.logits_hook = [&im, &sampled_by_pass](minfer::runtime::RequestId id, int32_t, int64_t,
                                                 std::span<const float>) {
            if (sampled_by_pass.empty()) {
                const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                while (std::chrono::steady_clock::now() < end) {
                    size_t queued;
                    {
                        std::lock_guard<std::mutex> lk(im.mu);
                        queued = im.incoming.size();
                    }
                    if (im.seqs.size() + queued >= static_cast<size_t>(kParallel)) break;
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                }
            }
            sampled_by_pass[im.stats.steps].insert(id);
        };
    }
    std::vector<Answer> together(prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i)
        threads.emplace_back([&, i] {
            const bool stream = i % 2 == 1;
            together[i] =
                chat_answer(post("/v1/chat/completions", body(prompts[i], stream)), stream);
        });
    for (auto& t : threads) t.join();
    {
        std::lock_guard<std::mutex> step_lk(im.step_mu);
        im.logits_hook = nullptr;
    }
    size_t most_in_a_pass = 0;
    for (const auto& [pass, ids] : sampled_by_pass)
        most_in_a_pass = std::max(most_in_a_pass, ids.size());
    EXPECT_EQ(most_in_a_pass, prompts.size()) << "the requests never sampled in one pass";

    for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i) + (i % 2 ? " (streamed)" : ""));
        ASSERT_EQ(together[i].entries.size(), 16u);
        EXPECT_EQ(together[i].text, alone[i].text);
        for (size_t t = 0; t < 16; ++t) {
            const json& a = alone[i].entries[t];
            const json& b = together[i].entries[t];
            EXPECT_EQ(b["token"], a["token"]) << "token " << t;
            if (invariant) {
                // Bitwise: the JSON numbers round-trip the floats exactly.
                EXPECT_EQ(b["logprob"].get<double>(), a["logprob"].get<double>()) << "token " << t;
                EXPECT_EQ(b["top_logprobs"], a["top_logprobs"]) << "token " << t;
            }
        }
    }
    EXPECT_TRUE(wait_idle(10));
}

// "prompt": a list (LangChain's generate sends one): one choice per prompt,
// prompt-major with n (choice p * n + k), each prompt the same answer it
// gets alone, usage summed; streamed too; the prompts run as sequences of
// one batch (far fewer engine passes than one after another).
TEST_F(Serve, CompletionsListOfPromptsOneChoiceEach) {
    const std::vector<std::string> prompts = {"And God said", "In the beginning", "Blessed are"};
    const int n_tok = 12;
    auto body = [&](json prompt) {
        return json{
            {"prompt", prompt}, {"max_tokens", n_tok}, {"temperature", 0}, {"ignore_eos", true}};
    };
    std::vector<std::string> single;
    int64_t prompt_tokens = 0;
    json id_lists = json::array();
    for (const auto& p : prompts) {
        json j = post_ok("/v1/completions", body(p));
        single.push_back(j["choices"][0]["text"]);
        prompt_tokens += j["usage"]["prompt_tokens"].get<int64_t>();
        id_lists.push_back(post_ok("/tokenize", {{"content", p}})["tokens"]);
    }
    ASSERT_TRUE(wait_idle(10));
    const double steps_before = metric("minfer_engine_steps_total");
    json b = body(prompts);
    b["n"] = 2;
    json j = post_ok("/v1/completions", b);
    const double steps = metric("minfer_engine_steps_total") - steps_before;
    ASSERT_EQ(j["choices"].size(), 6u) << j.dump();
    for (size_t k = 0; k < 6; ++k) {
        EXPECT_EQ(j["choices"][k]["index"], k);
        EXPECT_EQ(j["choices"][k]["text"], single[k / 2]) << "choice " << k;
        EXPECT_EQ(j["choices"][k]["finish_reason"], "length");
    }
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
    EXPECT_EQ(j["usage"]["completion_tokens"], 6 * n_tok);
    // One after another: >= 3 * 12 decode passes; together ~12 (+ the prompts').
    EXPECT_LT(steps, 2 * n_tok) << "the prompts did not run as one batch";

    // A list of token-id lists: the same answers.
    json t = post_ok("/v1/completions", body(id_lists));
    ASSERT_EQ(t["choices"].size(), 3u);
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(t["choices"][k]["text"], single[k]);

    // Streamed: each choice's deltas by index, usage summed.
    b = body(prompts);
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
    auto r = post("/v1/completions", b);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::vector<std::string> texts(3);
    std::vector<std::string> finish(3);
    json usage;
    for (const auto& e : sse_events(r->body)) {
        if (!e["usage"].is_null()) usage = e["usage"];
        for (const auto& c : e["choices"]) {
            const size_t i = c["index"];
            ASSERT_LT(i, 3u);
            texts[i] += c["text"].get<std::string>();
            if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"];
        }
    }
    for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(texts[k], single[k]) << "choice " << k;
        EXPECT_EQ(finish[k], "length");
    }
    EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
    EXPECT_EQ(usage["completion_tokens"], 3 * n_tok);

    // A bad prompt in the list is named.
    expect_error(post("/v1/completions", body(json::array({"One", 7}))), 400, "prompt[1]");
    expect_error(post("/v1/completions", body(json::array({"One", json::array({1, -4})}))), 400,
                 "prompt[1]");
}

// A request line that does not parse is answered 400 and logged as such,
// without a time (httplib never routed it: there is no start to time from).
TEST_F(Serve, AGarbageRequestLineIsLoggedWithoutATime) {
    const size_t log_mark = log_lines().size();
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string garbage = "\x16\x03\x01 not http at all\r\n\r\n";
    ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
    char buf[512] = {};
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    ASSERT_GT(n, 0);
    EXPECT_EQ(std::string(buf).rfind("HTTP/1.1 400", 0), 0u) << buf;
    // No method and path (before: empty, now "-"; a routed request names them).
    const std::string line = wait_log_line(log_mark, "^minfer: -? -? 400");
    ASSERT_FALSE(line.empty()) << "the bad request was not logged; the log ends: "
                               << log_lines().back();
    EXPECT_NE(line.find("(request not parsed)"), std::string::npos) << line;
    EXPECT_EQ(line.find(" ms"), std::string::npos) << "a time from another request: " << line;
}

TEST_F(Serve, MetricsInPrometheusFormat) {
    post_ok("/v1/completions", {{"prompt", "And"}, {"max_tokens", 2}, {"temperature", 0}});
    auto c = client();
    auto r = c.Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    for (const char* name :
         {"minfer_requests_running", "minfer_requests_waiting", "minfer_prompt_tokens_total",
          "minfer_generated_tokens_total", "minfer_kv_pages_used", "minfer_kv_pages_cached",
          "minfer_kv_pages_free", "minfer_prefix_cache_hit_tokens_total",
          "minfer_activation_bytes"})
        EXPECT_NE(r->body.find(std::string("\n") + name + " "), std::string::npos) << name;
    EXPECT_NE(r->body.find("minfer_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
              std::string::npos);
    EXPECT_NE(r->body.find("minfer_inter_token_latency_seconds_count"), std::string::npos);
    EXPECT_GT(metric("minfer_generated_tokens_total"), 0);
    EXPECT_GT(metric("minfer_time_to_first_token_seconds_count"), 0);
}

// A server of its own, of one sequence (-np 1, -c 4096), over the test model.
struct OneSequenceServer {
    static ServerOptions options(ServerOptions o) {
        o.port = 0;
        o.n_parallel = 1;
        o.log_requests = false;
        return o;
    }
    explicit OneSequenceServer(const ServerOptions& o) : server(options(o)) {
        port = server.bind();
        server.start();
        minfer::runtime::EngineOptions eo;
        eo.n_ctx = 4096;
        eo.n_parallel = 1;
        eo.n_threads = 1;
        server.attach(model, eo);
    }
    minfer::model::Model model = minfer::model::Model::load(kModelPath);
    Server server;
    int port = 0;
};

// A server of one sequence and no queue: a second request while the first
// runs is turned away with 503 and Retry-After.
TEST(ServeQueue, FullQueueAnswers503) {
    ServerOptions o;
    o.queue_limit = 0;
    OneSequenceServer one(o);
    Server& server = one.server;
    const int port = one.port;

    auto c = minfer::testing::test_client(port);
    json body = chat_body("And God said", 4000, true);
    int status_second = 0;
    std::string retry_after;
    int chunks = 0;
    auto r = post_receiving(c, "/v1/chat/completions", {}, body.dump(), [&](const char*, size_t) {
        if (++chunks == 2) {
            httplib::Client c2("127.0.0.1", port);
            auto r2 =
                c2.Post("/v1/chat/completions", chat_body("hi", 2).dump(), "application/json");
            if (r2) {
                status_second = r2->status;
                retry_after = r2->get_header_value("Retry-After");
            }
            // /health does not wait behind the stream.
            auto h = c2.Get("/health");
            EXPECT_TRUE(h && h->status == 200);
            return false;
        }
        return true;
    });
    EXPECT_EQ(status_second, 503);
    EXPECT_FALSE(retry_after.empty());
    server.shutdown();
}

// A stream cut short by shutdown (the grace period over) ends as OpenAI
// ends a failed stream: an error event and no [DONE], no finish_reason —
// a client must not take half an answer for a whole one.
TEST(ServeShutdown, AStreamCutShortEndsWithAnErrorEvent) {
    ServerOptions o;
    o.grace_seconds = 0.2;
    OneSequenceServer one(o);
    Server& server = one.server;

    auto c = minfer::testing::test_client(one.port);
    std::string body;
    std::thread stopper;
    auto r =
        post_receiving(c, "/v1/chat/completions", {}, chat_body("And God said", 4000, true).dump(),
                       [&](const char* d, size_t n) {
                           body.append(d, n);
                           if (!stopper.joinable() && body.size() > 2000)
                               stopper = std::thread([&server] { server.shutdown(); });
                           return true;
                       });
    if (stopper.joinable()) stopper.join();
    ASSERT_TRUE(r) << "the stream did not end cleanly";
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body.find("[DONE]"), std::string::npos) << "a cut stream must not say [DONE]";
    EXPECT_EQ(body.find("\"finish_reason\":\"stop\""), std::string::npos);
    EXPECT_EQ(body.find("\"finish_reason\":\"length\""), std::string::npos);
    const size_t last = body.rfind("data: ");
    ASSERT_NE(last, std::string::npos);
    json ev = json::parse(body.substr(last + 6));
    ASSERT_TRUE(ev.contains("error")) << ev.dump();
    EXPECT_NE(ev["error"]["message"].get<std::string>().find("cut short"), std::string::npos);
    EXPECT_TRUE(ev["error"]["type"].is_string());
    EXPECT_TRUE(ev["error"]["code"].is_null() || ev["error"]["code"].is_string());
}

}  // namespace

namespace {

TEST(ServeCli, HelpAndBadFlags) {
    auto r = minfer::testing::run_cli("serve --help");
    EXPECT_EQ(r.code, 0);
    for (const char* flag : {"--host", "--port", "-np", "--api-key", "--alias", "--max-body-size",
                             "--queue-limit", "-ctk"})
        EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
    r = minfer::testing::run_cli("serve --port 70000");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--port"), std::string::npos) << r.err;
    r = minfer::testing::run_cli("serve -np 0");
    EXPECT_EQ(r.code, 2);
}

TEST(ServeCli, AModelThatCannotBeLoadedIsAnErrorNotAHang) {
    // The listener starts before the model loads (so /health can say
    // "loading"); a load that fails at once must stop it and exit 1 naming
    // the file, not leave a process that answers 503 forever.
    auto r = minfer::testing::run_cli("serve -m /nonexistent/model.gguf --port 0");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
}

TEST(ServeCli, CacheTypeKAloneSetsBothAndADifferentVIsRefused) {
    // serve's KV default is f16; -ctk alone must set V too (a -ctv the user
    // never gave cannot be "different"). 192.0.2.1 (TEST-NET-1) is on no
    // interface: the flags pass and the bind fails at once, so nothing serves.
    auto r = minfer::testing::run_cli("serve -ctk f32 --host 192.0.2.1 --port 0");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.find("differ"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("cannot bind 192.0.2.1"), std::string::npos) << r.err;
    r = minfer::testing::run_cli("serve -ctk f16 -ctv f32 --host 192.0.2.1 --port 0");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("-ctk f16 and -ctv f32 differ"), std::string::npos) << r.err;
}

}  // namespace
