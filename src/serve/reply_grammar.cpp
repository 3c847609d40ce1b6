#include "serve/reply_grammar.h"

#include <nlohmann/json.hpp>

#include "structured/grammar.h"
#include "util/error.h"

namespace minfer::serve {

namespace {

bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

// Copies s[i..] up to and including the unescaped `close` (a literal's or a
// class's end); returns the index after it.
size_t copy_until(std::string_view s, size_t i, char close, std::string& out) {
    out += s[i++];
    while (i < s.size() && s[i] != close) {
        if (s[i] == '\\' && i + 1 < s.size()) out += s[i++];
        out += s[i++];
    }
    if (i < s.size()) out += s[i++];
    return i;
}

// Qwen3's reasoning block as its template writes it ("<think>\n...\n</think>\n\n").
// Its text is anything that does not contain "</think>": every '<' starts
// either a proper prefix of "</think>" followed by another '<' or the end
// (think-open), or such a prefix followed by a character that breaks the
// match (think-lt); other characters are free.
const char* kThinkRules =
    "think ::= \"<think>\" think-text \"</think>\" \"\\n\"{0,2}\n"
    "think-text ::= ([^<] | think-open* think-lt)* think-open*\n"
    "think-open ::= \"<\" (\"/\" (\"t\" (\"h\" (\"i\" (\"n\" \"k\"?)?)?)?)?)?\n"
    "think-lt ::= \"<\" ([^/<] | \"/\" ([^t<] | \"t\" ([^h<] | \"h\" ([^i<] | \"i\" ([^n<] | "
    "\"n\" ([^k<] | \"k\" [^><]))))))\n";

}  // namespace

std::string prefix_gbnf_rules(std::string_view gbnf, const std::string& prefix) {
    std::string out;
    out.reserve(gbnf.size() * 5 / 4);
    size_t i = 0;
    while (i < gbnf.size()) {
        const char c = gbnf[i];
        if (c == '"') {
            i = copy_until(gbnf, i, '"', out);
        } else if (c == '[') {
            i = copy_until(gbnf, i, ']', out);
        } else if (c == '{') {
            i = copy_until(gbnf, i, '}', out);
        } else if (c == '#') {
            while (i < gbnf.size() && gbnf[i] != '\n') out += gbnf[i++];
        } else if (is_word_char(c)) {
            // Outside literals, classes and counts a word is a rule name.
            out += prefix;
            while (i < gbnf.size() && is_word_char(gbnf[i])) out += gbnf[i++];
        } else {
            out += gbnf[i++];
        }
    }
    return out;
}

std::string chat_reply_gbnf(bool think, const std::vector<ToolGrammar>& tools, bool parallel,
                            const std::string& content_gbnf) {
    if (tools.empty() && content_gbnf.empty())
        throw Error("chat_reply_gbnf: neither tools nor a content grammar");
    std::string body;
    std::string rules;
    if (!tools.empty()) {
        body = "tool-calls";
        rules += parallel ? "tool-calls ::= tool-call (\"\\n\" tool-call)*\n"
                          : "tool-calls ::= tool-call\n";
        rules += "tool-call ::= " + structured::gbnf_literal("<tool_call>\n{\"name\": ") + " (";
        for (size_t i = 0; i < tools.size(); ++i)
            rules += (i ? " | tool-" : "tool-") + std::to_string(i);
        rules += ") " + structured::gbnf_literal("}\n</tool_call>") + "\n";
        for (size_t i = 0; i < tools.size(); ++i) {
            const std::string prefix = "tool" + std::to_string(i) + "_";
            // The name as the template writes it: a JSON string.
            rules += "tool-" + std::to_string(i) + " ::= " +
                     structured::gbnf_literal(nlohmann::json(tools[i].name).dump() +
                                              ", \"arguments\": ") +
                     " " + prefix + "root\n";
            rules += prefix_gbnf_rules(tools[i].arguments_gbnf, prefix);
            if (rules.back() != '\n') rules += '\n';
        }
    }
    if (!content_gbnf.empty()) {
        body = body.empty() ? "content_root" : "(" + body + " | content_root)";
        rules += prefix_gbnf_rules(content_gbnf, "content_");
        if (rules.back() != '\n') rules += '\n';
    }
    std::string out = "root ::= " + std::string(think ? "think? " : "") + body + "\n";
    if (think) out += kThinkRules;
    return out + rules;
}

}  // namespace minfer::serve
