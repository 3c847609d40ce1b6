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

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "model/model.h"
#include "serve/server.h"
#include "serve_client.h"
#include "shared_files.h"
#include "structured_corpus.h"

namespace {

using minfer::serve::Server;
using minfer::serve::ServerOptions;
using minfer::testing::CorpusSchema;
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
    static inline minfer::testing::RequestLog* log_ = nullptr;

    static void SetUpTestSuite() {
        if (!std::filesystem::exists(model_path())) return;  // each test skips (SetUp)
        model_ = new minfer::model::Model(minfer::model::Model::load(model_path()));
        log_ = new minfer::testing::RequestLog("minfer_serve_structured");
        ServerOptions o;
        o.model_name = "qwen2-mini";
        o.n_parallel = 4;
        o.log_requests = log_->file() != nullptr;
        o.log = log_->file();
        minfer::runtime::EngineOptions eo;
        eo.n_ctx = 4096;
        eo.n_parallel = 4;
        eo.n_threads = 1;
        server_ = minfer::testing::start_test_server(*model_, o, eo);
        port_ = server_->port();
    }
    static void TearDownTestSuite() { minfer::testing::delete_server_then(server_, model_, log_); }
    void SetUp() override { MINFER_REQUIRE_SHARED_FILES(model_path()); }

    static httplib::Result post(const std::string& path, const json& body) {
        // A bound for a hang, not a speed check: JsonObjectRepliesAreObjects
        // samples 4 x 200 tokens, ~70 s of CPU per request under ASan.
        auto c = minfer::testing::test_client(port_, 600);
        return c.Post(path.c_str(), body.dump(), "application/json");
    }
    static std::string metrics() {
        httplib::Client c("127.0.0.1", port_);
        auto r = c.Get("/metrics");
        return r && r->status == 200 ? r->body : std::string();
    }
    static std::string wait_log_line(size_t skip, const std::string& pattern) {
        return log_->wait_line(skip, pattern);
    }
    static size_t log_line_count() { return log_->lines().size(); }
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
    expect_400(b, "'response_format.json_schema.strict' must be true or false",
               "response_format.json_schema.strict");
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

// ---------------------------------------------------------------------------
// Replies follow their constraint, streamed or not.

// One choice of an answer: the content (chat) or text (completions), the
// tool calls, the finish reason; from a whole body or a stream's deltas.
struct Choice {
    std::string text, finish;
    bool content_null = false;
    json calls = json::array();
};

std::vector<Choice> choices_of(const httplib::Result& r, bool chat, bool stream) {
    std::vector<Choice> out;
    EXPECT_TRUE(r);
    if (!r) return out;
    EXPECT_EQ(r->status, 200) << r->body;
    if (r->status != 200) return out;
    auto at = [&](const json& c) -> Choice& {
        const size_t i = c["index"];
        if (out.size() <= i) out.resize(i + 1);
        return out[i];
    };
    if (!stream) {
        const json body = json::parse(r->body);
        for (const auto& c : body["choices"]) {
            Choice& x = at(c);
            x.finish = c["finish_reason"];
            if (!chat) {
                x.text = c["text"];
                continue;
            }
            const json& m = c["message"];
            x.content_null = m["content"].is_null();
            if (!x.content_null) x.text = m["content"];
            if (m.contains("tool_calls")) x.calls = m["tool_calls"];
        }
        return out;
    }
    for (const auto& e : minfer::testing::sse_events(r->body)) {
        for (const auto& c : e["choices"]) {
            Choice& x = at(c);
            if (!c["finish_reason"].is_null()) x.finish = c["finish_reason"];
            if (!chat) {
                x.text += c["text"].get<std::string>();
                continue;
            }
            const json& d = c["delta"];
            if (d.contains("content") && d["content"].is_string()) x.text += d["content"];
            if (d.contains("tool_calls"))
                for (const auto& call : d["tool_calls"]) x.calls.push_back(call);
        }
    }
    return out;
}

// Validates (name, schema, text) triples with python3-jsonschema; the report.
class Validation {
  public:
    void add(const std::string& name, const ojson& schema, const std::string& text) {
        schemas_.push_back(std::make_unique<CorpusSchema>(CorpusSchema{name, schema, {}, {}}));
        outs_.emplace_back(schemas_.back().get(), text);
    }
    size_t size() const { return outs_.size(); }
    // Empty when every output parses and validates, else the report.
    std::string failures() const {
        int rc = 0;
        const std::string report = minfer::testing::validate_outputs(outs_, &rc);
        const std::string all_ok =
            "validated " + std::to_string(outs_.size()) + " outputs, 0 failed";
        return rc == 0 && report.find(all_ok) != std::string::npos ? std::string() : report;
    }

  private:
    std::vector<std::unique_ptr<CorpusSchema>> schemas_;
    std::vector<std::pair<const CorpusSchema*, std::string>> outs_;
};

#define REQUIRE_VALIDATOR()                                                          \
    if (!minfer::testing::python_jsonschema_available())                             \
    GTEST_SKIP() << "python3 with jsonschema is missing (scripts/setup.sh installs " \
                    "python3-jsonschema)"

// response_format json_schema: a bounded schema (every string and array has
// a maximum), so a reply must finish: each ends "stop" and validates, at
// temperature 0 (streamed equal to whole) and 1 (several samples).
TEST_F(ServeStructured, JsonSchemaRepliesValidateStreamedAndNot) {
    REQUIRE_VALIDATOR();
    Validation v;
    std::string greedy;
    for (bool stream : {false, true}) {
        for (double temp : {0.0, 1.0}) {
            json body = with_schema(chat("Describe a person.", 400), kPersonSchema);
            body["stream"] = stream;
            body["temperature"] = temp;
            body["n"] = temp > 0 ? 3 : 1;
            body["seed"] = stream ? 11 : 5;
            const auto cs = choices_of(post("/v1/chat/completions", body), true, stream);
            ASSERT_EQ(cs.size(), body["n"].get<size_t>());
            for (const auto& c : cs) {
                EXPECT_EQ(c.finish, "stop") << c.text;
                v.add("person", kPersonSchema, c.text);
            }
            if (temp == 0 && !stream) greedy = cs[0].text;
            if (temp == 0 && stream) {
                EXPECT_EQ(cs[0].text, greedy);
            }
        }
    }
    EXPECT_EQ(v.failures(), "");
}

// response_format json_object: any object. Unbounded: with random weights
// a string rarely closes, so a reply is often cut by max_tokens ("length");
// sampled near uniformly (temperature 2, no top-k / top-p / min-p) about
// half end "stop" within 200 tokens, and each of those is an object.
TEST_F(ServeStructured, JsonObjectRepliesAreObjects) {
    size_t stopped = 0;
    for (bool stream : {false, true}) {
        json body = chat("Give me some JSON.", 200);
        body["response_format"] = {{"type", "json_object"}};
        body["stream"] = stream;
        body["temperature"] = 2.0;
        body["top_k"] = 0;
        body["top_p"] = 1.0;
        body["min_p"] = 0.0;
        body["seed"] = stream ? 10 : 1;
        body["n"] = 4;
        for (const auto& c : choices_of(post("/v1/chat/completions", body), true, stream)) {
            ASSERT_TRUE(c.finish == "stop" || c.finish == "length") << c.finish;
            EXPECT_EQ(c.text.rfind("{", 0), 0u) << c.text;
            if (c.finish != "stop") continue;
            ++stopped;
            const json j = json::parse(c.text, nullptr, false);
            EXPECT_TRUE(j.is_object()) << c.text;
        }
    }
    EXPECT_GE(stopped, 2u) << "too few replies finished to check";
}

// llama-server's fields: json_schema and grammar on /v1/completions (the
// text is the constrained output, nothing around it), and grammar on chat
// (the whole reply).
TEST_F(ServeStructured, LlamaServerJsonSchemaAndGrammarFields) {
    REQUIRE_VALIDATOR();
    Validation v;
    const std::regex answer(R"((yes|no), [0-9]{1,3}\.)");
    for (bool stream : {false, true}) {
        json c = {{"prompt", "Tell me about a person:"},
                  {"max_tokens", 400},
                  {"temperature", 1.0},
                  {"seed", 21},
                  {"n", 2},
                  {"stream", stream},
                  {"json_schema", kPersonSchema}};
        for (const auto& x : choices_of(post("/v1/completions", c), false, stream)) {
            EXPECT_EQ(x.finish, "stop") << x.text;
            v.add("completions json_schema", kPersonSchema, x.text);
        }
        c.erase("json_schema");
        c["grammar"] = "root ::= (\"yes\" | \"no\") \", \" [0-9]{1,3} \".\"\n";
        for (const auto& x : choices_of(post("/v1/completions", c), false, stream)) {
            EXPECT_EQ(x.finish, "stop") << x.text;
            EXPECT_TRUE(std::regex_match(x.text, answer)) << x.text;
        }
        json b = chat("Yes or no?", 40);
        b["grammar"] = c["grammar"];
        b["stream"] = stream;
        for (const auto& x : choices_of(post("/v1/chat/completions", b), true, stream)) {
            EXPECT_EQ(x.finish, "stop") << x.text;
            EXPECT_TRUE(std::regex_match(x.text, answer)) << x.text;
        }
    }
    EXPECT_EQ(v.size(), 4u);
    EXPECT_EQ(v.failures(), "");
}

const json kTimeTool = json::parse(R"({"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object",
        "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": false}}})");

// tool_choice required / named on Qwen's vocabulary: the reply is exactly
// one call (parallel_tool_calls false) of an offered tool, or the named
// one, with arguments valid against its parameters; finish "tool_calls".
TEST_F(ServeStructured, ForcedToolCallsHaveValidArguments) {
    REQUIRE_VALIDATOR();
    Validation v;
    auto params = [](const std::string& name) {
        return ojson::parse(
            (name == "get_time" ? kTimeTool : kWeatherTool)["function"]["parameters"].dump());
    };
    for (bool stream : {false, true}) {
        for (const json& choice :
             {json("required"), json{{"type", "function"}, {"function", {{"name", "get_time"}}}}}) {
            SCOPED_TRACE(choice.dump() + (stream ? " streamed" : ""));
            json body = chat("What is the weather?", 200);
            body["tools"] = {kWeatherTool, kTimeTool};
            body["tool_choice"] = choice;
            body["parallel_tool_calls"] = false;
            body["stream"] = stream;
            body["temperature"] = 1.0;
            body["seed"] = 8;
            body["n"] = 3;
            for (const auto& c : choices_of(post("/v1/chat/completions", body), true, stream)) {
                EXPECT_EQ(c.finish, "tool_calls") << c.text << c.calls.dump();
                EXPECT_EQ(c.text, "");
                if (!stream) {
                    EXPECT_TRUE(c.content_null);
                }
                ASSERT_EQ(c.calls.size(), 1u) << c.calls.dump();
                const std::string name = c.calls[0]["function"]["name"];
                if (choice.is_object()) {
                    EXPECT_EQ(name, "get_time");
                }
                ASSERT_TRUE(name == "get_time" || name == "get_weather") << name;
                v.add(name, params(name), c.calls[0]["function"]["arguments"]);
            }
        }
    }
    EXPECT_EQ(v.size(), 12u);
    EXPECT_EQ(v.failures(), "");
}

// Each constrained token's mask time reaches /metrics (p50, p99, count) and
// the request's log line.
TEST_F(ServeStructured, MaskTimesInMetricsAndLog) {
    const std::string m0 = metrics();
    const size_t skip = log_line_count();
    auto r = post("/v1/chat/completions", with_schema(chat("Who?", 400), kPersonSchema));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const int64_t tokens = json::parse(r->body)["usage"]["completion_tokens"];
    ASSERT_GT(tokens, 5);
    const std::string m1 = metrics();
    EXPECT_EQ(metric_value(m1, "minfer_constraint_mask_microseconds_count") -
                  metric_value(m0, "minfer_constraint_mask_microseconds_count"),
              tokens);
    EXPECT_GT(metric_value(m1, "minfer_constraint_mask_microseconds{quantile=\"0.5\"}"), 0);
    EXPECT_GE(metric_value(m1, "minfer_constraint_mask_microseconds{quantile=\"0.99\"}"),
              metric_value(m1, "minfer_constraint_mask_microseconds{quantile=\"0.5\"}"));
    EXPECT_GE(metric_value(m1, "minfer_constraint_mask_wait_seconds_total"), 0);
    EXPECT_NE(wait_log_line(skip, "generated=" + std::to_string(tokens) +
                                      " .*constraint=json_schema .* mask p50=[0-9.]+ us "
                                      "p99=[0-9.]+ us"),
              "");
}

}  // namespace
