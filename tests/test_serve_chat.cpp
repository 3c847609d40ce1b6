// The server's text handling without a server: stop strings held back
// while streaming, replies split into reasoning / content / tool calls (fed
// whole and byte by byte alike), and the Qwen2.5 / Qwen3 tool prompts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "serve/chat_prompt.h"
#include "serve/reply_parser.h"

namespace {

using minfer::serve::ChatFlavor;
using minfer::serve::ChatMsg;
using minfer::serve::ReplyParser;
using minfer::serve::ReplyPart;
using ojson = nlohmann::ordered_json;

struct Split {
    std::string content, reasoning;
    std::vector<std::pair<std::string, std::string>> calls;
};

Split collect(const std::vector<ReplyPart>& parts, Split s = {}) {
    for (const auto& p : parts) {
        if (p.kind == ReplyPart::Content) s.content += p.text;
        if (p.kind == ReplyPart::Reasoning) s.reasoning += p.text;
        if (p.kind == ReplyPart::ToolCall) s.calls.emplace_back(p.name, p.arguments);
    }
    return s;
}

Split parse_whole(const std::string& text, bool think, bool tools) {
    ReplyParser p(think, tools);
    Split s = collect(p.feed(text));
    return collect(p.finish(), s);
}

Split parse_bytewise(const std::string& text, bool think, bool tools) {
    ReplyParser p(think, tools);
    Split s;
    for (char c : text) s = collect(p.feed(std::string(1, c)), s);
    return collect(p.finish(), s);
}

TEST(ServeReply, ThinkBlockBecomesReasoning) {
    const std::string reply = "<think>\nThe user greets me.\n</think>\n\nHello there!";
    for (auto parse : {parse_whole, parse_bytewise}) {
        Split s = parse(reply, true, false);
        EXPECT_EQ(s.reasoning, "\nThe user greets me.\n");
        EXPECT_EQ(s.content, "Hello there!");
        EXPECT_TRUE(s.calls.empty());
    }
    // Without thinking the tags are plain text.
    EXPECT_EQ(parse_whole(reply, false, false).content, reply);
    // A reply that does not open with <think> is all content, even if it says "<thi".
    EXPECT_EQ(parse_bytewise("<thing> is not a tag", true, false).content, "<thing> is not a tag");
    // Cut off while thinking: what was thought is reasoning.
    EXPECT_EQ(parse_whole("<think>half a thou", true, false).reasoning, "half a thou");
}

TEST(ServeReply, ToolCallBlocksBecomeCalls) {
    const std::string reply =
        "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": "
        "{}}\n</tool_call>";
    for (auto parse : {parse_whole, parse_bytewise}) {
        Split s = parse(reply, false, true);
        EXPECT_EQ(s.content, "Let me look.");  // the blanks before a call are not content
        ASSERT_EQ(s.calls.size(), 2u);
        EXPECT_EQ(s.calls[0].first, "get_weather");
        EXPECT_EQ(s.calls[0].second, R"({"city":"Paris","days":2})");  // key order kept
        EXPECT_EQ(s.calls[1].first, "now");
        EXPECT_EQ(s.calls[1].second, "{}");
    }
    // Not JSON inside the block, or never closed: given back as text.
    EXPECT_EQ(parse_whole("<tool_call>oops</tool_call>", false, true).content,
              "<tool_call>oops</tool_call>");
    EXPECT_EQ(parse_whole("<tool_call>{\"name\"", false, true).content, "<tool_call>{\"name\"");
    // Without tools offered, the tags are text.
    EXPECT_TRUE(parse_whole(reply, false, false).calls.empty());
}

// Blanks at the end of content are held until more content follows, and
// dropped at the reply's end: a stream never sends what the whole answer
// would not hold.
TEST(ServeReply, TrailingBlanksHeldThenDropped) {
    ReplyParser p(true, false);
    Split s = collect(p.feed("<think>x</think>\n\nHello "));
    EXPECT_EQ(s.content, "Hello");
    s = collect(p.feed("\nworld \n"), s);
    EXPECT_EQ(s.content, "Hello \nworld");
    s = collect(p.finish(), s);
    EXPECT_EQ(s.content, "Hello \nworld");
    EXPECT_EQ(s.reasoning, "x");
}

TEST(ServeReply, StreamHoldsBackHalfATag) {
    ReplyParser p(false, true);
    Split s = collect(p.feed("Sure <tool_"));
    EXPECT_EQ(s.content,
              "Sure");  // "<tool_" may open a call (and the blank end content): not shown yet
    s = collect(p.feed("box> is text"), s);
    EXPECT_EQ(s.content, "Sure <tool_box> is text");
}

TEST(ServeChatPrompt, Qwen25ToolsSectionAndToolTurns) {
    ChatFlavor f = minfer::serve::chat_flavor(
        "{{ 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }} <tool_call>",
        false);
    EXPECT_FALSE(f.qwen3);
    ojson tool = ojson::parse(
        R"({"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})");
    std::vector<ChatMsg> msgs = {{"user", "Weather in Paris?", {}},
                                 {"assistant", "", {{"get_weather", ojson{{"city", "Paris"}}}}},
                                 {"tool", "{\"temp\": 21}", {}},
                                 {"tool", "sunny", {}}};
    const std::string got = minfer::serve::render_chat(msgs, {tool}, f, false);
    const std::string want =
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML "
        "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": "
        "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each "
        "function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n"
        "sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    EXPECT_EQ(got, want);
    // Without tools, Qwen2.5's default system prompt still opens the conversation.
    EXPECT_EQ(minfer::serve::render_chat({{"user", "hi", {}}}, {}, f, false),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
              "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ServeChatPrompt, Qwen3ThinkingAndToolCalls) {
    ChatFlavor f = minfer::serve::chat_flavor("{%- if enable_thinking is defined %}", true);
    EXPECT_TRUE(f.qwen3);
    EXPECT_TRUE(f.default_system.empty());
    std::vector<ChatMsg> msgs = {
        {"system", "Be brief.", {}},
        {"user", "2+2?", {}},
        {"assistant", "<think>\nadd\n</think>\n\n4", {}},
        {"user", "Weather?", {}},
        {"assistant", "Checking.", {{"w", ojson::object()}}},
    };
    const std::string got = minfer::serve::render_chat(msgs, {}, f, true);
    EXPECT_EQ(
        got,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
        // The last message, after the last query: the template gives it
        // a think block even when empty (checked against the GGUF's
        // jinja template rendered by Jinja2).
        "<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n<tool_call>\n{\"name\": "
        "\"w\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>assistant\n<think>\n\n"
        "</think>\n\n");
}

// Qwen3's template shows reasoning again only in the assistant turns after
// the last real user query (a tool-calling run in progress); earlier turns
// keep only their text after </think>. The reasoning may come inside content
// or as reasoning_content, as clients send it back.
TEST(ServeChatPrompt, Qwen3KeepsReasoningOfTheCurrentToolRun) {
    ChatFlavor f = minfer::serve::chat_flavor("{%- if enable_thinking is defined %}", true);
    const ojson no_args = ojson::object();
    std::vector<ChatMsg> in_content = {
        {"system", "Be brief.", {}},
        {"user", "2+2?", {}},
        {"assistant", "<think>\nadd\n</think>\n\n4", {}},
        {"user", "Weather?", {}},
        {"assistant", "<think>\nneed a tool\n</think>\n\n", {{"w", no_args}}},
        {"tool", "sunny", {}},
    };
    const std::string want =
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed a tool\n</think>\n\n<tool_call>\n{\"name\": "
        "\"w\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
        "sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    EXPECT_EQ(minfer::serve::render_chat(in_content, {}, f, false), want);

    std::vector<ChatMsg> as_field = in_content;
    as_field[2].content = "4";
    as_field[2].reasoning = "add";
    as_field[4].content = "";
    as_field[4].reasoning = "\nneed a tool\n";
    EXPECT_EQ(minfer::serve::render_chat(as_field, {}, f, false), want);

    // A user turn that only carries tool results is not a query: the run
    // (and its reasoning) continues past it.
    std::vector<ChatMsg> wrapped = in_content;
    wrapped[5] = {"user", "<tool_response>\nsunny\n</tool_response>", {}};
    EXPECT_NE(minfer::serve::render_chat(wrapped, {}, f, false).find("<think>\nneed a tool"),
              std::string::npos);
    // After a new query the earlier run's reasoning is dropped.
    std::vector<ChatMsg> later = in_content;
    later.push_back({"user", "Thanks", {}});
    EXPECT_EQ(minfer::serve::render_chat(later, {}, f, false).find("need a tool"),
              std::string::npos);

    // Qwen2.5 has no reasoning: content is written as sent.
    ChatFlavor q25;
    EXPECT_NE(minfer::serve::render_chat(in_content, {}, q25, false)
                  .find("<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>"),
              std::string::npos);
}

TEST(ServeChatPrompt, PythonJsonSpacing) {
    ojson j = ojson::parse(R"({"b":[1,2.5,"é\n"],"a":{"x":null,"y":true}})");
    EXPECT_EQ(minfer::serve::python_json(j),
              "{\"b\": [1, 2.5, \"é\\n\"], \"a\": {\"x\": null, \"y\": true}}");
}

}  // namespace
