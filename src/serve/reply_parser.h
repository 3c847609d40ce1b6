// Splits a chat reply, as it streams in, into what OpenAI's API returns
// separately: Qwen3's <think>…</think> block becomes reasoning_content,
// Qwen2.5/Qwen3 <tool_call>{json}</tool_call> blocks become tool_calls, and
// the rest is content. Text that may be the start of a tag is held back
// until it is known, so a stream never shows half a tag; so are blanks at
// the end of content, dropped where a tool call or the reply follows. The
// server makes a streamed and a whole reply with the same parser, so the two
// are equal.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace minfer::serve {

struct ReplyPart {
    enum Kind { Content, Reasoning, ToolCall } kind = Content;
    std::string text;       // Content / Reasoning
    std::string name;       // ToolCall: function name
    std::string arguments;  // ToolCall: the arguments as JSON text
    std::string id;         // ToolCall: the call's id (the server sets it)
};

class ReplyParser {
  public:
    // think: the reply may open with <think> (Qwen3); tools: tool calls were offered.
    ReplyParser(bool think, bool tools) : think_(think), tools_(tools) {}
    // Adds reply text; returns the parts now complete.
    std::vector<ReplyPart> feed(const std::string& text);
    // End of the reply: everything held back, an unclosed block as text.
    std::vector<ReplyPart> finish();
    int tool_calls() const { return n_tool_calls_; }

  private:
    bool think_, tools_;
    enum class State { Start, Think, Content, Tool } state_ = State::Start;
    std::string buf_;  // not yet emitted
    int n_tool_calls_ = 0;
    bool content_started_ = false;
    std::string held_space_;  // content's trailing blanks, not yet known to be content

    void emit_text(std::vector<ReplyPart>& out, ReplyPart::Kind kind, std::string text);
    void emit_tool(std::vector<ReplyPart>& out, const std::string& body);
};

// The JSON text Python's json.dumps writes (", " and ": " separators, keys
// in the order given, non-ASCII as is): what the Qwen templates' tojson
// renders, so the prompt matches the model's training format.
std::string python_json(const nlohmann::ordered_json& j);

}  // namespace minfer::serve
