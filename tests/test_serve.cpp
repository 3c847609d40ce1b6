// `minfer serve` end to end: a Server on an ephemeral 127.0.0.1 port with
// the built-in tiny model, driven over HTTP with cpp-httplib's client. Every
// endpoint, every error status, streaming equal to non-streaming at
// temperature 0, cancellation freeing the KV pages, concurrent requests.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.h"
#include "model/model.h"
#include "serve/server.h"

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

    static void SetUpTestSuite() {
        model_ = new minfer::model::Model(minfer::model::Model::load(kModelPath));
        ServerOptions o;
        o.port = 0;
        o.api_key = kKey;
        o.model_name = "kjv-tiny";
        o.max_body_bytes = 64 * 1024;
        o.queue_limit = 8;
        o.n_parallel = 4;
        o.log_requests = false;
        server_ = new Server(o);
        port_ = server_->bind();
        server_->start();
        minfer::runtime::EngineOptions eo;
        eo.n_ctx = 1024;
        eo.n_parallel = 4;
        eo.n_threads = 1;
        server_->attach(*model_, eo);
    }
    static void TearDownTestSuite() {
        delete server_;
        delete model_;
        server_ = nullptr;
        model_ = nullptr;
    }

    static httplib::Client client() {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(30);
        return c;
    }
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
    // The data events of an SSE body, [DONE] excluded (and required last).
    static std::vector<json> sse_events(const std::string& body) {
        std::vector<json> out;
        size_t pos = 0;
        bool done = false;
        while (pos < body.size()) {
            size_t end = body.find("\n\n", pos);
            EXPECT_NE(end, std::string::npos) << "an event not ended by a blank line";
            if (end == std::string::npos) break;
            std::string ev = body.substr(pos, end - pos);
            pos = end + 2;
            EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
            std::string data = ev.substr(6);
            EXPECT_FALSE(done) << "an event after [DONE]";
            if (data == "[DONE]") {
                done = true;
                continue;
            }
            out.push_back(json::parse(data));
        }
        EXPECT_TRUE(done) << "no data: [DONE]";
        return out;
    }
    // A gauge's value from /metrics.
    static double metric(const std::string& name) {
        auto c = client();
        auto r = c.Get("/metrics");
        if (!r || r->status != 200) return -1;
        std::regex re("\n" + name + " ([0-9.e+-]+)\n");
        std::smatch m;
        if (!std::regex_search(r->body, m, re)) return -2;
        return std::stod(m[1]);
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
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, status) << r->body;
        json j = json::parse(r->body, nullptr, false);
        ASSERT_TRUE(j.is_object()) << r->body;
        ASSERT_TRUE(j.contains("error")) << r->body;
        EXPECT_TRUE(j["error"]["message"].is_string());
        EXPECT_TRUE(j["error"]["type"].is_string());
        EXPECT_EQ(j["error"]["code"], status);
        EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos)
            << j["error"]["message"];
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
    b["response_format"] = {{"type", "json_object"}};
    expect_error(post("/v1/chat/completions", b), 400, "response_format");
    expect_error(post("/v1/completions", {{"prompt", {1, 2, 999999}}}), 400, "token ids");
    expect_error(post("/v1/completions", {{"max_tokens", 3}}), 400, "prompt");
    expect_error(post("/detokenize", {{"tokens", "abc"}}), 400, "tokens");
    // A prompt longer than the context: 400 with both counts.
    std::string long_prompt;
    for (int i = 0; i < 600; ++i) long_prompt += "And God said ";
    auto r = post("/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 4}});
    expect_error(r, 400, "the context holds 1024");
    EXPECT_NE(r->body.find("tokens"), std::string::npos);

    // 401: no key, wrong key (either header spelling).
    expect_error(c.Post("/v1/chat/completions", chat_body("hi", 2).dump(), "application/json"), 401,
                 "API key");
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

TEST_F(Serve, ClientGoneCancelsAndFreesPages) {
    ASSERT_TRUE(wait_idle(10));
    json body = chat_body("And God said", 900, true);  // would run long
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
    // The server still answers.
    json j = post_ok("/v1/chat/completions", chat_body("And God said", 3));
    EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

// The same for a non-streaming request: nothing has been written when the
// client gives up, and the server still notices and stops generating.
TEST_F(Serve, ClientGoneWithoutStreamingCancelsToo) {
    ASSERT_TRUE(wait_idle(10));
    const int max_tokens = 900;  // ~1 s or more of generation on the tiny model
    const double generated_before = metric("minfer_generated_tokens_total");
    ASSERT_GE(generated_before, 0);
    auto c = client();
    c.set_read_timeout(0, 200 * 1000);  // give up after 200 ms: the client closes the socket
    auto r = c.Post("/v1/chat/completions", auth(), chat_body("And God said", max_tokens).dump(),
                    "application/json");
    EXPECT_FALSE(r) << "the answer came within 200 ms; the test needs a longer generation";
    EXPECT_TRUE(wait_idle(10)) << "pages still used after the client left: "
                               << metric("minfer_kv_pages_used");
    const double generated = metric("minfer_generated_tokens_total") - generated_before;
    EXPECT_LT(generated, max_tokens) << "the request ran to its end after its client left";
    json j = post_ok("/v1/chat/completions", chat_body("And God said", 3));
    EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

TEST_F(Serve, ConcurrentRequestsGetTheirOwnAnswers) {
    const std::vector<std::string> prompts = {"And God said", "In the beginning",
                                              "The LORD is my shepherd", "Blessed are"};
    std::vector<std::string> alone;
    for (const auto& p : prompts)
        alone.push_back(
            post_ok("/v1/chat/completions", chat_body(p, 16))["choices"][0]["message"]["content"]);
    std::vector<std::string> together(prompts.size() * 2);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < together.size(); ++i)
        threads.emplace_back([&, i] {
            const bool stream = i % 2 == 1;
            auto r =
                post("/v1/chat/completions", chat_body(prompts[i % prompts.size()], 16, stream));
            if (!r || r->status != 200) return;
            if (!stream) {
                together[i] = json::parse(r->body)["choices"][0]["message"]["content"];
            } else {
                for (const auto& e : sse_events(r->body))
                    for (const auto& ch : e["choices"])
                        if (ch["delta"].contains("content")) together[i] += ch["delta"]["content"];
            }
        });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < together.size(); ++i)
        EXPECT_EQ(together[i], alone[i % prompts.size()]) << "request " << i;
    EXPECT_TRUE(wait_idle(10));
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

// A server of one sequence and no queue: a second request while the first
// runs is turned away with 503 and Retry-After.
TEST(ServeQueue, FullQueueAnswers503) {
    minfer::model::Model model = minfer::model::Model::load(kModelPath);
    ServerOptions o;
    o.port = 0;
    o.queue_limit = 0;
    o.n_parallel = 1;
    o.log_requests = false;
    Server server(o);
    const int port = server.bind();
    server.start();
    minfer::runtime::EngineOptions eo;
    eo.n_ctx = 4096;
    eo.n_parallel = 1;
    eo.n_threads = 1;
    server.attach(model, eo);

    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30);
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
