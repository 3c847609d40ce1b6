// The grammar of a constrained chat reply (serve/reply_grammar.h), checked
// against the two ends it must agree with: the text chat_prompt.cpp renders
// for an assistant turn's tool calls (what the model was trained to write,
// Qwen2.5 and Qwen3 flavours) is a sentence of the grammar, and the reply
// parser reads the calls back from it; what the format forbids (content
// before a forced call, an unknown name, arguments against the schema, a
// second call when parallel calls are off, "</think>" inside the think
// block) is refused.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/chat_prompt.h"
#include "serve/reply_grammar.h"
#include "serve/reply_parser.h"
#include "structured/compiled.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"

namespace {

using minfer::serve::chat_reply_gbnf;
using minfer::serve::ChatMsg;
using minfer::serve::ReplyParser;
using minfer::serve::ReplyPart;
using minfer::serve::ToolGrammar;
using ojson = nlohmann::ordered_json;
namespace structured = minfer::structured;

// Whether `text` is a whole sentence of the grammar.
bool accepts(const std::string& gbnf, const std::string& text) {
    auto g = std::make_shared<const structured::CompiledGrammar>(
        structured::compile_grammar(structured::parse_gbnf(gbnf)));
    structured::Matcher m(g);
    return m.accept_bytes(text) && m.is_complete();
}

const ojson kWeatherParams = ojson::parse(R"({"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city"], "additionalProperties": false})");
const ojson kNoParams =
    ojson::parse(R"({"type": "object", "properties": {}, "additionalProperties": false})");

std::vector<ToolGrammar> tools() {
    return {{"get_weather", structured::json_schema_to_gbnf(kWeatherParams)},
            {"get_time", structured::json_schema_to_gbnf(kNoParams)}};
}

// The reply an assistant turn with these calls is rendered as: the text
// between the last "<|im_start|>assistant\n" with content and "<|im_end|>".
std::string rendered_reply(const minfer::serve::ChatFlavor& flavor, const ChatMsg& turn) {
    const std::string all =
        minfer::serve::render_chat({{"user", "Weather in Paris?", {}}, turn}, {}, flavor, false);
    const std::string open = "<|im_start|>assistant\n";
    const size_t begin = all.rfind(open, all.size() - open.size() - 1) + open.size();
    return all.substr(begin, all.find("<|im_end|>", begin) - begin);
}

std::vector<std::pair<std::string, std::string>> parsed_calls(const std::string& reply, bool think,
                                                              std::string* reasoning = nullptr) {
    ReplyParser p(think, true);
    auto parts = p.feed(reply);
    for (auto& x : p.finish()) parts.push_back(std::move(x));
    std::vector<std::pair<std::string, std::string>> calls;
    for (const auto& x : parts) {
        if (x.kind == ReplyPart::ToolCall) calls.emplace_back(x.name, x.arguments);
        if (x.kind == ReplyPart::Reasoning && reasoning) *reasoning += x.text;
        EXPECT_NE(x.kind, ReplyPart::Content) << "content in a forced call: " << x.text;
    }
    return calls;
}

TEST(ServeReplyGrammar, PrefixRenamesRulesOnly) {
    const std::string in =
        "root ::= item (\",\" item){0,3}  # an item list, root\n"
        "item ::= \"item \\\" root\" [a-z\\]]+ hex{2} | hex\n"
        "hex ::= [0-9a-f]\n";
    const std::string out = minfer::serve::prefix_gbnf_rules(in, "p_");
    EXPECT_EQ(out,
              "p_root ::= p_item (\",\" p_item){0,3}  # an item list, root\n"
              "p_item ::= \"item \\\" root\" [a-z\\]]+ p_hex{2} | p_hex\n"
              "p_hex ::= [0-9a-f]\n");
    // The same language under the new names.
    const std::string renamed = "root ::= p_root\n" + out;
    for (const char* s : {"item \" rootab]0f,item \" rootx00", "7"}) {
        EXPECT_TRUE(accepts(in, s)) << s;
        EXPECT_TRUE(accepts(renamed, s)) << s;
    }
    EXPECT_FALSE(accepts(renamed, "item \" root"));
}

// Qwen2.5: the calls as the template renders them, one or several.
TEST(ServeReplyGrammar, ToolCallsAsQwen25RendersThem) {
    minfer::serve::ChatFlavor q25;
    ChatMsg two{"assistant",
                "",
                {{"get_weather", ojson::parse(R"({"city": "Paris", "days": 3})")},
                 {"get_time", ojson::object()}}};
    const std::string reply = rendered_reply(q25, two);
    ASSERT_EQ(reply,
              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
              "\"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
              "{}}\n</tool_call>");
    const std::string parallel = chat_reply_gbnf(false, tools(), true, "");
    EXPECT_TRUE(accepts(parallel, reply));
    const auto calls = parsed_calls(reply, false);
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0], std::make_pair(std::string("get_weather"),
                                       std::string(R"({"city":"Paris","days":3})")));
    EXPECT_EQ(calls[1], std::make_pair(std::string("get_time"), std::string("{}")));

    // parallel_tool_calls false: exactly one call.
    const std::string single = chat_reply_gbnf(false, tools(), false, "");
    EXPECT_FALSE(accepts(single, reply));
    const std::string first = reply.substr(0, reply.find("\n<tool_call>", 1));
    EXPECT_TRUE(accepts(single, first)) << first;

    // What a forced call may not be.
    EXPECT_FALSE(accepts(parallel, "Sure.\n" + first)) << "content before the call";
    EXPECT_FALSE(accepts(parallel, first + "\nDone.")) << "content after the call";
    EXPECT_FALSE(accepts(parallel, "")) << "no call";
    EXPECT_FALSE(
        accepts(parallel, "<tool_call>\n{\"name\": \"get_news\", \"arguments\": {}}\n</tool_call>"))
        << "a tool not offered";
    EXPECT_FALSE(accepts(
        parallel,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>"))
        << "a required argument missing";
    EXPECT_FALSE(accepts(parallel,
                         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                         "\"Paris\", \"days\": 9}}\n</tool_call>"))
        << "days above its maximum";
    // A named function: only its grammar is given.
    const std::string named = chat_reply_gbnf(false, {tools()[1]}, true, "");
    EXPECT_FALSE(accepts(named, first));
    EXPECT_TRUE(
        accepts(named, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
}

// Qwen3: the think block the template renders before the calls, optional,
// its text anything without "</think>".
TEST(ServeReplyGrammar, Qwen3ThinkBlockThenCalls) {
    const auto q3 = minfer::serve::chat_flavor("{%- if enable_thinking is defined %}", true);
    ChatMsg turn{"assistant", "", {{"get_weather", ojson::parse(R"({"city": "Paris"})")}}};
    turn.reasoning = "I need the weather </thinking> <<tool_call> </thin";
    const std::string reply = rendered_reply(q3, turn);
    ASSERT_EQ(reply.rfind("<think>\nI need the weather", 0), 0u) << reply;
    const std::string g = chat_reply_gbnf(true, tools(), true, "");
    EXPECT_TRUE(accepts(g, reply)) << reply;
    std::string reasoning;
    const auto calls = parsed_calls(reply, true, &reasoning);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].first, "get_weather");
    EXPECT_EQ(reasoning, "\nI need the weather </thinking> <<tool_call> </thin\n");

    const std::string call = reply.substr(reply.rfind("</think>\n\n") + 10);
    EXPECT_TRUE(accepts(g, call)) << "the think block is optional";
    EXPECT_FALSE(accepts(g, "<think>\na</think> b\n</think>\n\n" + call))
        << "the block ends at the first </think>";
    EXPECT_FALSE(accepts(g, "<think>\na\n</think>\n\nLet me check.\n" + call));
    // Thinking off (Qwen2.5, or enable_thinking false): no think block.
    EXPECT_FALSE(accepts(chat_reply_gbnf(false, tools(), true, ""), reply));
}

// response_format with tools offered (tool_choice auto): the JSON reply or a
// call, after the think block when thinking is on.
TEST(ServeReplyGrammar, ContentOrCall) {
    const std::string g = chat_reply_gbnf(true, tools(), true, structured::json_object_gbnf());
    EXPECT_TRUE(accepts(g, "{\"a\": [1, \"x\"]}"));
    EXPECT_TRUE(accepts(g, "<think>\nhm\n</think>\n\n{\"a\": 1}"));
    EXPECT_TRUE(
        accepts(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
    EXPECT_FALSE(accepts(g, "[1]"));
    EXPECT_FALSE(accepts(g, "Here: {\"a\": 1}"));
    const std::string content_only =
        chat_reply_gbnf(false, {}, true, structured::json_object_gbnf());
    EXPECT_TRUE(accepts(content_only, "{}"));
    EXPECT_FALSE(accepts(content_only,
                         "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"));
}

}  // namespace
