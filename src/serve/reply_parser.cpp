#include "serve/reply_parser.h"

#include <algorithm>

namespace minfer::serve {

namespace {

const std::string kThinkOpen = "<think>", kThinkClose = "</think>";
const std::string kToolOpen = "<tool_call>", kToolClose = "</tool_call>";

// Length of the longest suffix of s that is a proper prefix of tag.
size_t partial_tag(const std::string& s, const std::string& tag) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
        if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
    return 0;
}

bool is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

}  // namespace

std::string python_json(const nlohmann::ordered_json& j) {
    if (j.is_object()) {
        std::string out = "{";
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            out += nlohmann::ordered_json(it.key()).dump(
                -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
            out += ": ";
            out += python_json(it.value());
        }
        return out + "}";
    }
    if (j.is_array()) {
        std::string out = "[";
        for (size_t i = 0; i < j.size(); ++i) {
            if (i) out += ", ";
            out += python_json(j[i]);
        }
        return out + "]";
    }
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void ReplyParser::emit_text(std::vector<ReplyPart>& out, ReplyPart::Kind kind, std::string text) {
    if (kind == ReplyPart::Content && !content_started_) {
        // The reply's content starts at its first non-blank character (Qwen3
        // writes "\n\n" after </think>).
        size_t i = 0;
        while (i < text.size() && is_space(text[i])) ++i;
        text.erase(0, i);
        if (text.empty()) return;
        content_started_ = true;
    }
    if (kind == ReplyPart::Content) {
        // Blanks are held back until more content follows: those before a
        // tool call (the template's separator) or at the reply's end are not
        // content, and a stream cannot take back what it has sent.
        text = std::move(held_space_) + text;
        size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        held_space_ = text.substr(end);
        text.resize(end);
    }
    if (text.empty()) return;
    if (!out.empty() && out.back().kind == kind && kind != ReplyPart::ToolCall)
        out.back().text += text;
    else
        out.push_back({kind, std::move(text), {}, {}, {}});
}

void ReplyParser::emit_tool(std::vector<ReplyPart>& out, const std::string& body) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, false);
    if (j.is_object() && j.contains("name") && j["name"].is_string()) {
        ReplyPart p;
        p.kind = ReplyPart::ToolCall;
        p.name = j["name"].get<std::string>();
        if (!j.contains("arguments"))
            p.arguments = "{}";
        else if (j["arguments"].is_string())
            p.arguments = j["arguments"].get<std::string>();
        else
            p.arguments = j["arguments"].dump(-1, ' ', false,
                                              nlohmann::ordered_json::error_handler_t::replace);
        ++n_tool_calls_;
        held_space_.clear();
        out.push_back(std::move(p));
    } else {
        // Not a call the model finished properly: give it back as text.
        emit_text(out, ReplyPart::Content, kToolOpen + body + kToolClose);
    }
}

std::vector<ReplyPart> ReplyParser::feed(const std::string& text) {
    std::vector<ReplyPart> out;
    buf_ += text;
    for (;;) {
        if (state_ == State::Start) {
            if (!think_) {
                state_ = State::Content;
                continue;
            }
            size_t i = 0;
            while (i < buf_.size() && is_space(buf_[i])) ++i;
            const std::string rest = buf_.substr(i);
            if (rest.size() < kThinkOpen.size() && kThinkOpen.compare(0, rest.size(), rest) == 0)
                return out;  // may still become <think>
            if (rest.compare(0, kThinkOpen.size(), kThinkOpen) == 0) {
                buf_ = rest.substr(kThinkOpen.size());
                state_ = State::Think;
            } else {
                state_ = State::Content;
            }
            continue;
        }
        if (state_ == State::Think) {
            const size_t pos = buf_.find(kThinkClose);
            if (pos == std::string::npos) {
                const size_t keep = partial_tag(buf_, kThinkClose);
                emit_text(out, ReplyPart::Reasoning, buf_.substr(0, buf_.size() - keep));
                buf_.erase(0, buf_.size() - keep);
                return out;
            }
            emit_text(out, ReplyPart::Reasoning, buf_.substr(0, pos));
            buf_.erase(0, pos + kThinkClose.size());
            state_ = State::Content;
            continue;
        }
        if (state_ == State::Content) {
            if (!tools_) {
                emit_text(out, ReplyPart::Content, buf_);
                buf_.clear();
                return out;
            }
            const size_t pos = buf_.find(kToolOpen);
            if (pos == std::string::npos) {
                const size_t keep = partial_tag(buf_, kToolOpen);
                emit_text(out, ReplyPart::Content, buf_.substr(0, buf_.size() - keep));
                buf_.erase(0, buf_.size() - keep);
                return out;
            }
            emit_text(out, ReplyPart::Content, buf_.substr(0, pos));
            buf_.erase(0, pos + kToolOpen.size());
            state_ = State::Tool;
            continue;
        }
        // State::Tool
        const size_t pos = buf_.find(kToolClose);
        if (pos == std::string::npos) return out;
        emit_tool(out, buf_.substr(0, pos));
        buf_.erase(0, pos + kToolClose.size());
        state_ = State::Content;
    }
}

std::vector<ReplyPart> ReplyParser::finish() {
    std::vector<ReplyPart> out;
    switch (state_) {
        case State::Start:
        case State::Content:
            emit_text(out, ReplyPart::Content, buf_);
            break;
        case State::Think:
            emit_text(out, ReplyPart::Reasoning, buf_);
            break;
        case State::Tool:
            emit_text(out, ReplyPart::Content, kToolOpen + buf_);
            break;
    }
    buf_.clear();
    held_space_.clear();  // trailing blanks end no content
    state_ = State::Content;
    return out;
}

}  // namespace minfer::serve
