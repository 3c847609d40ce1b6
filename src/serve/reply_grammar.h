// The grammar (GBNF, structured/grammar.h) a constrained chat reply must
// follow, in the model's own format: Qwen2.5 / Qwen3 tool calls as
// chat_prompt.cpp renders them and reply_parser.cpp reads them back,
//
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
//
// (several calls one per line), and Qwen3's optional <think>…</think> block
// before the reply when thinking is on. The pieces (each tool's arguments,
// a response_format's JSON) are grammars of their own whose rules are
// renamed apart before they are joined.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace minfer::serve {

// `gbnf` with every rule renamed prefix + name, where it is defined and
// where it is used (literals, classes, repetition counts and comments are
// left alone), so that grammars can be joined without their names meeting.
std::string prefix_gbnf_rules(std::string_view gbnf, const std::string& prefix);

// One tool a reply may call: its name and its arguments' grammar (GBNF with
// a `root` rule: json_schema_to_gbnf of its parameters).
struct ToolGrammar {
    std::string name;
    std::string arguments_gbnf;
};

// The reply's grammar.
// - think: Qwen3 with thinking on: an optional think block first (any text
//   without "</think>", then "</think>" and at most two newlines);
// - tools non-empty: a tool call of one of them (parallel: one or more,
//   one per line);
// - content_gbnf non-empty: a reply that follows it (its `root`);
// - both: either of the two. At least one must be given.
std::string chat_reply_gbnf(bool think, const std::vector<ToolGrammar>& tools, bool parallel,
                            const std::string& content_gbnf);

}  // namespace minfer::serve
