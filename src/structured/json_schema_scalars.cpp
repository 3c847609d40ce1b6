// JSON Schema -> GBNF for the leaves of a schema: strings (format,
// pattern, length), integers (bounds as digit grammars) and numbers. The
// rest of the conversion, and the rules these refer to, are in
// json_schema.cpp.
#include <cmath>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "structured/chars_impl.h"
#include "structured/grammar.h"
#include "structured/json_schema_impl.h"
#include "util/error.h"

namespace minfer::structured {

namespace {

using json = nlohmann::ordered_json;

std::string use(std::set<std::string>& uses, const std::string& primitive) {
    uses.insert(primitive);
    return primitive;
}

// ---------------------------------------------------------------------------
// Regular expressions (JSON Schema `pattern`) -> GBNF over the JSON encoding
// of the string's characters.

class PatternConverter {
  public:
    PatternConverter(std::string_view re, std::string where) : re_(re), where_(std::move(where)) {}

    // The string's content (between the quotes). `uses` collects primitives.
    std::string convert(std::set<std::string>& uses) {
        uses_ = &uses;
        uses.insert("char");
        // Top-level alternatives are anchored separately: ^a|b$ is (^a)|(b$).
        std::vector<std::string> alts;
        for (;;) {
            bool start = false, end = false;
            if (peek() == '^') {
                start = true;
                ++pos_;
            }
            std::string seq = parse_seq(true, &end);
            alts.push_back((start ? "" : "char* ") + std::string("(") + seq + ")" +
                           (end ? "" : " char*"));
            if (pos_ >= re_.size()) break;
            if (peek() != '|') fail("unexpected ')'");
            ++pos_;
        }
        std::string out;
        for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
        return alts.size() == 1 ? out : "(" + out + ")";
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        throw Error("JSON schema: pattern \"" + std::string(re_) + "\" at " + where_ + ": " + what +
                    " (column " + std::to_string(pos_ + 1) + ")");
    }
    char peek() const { return pos_ < re_.size() ? re_[pos_] : '\0'; }

    std::string parse_alt() {
        std::vector<std::string> alts = {parse_seq(false, nullptr)};
        while (peek() == '|') {
            ++pos_;
            alts.push_back(parse_seq(false, nullptr));
        }
        if (alts.size() == 1) return alts[0];
        std::string out = "(";
        for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
        return out + ")";
    }

    std::string parse_seq(bool top, bool* end_anchor) {
        std::string out;
        while (pos_ < re_.size() && peek() != '|' && peek() != ')') {
            if (peek() == '$') {
                ++pos_;
                if (!top || (pos_ < re_.size() && peek() != '|'))
                    fail(
                        "'$' is only supported at the end of the pattern or of a top-level "
                        "alternative");
                *end_anchor = true;
                break;
            }
            if (peek() == '^') fail("'^' is only supported at the start of the pattern");
            std::string atom = parse_atom();
            atom = parse_quantifier(atom);
            out += (out.empty() ? "" : " ") + atom;
        }
        return out.empty() ? "\"\"" : out;
    }

    std::string parse_quantifier(const std::string& atom) {
        char c = peek();
        std::string q;
        if (c == '*' || c == '+' || c == '?') {
            ++pos_;
            q = std::string(1, c);
        } else if (c == '{') {
            size_t save = pos_;
            ++pos_;
            std::string body;
            while (pos_ < re_.size() && (std::isdigit(uint8_t(peek())) || peek() == ','))
                body += re_[pos_++];
            if (peek() != '}' || body.empty() || !std::isdigit(uint8_t(body[0]))) {
                pos_ = save;
                return atom;  // a literal '{', as in most regex engines
            }
            ++pos_;
            q = "{" + body + "}";
        } else {
            return atom;
        }
        if (peek() == '?') ++pos_;  // lazy: the same language
        if (peek() == '+') fail("possessive quantifiers are not supported");
        return "(" + atom + ")" + q;
    }

    // Code point ranges of \d \w \s and their negations.
    static std::vector<std::pair<uint32_t, uint32_t>> shorthand(char c) {
        switch (c) {
            case 'd':
                return {{'0', '9'}};
            case 'w':
                return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
            case 's':
                return {{'\t', '\r'}, {' ', ' '}};
            default:
                return {};
        }
    }

    uint32_t parse_utf8_char() {
        const Utf8Char u = decode_utf8_at(re_, pos_);
        if (u.len == 0) fail("invalid UTF-8");
        pos_ += size_t(u.len);
        return u.cp;
    }

    // One escaped character after '\' (not a shorthand class).
    uint32_t parse_escape_char() {
        char e = peek();
        ++pos_;
        if (const int control = control_escape(e); control >= 0) return uint32_t(control);
        switch (e) {
            case 'f':
                return '\f';
            case 'v':
                return '\v';
            case '0':
                return 0;
            case 'x': {
                uint32_t v = 0;
                for (int i = 0; i < 2; ++i) v = v * 16 + hex_digit();
                return v;
            }
            case 'u': {
                uint32_t v = 0;
                for (int i = 0; i < 4; ++i) v = v * 16 + hex_digit();
                return v;
            }
            default:
                if (std::isalnum(uint8_t(e))) {
                    --pos_;
                    fail(std::string("escape \\") + e + " is not supported");
                }
                return uint8_t(e);
        }
    }
    uint32_t hex_digit() {
        const int d = hex_digit_value(peek());
        ++pos_;
        if (d < 0) fail("expected a hex digit");
        return uint32_t(d);
    }

    std::string parse_atom() {
        char c = peek();
        if (c == '(') {
            ++pos_;
            if (peek() == '?') {
                if (re_.substr(pos_, 2) == "?:") {
                    pos_ += 2;
                } else {
                    fail(
                        "group syntax (? other than (?: is not supported (lookaround, named "
                        "groups)");
                }
            }
            std::string inner = parse_alt();
            if (peek() != ')') fail("expected ')'");
            ++pos_;
            return "(" + inner + ")";
        }
        if (c == '[') return parse_class();
        if (c == '.') {
            ++pos_;
            return char_class(complement_code_points({{'\n', '\n'}}));
        }
        if (c == '*' || c == '+' || c == '?' || c == ')')
            fail(std::string("unexpected '") + c + "'");
        if (c == '\\') {
            ++pos_;
            char e = peek();
            if (e == 'd' || e == 'w' || e == 's') {
                ++pos_;
                return char_class(shorthand(e));
            }
            if (e == 'D' || e == 'W' || e == 'S') {
                ++pos_;
                return char_class(complement_code_points(shorthand(char(std::tolower(e)))));
            }
            if (e == 'b' || e == 'B') fail("word boundaries are not supported");
            if (e >= '1' && e <= '9') fail("backreferences are not supported");
            return char_class({{parse_escape_char(), 0}}, true);
        }
        uint32_t cp = parse_utf8_char();
        return char_class({{cp, cp}});
    }

    std::string parse_class() {
        ++pos_;  // '['
        bool negated = false;
        if (peek() == '^') {
            negated = true;
            ++pos_;
        }
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        bool first = true;
        while (pos_ < re_.size() && (peek() != ']' || first)) {
            first = false;
            uint32_t lo;
            if (peek() == '\\') {
                ++pos_;
                char e = peek();
                auto sh = shorthand(char(std::tolower(e)));
                if (!sh.empty()) {
                    ++pos_;
                    if (std::isupper(uint8_t(e))) sh = complement_code_points(sh);
                    ranges.insert(ranges.end(), sh.begin(), sh.end());
                    continue;
                }
                lo = parse_escape_char();
            } else {
                lo = parse_utf8_char();
            }
            uint32_t hi = lo;
            if (peek() == '-' && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
                ++pos_;
                if (peek() == '\\') {
                    ++pos_;
                    hi = parse_escape_char();
                } else {
                    hi = parse_utf8_char();
                }
                if (hi < lo) fail("character class range is backwards");
            }
            ranges.push_back({lo, hi});
        }
        if (peek() != ']') fail("unterminated character class");
        ++pos_;
        if (negated) ranges = complement_code_points(ranges);
        if (ranges.empty()) fail("character class matches nothing");
        return char_class(ranges);
    }

    // A set of characters as they appear inside a JSON string: the ones JSON
    // writes as they are in one class, the rest (", \, controls) as escapes.
    std::string char_class(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool single = false) {
        if (single) ranges[0].second = ranges[0].first;
        std::sort(ranges.begin(), ranges.end());
        std::vector<std::string> alts;
        std::string cls;
        static const char* hex = "0123456789ABCDEF";
        auto cp_text = [&](uint32_t cp) {
            char buf[16];
            std::snprintf(buf, sizeof buf, "\\U%08X", cp);
            return std::string(buf);
        };
        for (auto [lo, hi] : ranges) {
            for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
                if (cp < 0x20 || cp == '"' || cp == '\\') {
                    std::string esc;
                    switch (cp) {
                        case '"':
                            esc = "\\\"";
                            break;
                        case '\\':
                            esc = "\\\\";
                            break;
                        case '\n':
                            esc = "\\n";
                            break;
                        case '\r':
                            esc = "\\r";
                            break;
                        case '\t':
                            esc = "\\t";
                            break;
                        case '\b':
                            esc = "\\b";
                            break;
                        case '\f':
                            esc = "\\f";
                            break;
                        default:
                            esc = std::string("\\u00") + hex[cp >> 4] + hex[cp & 15];
                    }
                    alts.push_back(gbnf_literal(esc));
                }
            }
            // The part JSON writes as it is, minus " and \.
            std::vector<std::pair<uint32_t, uint32_t>> plain = {{std::max<uint32_t>(lo, 0x20), hi}};
            for (uint32_t x : {uint32_t('"'), uint32_t('\\')}) {
                std::vector<std::pair<uint32_t, uint32_t>> cut;
                for (auto [a, b] : plain) {
                    if (a > b) continue;
                    if (x < a || x > b) {
                        cut.push_back({a, b});
                        continue;
                    }
                    if (a < x) cut.push_back({a, x - 1});
                    if (x < b) cut.push_back({x + 1, b});
                }
                plain = cut;
            }
            for (auto [a, b] : plain)
                if (a <= b) cls += a == b ? cp_text(a) : cp_text(a) + "-" + cp_text(b);
        }
        if (!cls.empty()) alts.insert(alts.begin(), "[" + cls + "]");
        if (alts.size() == 1) return alts[0];
        std::string out = "(";
        for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
        return out + ")";
    }

    std::string_view re_;
    std::string where_;
    size_t pos_ = 0;
    std::set<std::string>* uses_ = nullptr;
};

// ---------------------------------------------------------------------------
// Integer ranges -> digit grammars.

std::string digits_between(const std::string& lo, const std::string& hi) {
    // lo and hi have the same length; every number between them, digit-wise.
    size_t n = lo.size();
    if (n == 0) return "\"\"";
    auto cls = [](char a, char b) {
        return a == b ? "\"" + std::string(1, a) + "\"" : "[" + std::string(1, a) + "-" + b + "]";
    };
    if (n == 1) return cls(lo[0], hi[0]);
    if (lo[0] == hi[0]) return cls(lo[0], lo[0]) + " " + digits_between(lo.substr(1), hi.substr(1));
    std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
    std::string zeros(n - 1, '0'), nines(n - 1, '9');
    std::string any = "[0-9]{" + std::to_string(n - 1) + "}";
    if (rest_lo == zeros && rest_hi == nines) return cls(lo[0], hi[0]) + " " + any;
    std::vector<std::string> alts;
    char first = lo[0], last = hi[0];
    if (rest_lo != zeros) {
        alts.push_back(cls(lo[0], lo[0]) + " (" + digits_between(rest_lo, nines) + ")");
        ++first;
    }
    if (rest_hi != nines) {
        alts.push_back(cls(hi[0], hi[0]) + " (" + digits_between(zeros, rest_hi) + ")");
        --last;
    }
    if (first <= last)
        alts.insert(alts.begin() + (rest_lo != zeros ? 1 : 0), cls(first, last) + " " + any);
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return alts.size() == 1 ? out : "(" + out + ")";
}

// Non-negative integers in [a, b] (b absent: no bound) without leading zeros;
// unbounded numbers have at most 16 digits, as the `uint` rule.
std::string nonneg_range(uint64_t a, std::optional<uint64_t> b) {
    std::vector<std::string> alts;
    auto pow10 = [](size_t k) {
        uint64_t p = 1;
        for (size_t i = 0; i < k; ++i) p *= 10;
        return p;
    };
    size_t max_len = b ? std::to_string(*b).size() : std::max<size_t>(16, std::to_string(a).size());
    for (size_t n = std::to_string(a).size(); n <= max_len; ++n) {
        uint64_t lo = std::max<uint64_t>(a, n == 1 ? 0 : pow10(n - 1));
        uint64_t hi = n >= 20 ? UINT64_MAX : pow10(n) - 1;
        if (b) hi = std::min(hi, *b);
        if (lo > hi) continue;
        std::string alt = "(";
        alt += digits_between(std::to_string(lo), std::to_string(hi));
        alt += ')';
        alts.push_back(std::move(alt));
    }
    if (alts.empty()) return "";
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return "(" + out + ")";
}

std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    std::vector<std::string> alts;
    // Negative part: "-" then the magnitudes [-hi', -lo].
    if (!lo || *lo < 0) {
        uint64_t mag_lo = hi && *hi < 0 ? uint64_t(-(*hi)) : 1;
        std::optional<uint64_t> mag_hi;
        if (lo) mag_hi = uint64_t(-(*lo));
        std::string neg = nonneg_range(mag_lo, mag_hi);
        if (!neg.empty()) alts.push_back("\"-\" " + neg);
    }
    if (!hi || *hi >= 0) {
        uint64_t a = lo && *lo > 0 ? uint64_t(*lo) : 0;
        std::optional<uint64_t> b;
        if (hi) b = uint64_t(*hi);
        std::string pos = nonneg_range(a, b);
        if (!pos.empty()) alts.push_back(pos);
    }
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return "(" + out + ")";
}

// A bound keyword (minimum, exclusiveMaximum, ...) as the inclusive integer
// bound it makes; nullopt when absent.
std::optional<int64_t> bound(const json& s, const char* key, bool upper, const std::string& where) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number()) schema_fail(where + "/" + key, std::string(key) + " must be a number");
    double v = s[key].get<double>();
    if (std::fabs(v) > 9e15)
        schema_fail(where + "/" + key, std::string(key) + " beyond 9e15 is not supported");
    bool exclusive = std::string(key).rfind("exclusive", 0) == 0;
    double r = upper ? std::floor(v) : std::ceil(v);
    if (exclusive && r == v) r += upper ? -1 : 1;
    return int64_t(r);
}

}  // namespace

void schema_fail(const std::string& where, const std::string& what) {
    throw Error("JSON schema: " + what + " at " + where);
}

int64_t schema_repeat_count(const json& s, const char* k, int64_t dflt, const std::string& where) {
    if (!s.contains(k)) return dflt;
    if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0)
        schema_fail(where + "/" + k, std::string(k) + " must be a non-negative integer");
    int64_t v = s[k].get<int64_t>();
    if (v > kMaxRepeatBound)
        schema_fail(where + "/" + k, std::string(k) + " above " + std::to_string(kMaxRepeatBound));
    return v;
}

// A string schema: a format, a pattern, a length range or any string.
std::string schema_string_gbnf(const json& s, const std::string& where,
                               std::set<std::string>& uses) {
    int64_t min_len = schema_repeat_count(s, "minLength", 0, where),
            max_len = schema_repeat_count(s, "maxLength", -1, where);
    if (max_len >= 0 && max_len < min_len) schema_fail(where, "maxLength is below minLength");
    bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("format")) {
        if (has_len || s.contains("pattern"))
            schema_fail(where + "/format",
                        "format together with pattern or a length bound is not supported");
        std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
        std::string body;
        if (f == "date")
            body = use(uses, "date");
        else if (f == "time")
            body = use(uses, "time");
        else if (f == "date-time")
            body = use(uses, "date") + " \"T\" " + use(uses, "time");
        else if (f == "uuid")
            body = use(uses, "uuid");
        else
            schema_fail(where + "/format",
                        "format '" + f + "' is not supported (date, time, date-time, uuid are)");
        return "(\"\\\"\" " + body + " \"\\\"\")";
    }
    if (s.contains("pattern")) {
        if (has_len)
            schema_fail(where + "/pattern",
                        "pattern together with minLength/maxLength is not supported");
        if (!s["pattern"].is_string()) schema_fail(where + "/pattern", "pattern must be a string");
        std::string re = s["pattern"].get<std::string>();
        std::string body = PatternConverter(re, where + "/pattern").convert(uses);
        return "(\"\\\"\" " + body + " \"\\\"\")";
    }
    if (!has_len) return use(uses, "string");
    use(uses, "char");
    std::string rep =
        "{" + std::to_string(min_len) + "," + (max_len < 0 ? "" : std::to_string(max_len)) + "}";
    return "(\"\\\"\" char" + rep + " \"\\\"\")";
}

// An integer schema: its bounds (inclusive or exclusive) as a digit grammar.
std::string schema_integer_gbnf(const json& s, const std::string& where,
                                std::set<std::string>& uses) {
    if (s.contains("multipleOf"))
        schema_fail(where + "/multipleOf", "keyword 'multipleOf' is not supported");
    auto lo = bound(s, "minimum", false, where), xlo = bound(s, "exclusiveMinimum", false, where);
    auto hi = bound(s, "maximum", true, where), xhi = bound(s, "exclusiveMaximum", true, where);
    if (xlo && (!lo || *xlo > *lo)) lo = xlo;
    if (xhi && (!hi || *xhi < *hi)) hi = xhi;
    if (!lo && !hi) return use(uses, "integer");
    if (lo && hi && *lo > *hi) schema_fail(where, "the integer bounds leave no value");
    return integer_range(lo, hi);
}

// A number schema: any number, or (minimum 0) a non-negative one.
std::string schema_number_gbnf(const json& s, const std::string& where,
                               std::set<std::string>& uses) {
    for (const char* k : {"maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
        if (s.contains(k))
            schema_fail(where + "/" + k,
                        std::string("keyword '") + k +
                            "' on a number is not supported (bounds are enforced on "
                            "integers, and minimum 0 on numbers)");
    if (s.contains("minimum")) {
        if (!s["minimum"].is_number() || s["minimum"].get<double>() != 0.0)
            schema_fail(where + "/minimum",
                        "minimum other than 0 on a number is not supported (use type integer)");
        use(uses, "fraction");
        use(uses, "exponent");
        return "(" + use(uses, "uint") + " fraction? exponent?)";
    }
    return use(uses, "number");
}

}  // namespace minfer::structured
