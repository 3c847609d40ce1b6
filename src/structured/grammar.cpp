#include "structured/grammar.h"

#include <algorithm>
#include <map>

#include "structured/chars_impl.h"
#include "util/error.h"

namespace minfer::structured {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

void append_utf8(std::string& out, uint32_t cp) {
    uint8_t b[4];
    const int n = encode_utf8(cp, b);
    out.append(reinterpret_cast<const char*>(b), size_t(n));
}

bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

// Sorts and merges overlapping or touching ranges.
std::vector<std::pair<uint32_t, uint32_t>> normalize(std::vector<std::pair<uint32_t, uint32_t>> r) {
    std::sort(r.begin(), r.end());
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (const auto& [lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1)
            out.back().second = std::max(out.back().second, hi);
        else
            out.push_back({lo, hi});
    }
    return out;
}

}  // namespace

std::vector<std::pair<uint32_t, uint32_t>> complement_code_points(
    std::vector<std::pair<uint32_t, uint32_t>> ranges) {
    const auto r = normalize(std::move(ranges));
    std::vector<std::pair<uint32_t, uint32_t>> out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : r) {
        if (lo > next) out.push_back({next, lo - 1});
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
    return out;
}

namespace {

class Parser {
  public:
    explicit Parser(std::string_view text) : s_(text) {}

    Grammar parse() {
        skip_blank_lines();
        while (pos_ < s_.size()) {
            parse_rule();
            skip_blank_lines();
        }
        for (const auto& [name, where] : first_use_) {
            if (!rule_ids_.count(name) || !defined_[rule_ids_.at(name)])
                throw Error("grammar: rule '" + name + "' is used at line " +
                            std::to_string(where.first) + " col " + std::to_string(where.second) +
                            " but never defined");
        }
        auto root = rule_ids_.find("root");
        if (root == rule_ids_.end() || !defined_[root->second])
            throw Error("grammar: no 'root' rule (the start rule must be named root)");
        g_.root = root->second;
        return std::move(g_);
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
            if (s_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        throw Error("grammar line " + std::to_string(line) + " col " + std::to_string(col) + ": " +
                    what);
    }
    std::pair<size_t, size_t> where() const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < pos_; ++i) {
            if (s_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        return {line, col};
    }

    bool at_end() const { return pos_ >= s_.size(); }
    char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }

    // Spaces, tabs and comments; newlines too when `newlines`.
    void skip_space(bool newlines) {
        while (!at_end()) {
            char c = peek();
            if (c == ' ' || c == '\t' || c == '\r') {
                ++pos_;
            } else if (c == '#') {
                while (!at_end() && peek() != '\n') ++pos_;
            } else if (c == '\n' && newlines) {
                ++pos_;
            } else {
                break;
            }
        }
    }
    void skip_blank_lines() { skip_space(true); }

    std::string parse_name() {
        size_t start = pos_;
        while (!at_end() && is_word_char(peek())) ++pos_;
        if (pos_ == start) fail("expected a rule name");
        return std::string(s_.substr(start, pos_ - start));
    }

    int32_t rule_id(const std::string& name) {
        auto it = rule_ids_.find(name);
        if (it != rule_ids_.end()) return it->second;
        int32_t id = int32_t(g_.rules.size());
        g_.rules.push_back(Rule{name, {}});
        defined_.push_back(false);
        rule_ids_[name] = id;
        return id;
    }

    void parse_rule() {
        std::string name = parse_name();
        skip_space(false);
        if (s_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
        pos_ += 3;
        int32_t id = rule_id(name);
        if (defined_[id]) fail("rule '" + name + "' is defined twice");
        defined_[id] = true;
        skip_space(true);
        Expr body = parse_alternatives(0);
        if (!at_end() && peek() != '\n') {
            if (peek() == ')') fail("unmatched ')'");
            fail(std::string("unexpected '") + peek() + "'");
        }
        g_.rules[id].body = std::move(body);
    }

    // Top-level rules end at a newline, except that a following line starting
    // with `|` continues the alternatives.
    bool continues_on_next_line() {
        size_t save = pos_;
        skip_space(true);
        if (peek() == '|') return true;
        pos_ = save;
        return false;
    }

    Expr parse_alternatives(int depth) {
        Expr alt;
        alt.kind = Expr::Kind::Alt;
        alt.children.push_back(parse_sequence(depth));
        for (;;) {
            if (depth == 0 && peek() == '\n' && !continues_on_next_line()) break;
            if (peek() != '|') break;
            ++pos_;
            skip_space(true);
            alt.children.push_back(parse_sequence(depth));
        }
        if (alt.children.size() == 1) return std::move(alt.children[0]);
        return alt;
    }

    Expr parse_sequence(int depth) {
        Expr seq;
        seq.kind = Expr::Kind::Seq;
        for (;;) {
            skip_space(depth > 0);
            if (at_end()) break;
            char c = peek();
            if (c == '|' || c == ')' || c == '\n') break;
            Expr item = parse_primary(depth);
            skip_space(depth > 0);
            parse_postfix(item);
            seq.children.push_back(std::move(item));
        }
        if (seq.children.size() == 1) return std::move(seq.children[0]);
        return seq;
    }

    void parse_postfix(Expr& item) {
        for (;;) {
            char c = peek();
            int32_t lo, hi;
            if (c == '*') {
                lo = 0, hi = -1, ++pos_;
            } else if (c == '+') {
                lo = 1, hi = -1, ++pos_;
            } else if (c == '?') {
                lo = 0, hi = 1, ++pos_;
            } else if (c == '{') {
                ++pos_;
                skip_space(false);
                lo = parse_count();
                skip_space(false);
                hi = lo;
                if (peek() == ',') {
                    ++pos_;
                    skip_space(false);
                    hi = peek() == '}' ? -1 : parse_count();
                    skip_space(false);
                }
                if (peek() != '}') fail("expected '}' to close the repetition {m,n}");
                ++pos_;
                if (hi != -1 && hi < lo)
                    fail("repetition {" + std::to_string(lo) + "," + std::to_string(hi) +
                         "}: the maximum is below the minimum");
            } else {
                return;
            }
            Expr rep;
            rep.kind = Expr::Kind::Repeat;
            rep.min = lo;
            rep.max = hi;
            rep.children.push_back(std::move(item));
            item = std::move(rep);
            skip_space(false);
        }
    }

    int32_t parse_count() {
        size_t start = pos_;
        int64_t v = 0;
        while (!at_end() && peek() >= '0' && peek() <= '9') {
            v = v * 10 + (peek() - '0');
            if (v > kMaxRepeatBound)
                fail("repetition count above " + std::to_string(kMaxRepeatBound));
            ++pos_;
        }
        if (pos_ == start) fail("expected a number in the repetition {m,n}");
        return int32_t(v);
    }

    uint32_t parse_hex(int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
            const int d = hex_digit_value(peek());
            if (d < 0) fail("expected " + std::to_string(n) + " hex digits in an escape");
            v = v * 16 + uint32_t(d);
            ++pos_;
        }
        return v;
    }

    // One character of a literal or class, escapes decoded, as a code point.
    uint32_t parse_char() {
        last_was_byte_escape_ = false;
        if (at_end()) fail("unexpected end of grammar inside a literal or class");
        unsigned char c = static_cast<unsigned char>(peek());
        if (c == '\\') {
            ++pos_;
            char e = peek();
            ++pos_;
            if (const int control = control_escape(e); control >= 0) return uint32_t(control);
            switch (e) {
                case '\\':
                    return '\\';
                case '"':
                    return '"';
                case '\'':
                    return '\'';
                case '[':
                    return '[';
                case ']':
                    return ']';
                case '-':
                    return '-';
                case '^':
                    return '^';
                case '/':
                    return '/';
                case 'x':
                    last_was_byte_escape_ = true;
                    return parse_hex(2);
                case 'u':
                    return check_cp(parse_hex(4));
                case 'U':
                    return check_cp(parse_hex(8));
                default:
                    pos_ -= 2;  // point at the backslash
                    fail(std::string("unknown escape '\\") + e + "'");
            }
        }
        // A UTF-8 character as it stands in the grammar text.
        const Utf8Char u = decode_utf8_at(s_, pos_);
        if (u.len == 0) fail("invalid UTF-8 in the grammar text");
        pos_ += size_t(u.len);
        return u.cp;
    }
    uint32_t check_cp(uint32_t cp) {
        if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
            fail("escape names no Unicode character (a surrogate or above U+10FFFF)");
        return cp;
    }

    Expr parse_primary(int depth) {
        char c = peek();
        if (c == '"') {
            ++pos_;
            Expr lit;
            lit.kind = Expr::Kind::Literal;
            for (;;) {
                if (at_end() || peek() == '\n') fail("unterminated string literal");
                if (peek() == '"') break;
                uint32_t cp = parse_char();
                // \xHH is a raw byte (llama.cpp's meaning), the others code points.
                if (last_was_byte_escape_)
                    lit.bytes += char(cp);
                else
                    append_utf8(lit.bytes, cp);
            }
            ++pos_;
            return lit;
        }
        if (c == '[') {
            ++pos_;
            bool negated = false;
            if (peek() == '^') {
                negated = true;
                ++pos_;
            }
            std::vector<std::pair<uint32_t, uint32_t>> ranges;
            while (peek() != ']') {
                if (at_end() || peek() == '\n') fail("unterminated character class '['");
                uint32_t lo = parse_char();
                uint32_t hi = lo;
                if (peek() == '-' && peek(1) != ']') {
                    ++pos_;
                    hi = parse_char();
                    if (hi < lo)
                        fail("character class range is backwards (its end is below its start)");
                }
                ranges.push_back({lo, hi});
            }
            ++pos_;
            Expr cls;
            cls.kind = Expr::Kind::Class;
            cls.ranges = normalize(std::move(ranges));
            if (negated) cls.ranges = complement_code_points(cls.ranges);
            if (cls.ranges.empty()) fail("character class matches nothing");
            return cls;
        }
        if (c == '.') {
            ++pos_;
            Expr cls;
            cls.kind = Expr::Kind::Class;
            cls.ranges = {{0, kMaxCodePoint}};
            return cls;
        }
        if (c == '(') {
            ++pos_;
            skip_space(true);
            Expr inner = parse_alternatives(depth + 1);
            skip_space(true);
            if (peek() != ')') fail("expected ')' to close the group");
            ++pos_;
            return inner;
        }
        if (is_word_char(c)) {
            auto at = where();
            std::string name = parse_name();
            skip_space(false);
            if (s_.substr(pos_, 3) == "::=")
                fail("'" + name +
                     "' starts a new rule inside a group or without a newline before it");
            Expr ref;
            ref.kind = Expr::Kind::RuleRef;
            ref.rule = rule_id(name);
            first_use_.emplace(name, at);
            return ref;
        }
        fail(std::string("unexpected '") + c + "'");
    }

    std::string_view s_;
    size_t pos_ = 0;
    bool last_was_byte_escape_ = false;
    Grammar g_;
    std::map<std::string, int32_t> rule_ids_;
    std::vector<bool> defined_;
    std::map<std::string, std::pair<size_t, size_t>> first_use_;
};

}  // namespace

Grammar parse_gbnf(std::string_view text) {
    return Parser(text).parse();
}

std::string gbnf_literal(std::string_view bytes) {
    std::string out = "\"";
    static const char* hex = "0123456789ABCDEF";
    for (unsigned char c : bytes) {
        if (c == '"') {
            out += "\\\"";
        } else if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else {
            out += char(c);  // UTF-8 passes through as it is
        }
    }
    return out + "\"";
}

}  // namespace minfer::structured
