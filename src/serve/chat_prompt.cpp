#include "serve/chat_prompt.h"

#include "serve/reply_parser.h"

namespace minfer::serve {

namespace {

const char* kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// An assistant turn split as the Qwen3 template splits it: the reasoning
// (between <think> and </think>, newlines trimmed) and the content after
// </think> (leading newlines dropped). Without </think> all is content.
struct Qwen3Turn {
    std::string reasoning, content;
};

std::string trim_newlines(const std::string& s, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left)
        while (b < e && s[b] == '\n') ++b;
    if (right)
        while (e > b && s[e - 1] == '\n') --e;
    return s.substr(b, e - b);
}

Qwen3Turn split_think(const ChatMsg& m) {
    if (m.reasoning) return {*m.reasoning, m.content};
    // As the template's split('</think>'): reasoning before the first
    // </think> (after its last <think>), content after the last </think>.
    const size_t first = m.content.find("</think>");
    if (first == std::string::npos) return {"", m.content};
    std::string before = trim_newlines(m.content.substr(0, first), false, true);
    const size_t open = before.rfind("<think>");
    if (open != std::string::npos) before = before.substr(open + 7);
    const size_t last = m.content.rfind("</think>");
    return {trim_newlines(before, true, false),
            trim_newlines(m.content.substr(last + 8), true, false)};
}

// Index of the last user message that is a real query (not tool results
// wrapped as <tool_response>); the whole list's last index when there is
// none. Qwen3 shows reasoning again only for assistant turns after it: the
// steps of the tool-calling run now in progress.
size_t last_query_index(const std::vector<ChatMsg>& messages) {
    for (size_t i = messages.size(); i-- > 0;) {
        const std::string& c = messages[i].content;
        const bool tool_wrapped = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                                  c.compare(c.size() - 16, 16, "</tool_response>") == 0;
        if (messages[i].role == "user" && !tool_wrapped) return i;
    }
    return messages.empty() ? 0 : messages.size() - 1;
}

// The text after "<|im_start|>assistant\n" of a Qwen3 assistant turn (tool
// calls excluded); sets content to the part the tool calls follow.
std::string qwen3_assistant_body(const std::vector<ChatMsg>& messages, size_t i, size_t last_query,
                                 std::string& content) {
    Qwen3Turn t = split_think(messages[i]);
    content = t.content;
    const bool last = i + 1 == messages.size();
    if (i > last_query && (last || !t.reasoning.empty()))
        return "<think>\n" + trim_newlines(t.reasoning, true, true) + "\n</think>\n\n" +
               trim_newlines(t.content, true, false);
    return t.content;
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
    const size_t last_query = last_query_index(messages);
    for (size_t i = first; i < messages.size(); ++i) {
        const ChatMsg& m = messages[i];
        if (m.role == "tool") {
            if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
            out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
            if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
            continue;
        }
        if (m.role != "assistant") {
            out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
            continue;
        }
        std::string content = m.content;
        out += "<|im_start|>assistant\n";
        out += flavor.qwen3 ? qwen3_assistant_body(messages, i, last_query, content) : content;
        for (size_t k = 0; k < m.tool_calls.size(); ++k) {
            // Both templates: a newline before a call unless it is the first
            // and nothing precedes it.
            if (k > 0 || !content.empty()) out += "\n";
            out += "<tool_call>\n{\"name\": \"" + m.tool_calls[k].name +
                   "\", \"arguments\": " + python_json(m.tool_calls[k].arguments) +
                   "}\n</tool_call>";
        }
        out += "<|im_end|>\n";
    }
    out += "<|im_start|>assistant\n";
    if (no_think && flavor.qwen3) out += "<think>\n\n</think>\n\n";
    return out;
}

}  // namespace minfer::serve
