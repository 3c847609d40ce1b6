// A context-free grammar over bytes, written in llama.cpp's GBNF:
//
//   root   ::= "{" ws pair ("," ws pair)* "}"   # a comment
//   pair   ::= [a-z]+ ":" ws ("true" | "false")
//   ws     ::= " "?
//
// Literals "..." and classes [...] / [^...] take the escapes \n \r \t \\ \" \[
// \] \- \xHH \uHHHH \UHHHHHHHH; `.` is any character; postfix * + ? {m} {m,}
// {m,n} repeat; ( ) group; | separates alternatives. A rule ends at the end of
// its line unless a group is open (or the next line starts with `|`).
// Characters are Unicode code points matched as their UTF-8 bytes, so the
// matcher (matcher.h) works on bytes, which is what tokens are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace minfer::structured {

// One node of a rule's right-hand side.
struct Expr {
    enum class Kind {
        Seq,      // children in order (empty = the empty string)
        Alt,      // one of children
        Literal,  // `bytes`, UTF-8
        Class,    // one code point in `ranges` (already complemented for [^...])
        RuleRef,  // rule `rule`
        Repeat,   // children[0] between `min` and `max` times (max -1: no bound)
    };
    Kind kind = Kind::Seq;
    std::string bytes;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive code point ranges, sorted
    int32_t rule = -1;
    int32_t min = 0;
    int32_t max = 0;
    std::vector<Expr> children;
};

struct Rule {
    std::string name;
    Expr body;
};

struct Grammar {
    std::vector<Rule> rules;
    int32_t root = -1;  // index of the rule named "root"
};

// Parses GBNF text. Throws minfer::Error naming the line and column and what
// is wrong ("grammar line 3 col 12: expected '::=' after rule name 'value'"),
// a rule used but never defined (naming it and where it is used), a rule
// defined twice, or no `root` rule.
Grammar parse_gbnf(std::string_view text);

// The largest count a {m,n} repetition may name: a bounded repetition is
// unrolled, so a bound like {0,1000000} is refused instead of exhausting memory.
constexpr int32_t kMaxRepeatBound = 10000;

// The code points (0..U+10FFFF) outside `ranges` (inclusive, any order).
std::vector<std::pair<uint32_t, uint32_t>> complement_code_points(
    std::vector<std::pair<uint32_t, uint32_t>> ranges);

// GBNF text for a literal string: "..." with the escapes the parser reads.
std::string gbnf_literal(std::string_view bytes);

}  // namespace minfer::structured
