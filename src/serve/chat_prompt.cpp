#include "serve/chat_prompt.h"

#include "serve/reply_parser.h"

namespace minfer::serve {

namespace {

const char* kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// An earlier reply's <think> block is not shown to the model again (the
// Qwen3 template keeps only the text after </think> for past turns).
std::string without_think(const std::string& s) {
    const size_t end = s.find("</think>");
    if (end == std::string::npos) return s;
    size_t i = end + 8;
    while (i < s.size() && s[i] == '\n') ++i;
    return s.substr(i);
}

}  // namespace

ChatFlavor chat_flavor(const std::string& jinja, bool qwen3_arch) {
    ChatFlavor f;
    if (jinja.find(kQwen25System) != std::string::npos) f.default_system = kQwen25System;
    f.qwen3 = qwen3_arch || jinja.find("enable_thinking") != std::string::npos;
    return f;
}

std::string render_chat(const std::vector<ChatMsg>& messages,
                        const std::vector<nlohmann::ordered_json>& tools, const ChatFlavor& flavor,
                        bool no_think) {
    std::string out;
    size_t first = 0;
    const bool has_system = !messages.empty() && messages[0].role == "system";
    if (!tools.empty()) {
        out += "<|im_start|>system\n";
        std::string sys = has_system ? messages[0].content : flavor.default_system;
        if (!sys.empty()) out += sys + "\n\n";
        out +=
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
        for (const auto& t : tools) out += "\n" + python_json(t);
        out +=
            "\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
            "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
        if (has_system) first = 1;
    } else if (has_system) {
        out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
        first = 1;
    } else if (!flavor.default_system.empty()) {
        out += "<|im_start|>system\n" + flavor.default_system + "<|im_end|>\n";
    }
    for (size_t i = first; i < messages.size(); ++i) {
        const ChatMsg& m = messages[i];
        if (m.role == "tool") {
            if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
            out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
            if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
            continue;
        }
        if (m.role == "assistant" && !m.tool_calls.empty()) {
            const std::string content = flavor.qwen3 ? without_think(m.content) : m.content;
            out += "<|im_start|>assistant";
            if (flavor.qwen3) {
                out += "\n" + content;
            } else if (!content.empty()) {
                out += "\n" + content;
            }
            for (size_t k = 0; k < m.tool_calls.size(); ++k) {
                if (!flavor.qwen3 || k > 0 || !content.empty()) out += "\n";
                out += "<tool_call>\n{\"name\": \"" + m.tool_calls[k].name +
                       "\", \"arguments\": " + python_json(m.tool_calls[k].arguments) +
                       "}\n</tool_call>";
            }
            out += "<|im_end|>\n";
            continue;
        }
        const std::string content =
            m.role == "assistant" && flavor.qwen3 ? without_think(m.content) : m.content;
        out += "<|im_start|>" + m.role + "\n" + content + "<|im_end|>\n";
    }
    out += "<|im_start|>assistant\n";
    if (no_think && flavor.qwen3) out += "<think>\n\n</think>\n\n";
    return out;
}

}  // namespace minfer::serve
