// Structured output through the real server: response_format (json_object,
// json_schema), llama-server's json_schema and grammar fields, and forced
// tool calls (tool_choice required / named), on a random-weight model with
// Qwen's real vocabulary (../shared/models/qwen2-mini-q8_0.gguf, 151,936
// tokens) behind a Server on a loopback port. With random weights nothing
// but the grammar keeps the reply valid, so every reply that finishes is
// parsed and validated against its schema by a real validator
// (python3-jsonschema); streamed replies as well as whole ones. What cannot
// be enforced is a 400 naming the field and the keyword or line.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "serve/server.h"
#include "serve_client.h"
#include "shared_files.h"

namespace {

using minfer::serve::Server;
using minfer::serve::ServerOptions;
using minfer::testing::expect_api_error;
using minfer::testing::metric_value;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string model_path() {
    return minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf");
}

class ServeStructured : public ::testing::Test {
  protected:
    static inline minfer::model::Model* model_ = nullptr;
    static inline Server* server_ = nullptr;
    static inline int port_ = 0;
    static inline std::string log_path_;
    static inline std::FILE* log_ = nullptr;

    static void SetUpTestSuite() {
        if (!std::filesystem::exists(model_path())) return;  // each test skips (SetUp)
        model_ = new minfer::model::Model(minfer::model::Model::load(model_path()));
        log_path_ =
            ::testing::TempDir() + "minfer_serve_structured." + std::to_string(getpid()) + ".log";
        log_ = std::fopen(log_path_.c_str(), "w");
        ServerOptions o;
        o.port = 0;
        o.model_name = "qwen2-mini";
        o.n_parallel = 4;
        o.log_requests = log_ != nullptr;
        o.log = log_;
        server_ = new Server(o);
        port_ = server_->bind();
        server_->start();
        minfer::runtime::EngineOptions eo;
        eo.n_ctx = 4096;
        eo.n_parallel = 4;
        eo.n_threads = 1;
        server_->attach(*model_, eo);
    }
    static void TearDownTestSuite() {
        delete server_;
        delete model_;
        if (log_) std::fclose(log_);
        if (!log_path_.empty()) std::remove(log_path_.c_str());
        server_ = nullptr;
        model_ = nullptr;
        log_ = nullptr;
    }
    void SetUp() override { MINFER_REQUIRE_SHARED_FILES(model_path()); }

    static httplib::Result post(const std::string& path, const json& body) {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(120);
        return c.Post(path.c_str(), body.dump(), "application/json");
    }
    static std::string metrics() {
        httplib::Client c("127.0.0.1", port_);
        auto r = c.Get("/metrics");
        return r && r->status == 200 ? r->body : std::string();
    }
    // The first line of the request log after `skip` lines that matches
    // `pattern`, waiting up to 5 s (a line is written after its answer).
    static std::string wait_log_line(size_t skip, const std::string& pattern) {
        const std::regex re(pattern);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (std::chrono::steady_clock::now() < end) {
            std::ifstream in(log_path_);
            size_t i = 0;
            for (std::string line; std::getline(in, line); ++i)
                if (i >= skip && std::regex_search(line, re)) return line;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return {};
    }
    static size_t log_line_count() {
        std::ifstream in(log_path_);
        size_t n = 0;
        for (std::string line; std::getline(in, line);) ++n;
        return n;
    }
};

// A chat request without Qwen3's think block (the model's template has
// enable_thinking: a random model that opened one would think until
// max_tokens).
json chat(const std::string& user, int max_tokens) {
    return {{"messages", {{{"role", "user"}, {"content", user}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"chat_template_kwargs", {{"enable_thinking", false}}}};
}

const ojson kPersonSchema = ojson::parse(R"({
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        "ok": {"type": "boolean"}
    },
    "required": ["name", "age", "color", "tags", "ok"],
    "additionalProperties": false})");

json with_schema(json body, const ojson& schema) {
    body["response_format"] = {
        {"type", "json_schema"},
        {"json_schema", {{"name", "person"}, {"schema", schema}, {"strict", true}}}};
    return body;
}

const json kWeatherTool = json::parse(R"({"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false}}})");

// ---------------------------------------------------------------------------
// What cannot be enforced is refused, naming the field and what is wrong.

TEST_F(ServeStructured, UnenforceableConstraintsAre400NamingTheKeyword) {
    const json base = chat("Hi", 8);
    auto expect_400 = [&](json body, const std::string& needle, const std::string& param,
                          const std::string& path = "/v1/chat/completions") {
        SCOPED_TRACE(body.dump());
        expect_api_error(post(path, body), 400, needle, param);
    };
    json b = base;
    b["response_format"] = {{"type", "xml"}};
    expect_400(b, "'response_format.type' must be", "response_format");
    // A keyword the grammar cannot enforce, named with where it is.
    expect_400(with_schema(base, ojson::parse(R"({"type": "object", "properties":
                   {"n": {"type": "integer", "multipleOf": 3}}})")),
               "multipleOf", "response_format.json_schema.schema");
    expect_400(with_schema(base, ojson::parse(R"({"type": "object", "properties":
                   {"n": {"type": "integer", "multipleOf": 3}}})")),
               "#/properties/n", "response_format.json_schema.schema");
    b = base;
    b["response_format"] = {{"type", "json_schema"}, {"json_schema", "person"}};
    expect_400(b, "must be an object", "response_format.json_schema");
    b = base;
    b["response_format"] = {
        {"type", "json_schema"},
        {"json_schema", {{"name", "x"}, {"schema", json::object()}, {"strict", "yes"}}}};
    expect_400(b, "'strict' must be true or false", "strict");
    // llama-server's fields, on both endpoints.
    json c = {{"prompt", "Hi"},
              {"max_tokens", 4},
              {"json_schema", {{"type", "array"}, {"uniqueItems", true}}}};
    expect_400(c, "uniqueItems", "json_schema", "/v1/completions");
    c = {{"prompt", "Hi"}, {"max_tokens", 4}, {"grammar", "root ::= \"a\" (\"b\"\nx ::= \"c\""}};
    expect_400(c, "grammar line", "grammar", "/v1/completions");
    c["grammar"] = "root ::= item\n";
    expect_400(c, "rule 'item' is used at line 1", "grammar", "/v1/completions");
    c["grammar"] = 42;
    expect_400(c, "'grammar' must be a string", "grammar", "/v1/completions");
    b = base;
    b["grammar"] = "root ::= \"a\"";
    b["json_schema"] = {{"type", "string"}};
    expect_400(b, "both constrain the reply", "grammar");

    // tool_choice.
    b = base;
    b["tool_choice"] = "required";
    expect_400(b, "no 'tools' are given", "tool_choice");
    b["tools"] = {kWeatherTool};
    b["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
    expect_400(b, "'get_time', which is not one of 'tools'", "tool_choice");
    b["tool_choice"] = "sometimes";
    expect_400(b, "'tool_choice' must be", "tool_choice");
    b["tool_choice"] = "required";
    b["parallel_tool_calls"] = "yes";
    expect_400(b, "'parallel_tool_calls' must be true or false", "parallel_tool_calls");
    b.erase("parallel_tool_calls");
    b["response_format"] = {{"type", "json_object"}};
    expect_400(b, "cannot be combined with a forced tool call", "response_format");
    b.erase("response_format");
    json bad_tool = kWeatherTool;
    bad_tool["function"]["name"] = "get_time";
    bad_tool["function"]["parameters"] = {
        {"type", "object"}, {"properties", {{"at", {{"type", "string"}, {"format", "email"}}}}}};
    b["tools"] = {kWeatherTool, bad_tool};
    expect_400(b, "format", "tools[1].function.parameters");
    // Offered but not forced, nothing is enforced: the tools' schemas are
    // not looked at, and the request runs.
    b["tool_choice"] = "auto";
    auto ok = post("/v1/chat/completions", b);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
}

// A grammar that parses but does not compile (left recursion) is refused
// too; the second time from the list of refused grammars (counted either way).
TEST_F(ServeStructured, GrammarThatDoesNotCompileIsRefusedAndRemembered) {
    const double before = metric_value(metrics(), "minfer_constraint_refused_total");
    json c = {{"prompt", "Hi"},
              {"max_tokens", 4},
              {"grammar", "root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n"}};
    for (int i = 0; i < 2; ++i)
        expect_api_error(post("/v1/completions", c), 400, "expr", "grammar");
    EXPECT_EQ(metric_value(metrics(), "minfer_constraint_refused_total"), before + 2);
}

// The constraint is compiled once per grammar text: the same schema sent
// again is a cache hit, counted by kind in /metrics and named in the log.
TEST_F(ServeStructured, ConstraintsAreCompiledOnceAndCounted) {
    const std::string m0 = metrics();
    const size_t skip = log_line_count();
    ojson schema = kPersonSchema;
    schema["properties"]["name"]["maxLength"] = 7;  // a text no other test sends
    for (int i = 0; i < 2; ++i) {
        auto r = post("/v1/chat/completions", with_schema(chat("Who?", 4), schema));
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
    }
    const std::string m1 = metrics();
    auto delta = [&](const std::string& name) {
        return metric_value(m1, name) - metric_value(m0, name);
    };
    EXPECT_EQ(delta("minfer_constrained_requests_total{kind=\"json_schema\"}"), 2);
    EXPECT_EQ(delta("minfer_constraint_cache_misses_total"), 1);
    EXPECT_EQ(delta("minfer_constraint_cache_hits_total"), 1);
    EXPECT_EQ(delta("minfer_constraint_compile_seconds_count"), 1);
    EXPECT_GT(delta("minfer_constraint_compile_seconds_sum"), 0);
    EXPECT_NE(wait_log_line(skip, "constraint=json_schema \\(compiled [0-9.]+ ms\\)"), "");
    EXPECT_NE(wait_log_line(skip, "constraint=json_schema \\(cached\\)"), "");
}

}  // namespace
