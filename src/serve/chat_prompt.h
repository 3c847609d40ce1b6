// The prompt of a chat request, rendered as the Qwen2.5 and Qwen3 chat
// templates do (natively, like tokenizer::render_chatml; no jinja): ChatML
// turns, the model's default system prompt where its template has one, the
// "# Tools" system section when tools are offered, assistant tool calls as
// <tool_call> blocks, and role "tool" results as <tool_response> blocks in a
// user turn.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace minfer::serve {

struct ToolCallMsg {
    std::string name;
    nlohmann::ordered_json
        arguments;  // an object (parsed from the client's JSON text when it is one)
};

struct ChatMsg {
    std::string role;  // system, user, assistant, tool
    std::string content;
    std::vector<ToolCallMsg> tool_calls;  // assistant only
    // An assistant turn's reasoning_content as the client sent it back
    // (Qwen3): shown again inside <think> when the turn follows the last
    // user query. Absent: taken from a <think> block in content, if any.
    std::optional<std::string> reasoning = std::nullopt;
};

struct ChatFlavor {
    std::string default_system;  // Qwen2.5: "You are Qwen, created by Alibaba Cloud. ..."
    bool qwen3 = false;          // <think> replies; enable_thinking
};

// The flavor from the GGUF's chat template text (may be empty) and arch.
ChatFlavor chat_flavor(const std::string& jinja, bool qwen3_arch);

// tools: the request's "tools" list (empty: none offered). no_think: Qwen3's
// enable_thinking=false (an empty think block after the generation prompt).
std::string render_chat(const std::vector<ChatMsg>& messages,
                        const std::vector<nlohmann::ordered_json>& tools, const ChatFlavor& flavor,
                        bool no_think);

}  // namespace minfer::serve
