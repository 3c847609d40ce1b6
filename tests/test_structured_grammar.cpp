// GBNF parsing, compilation and the byte-level matcher (src/structured/).
#include <gtest/gtest.h>

#include <memory>

#include "structured/compiled.h"
#include "structured/grammar.h"
#include "structured/matcher.h"
#include "util/error.h"

using namespace minfer::structured;

namespace {

std::shared_ptr<const CompiledGrammar> compile_text(const std::string& gbnf) {
    return std::make_shared<const CompiledGrammar>(compile_grammar(parse_gbnf(gbnf)));
}

// The whole input is a sentence of the grammar.
bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view input) {
    Matcher m(g);
    return m.accept_bytes(input) && m.is_complete();
}

// The input is a prefix of some sentence.
bool is_prefix(const std::shared_ptr<const CompiledGrammar>& g, std::string_view input) {
    Matcher m(g);
    return m.accept_bytes(input);
}

void expect_error(const std::string& gbnf, const std::string& text) {
    try {
        compile_grammar(parse_gbnf(gbnf));
        ADD_FAILURE() << "no error for:\n" << gbnf;
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
            << "error '" << e.what() << "' lacks '" << text << "'";
    }
}

}  // namespace

TEST(StructuredGrammar, ParsesRulesLiteralsClassesGroupsAndRepetition) {
    auto g = compile_text(R"(
# a comment line
root ::= "{" ws pair ("," ws pair)* "}"   # trailing comment
pair ::= [a-z]+ ":" ws ("true" | "false" | num)
num  ::= "-"? [0-9]{1,3}
ws   ::= " "?
)");
    EXPECT_TRUE(matches(g, "{a:true}"));
    EXPECT_TRUE(matches(g, "{ ab: false, c:-123,d:7}"));
    EXPECT_FALSE(matches(g, "{a:1234}"));  // {1,3}
    EXPECT_FALSE(matches(g, "{A:true}"));
    EXPECT_FALSE(matches(g, "{a:true,}"));
    EXPECT_FALSE(matches(g, "{a:true"));
    EXPECT_TRUE(is_prefix(g, "{a:true"));
    EXPECT_FALSE(is_prefix(g, "{a:  true"));  // one blank at most
}

TEST(StructuredGrammar, EscapesNegatedClassesAnyCharAndUtf8) {
    auto g =
        compile_text(R"(root ::= "\"" ([^"\\] | "\\" ["\\nt])* "\"" "\n" . "\u00e9" [\x41-\x43])");
    EXPECT_TRUE(matches(g,
                        "\"a\\\"b\"\n\xE4\xB8\xAD\xC3\xA9"
                        "B"));  // 中 then é then B
    EXPECT_TRUE(matches(g,
                        "\"\"\nx\xC3\xA9"
                        "A"));
    EXPECT_FALSE(matches(g,
                         "\"a\"b\"\nx\xC3\xA9"
                         "A"));  // unescaped quote inside
    EXPECT_FALSE(matches(g,
                         "\"\"\nx\xC3\xA9"
                         "D"));                        // D is outside [A-C]
    EXPECT_FALSE(is_prefix(g, "\"\"\n\xC3\xC3"));      // broken UTF-8 is no character
    EXPECT_FALSE(is_prefix(g, "\"\"\n\xED\xA0\x80"));  // a surrogate is no character
    EXPECT_TRUE(is_prefix(g, "\"\"\n\xF0\x9F\x98"));   // 4-byte character, 3 bytes in
}

TEST(StructuredGrammar, RepetitionBounds) {
    auto g = compile_text(R"(root ::= "a"{2} "b"{1,} "c"{0,2} ("d" "e"){1,2})");
    EXPECT_TRUE(matches(g, "aabde"));
    EXPECT_TRUE(matches(g, "aabbbccdede"));
    EXPECT_FALSE(matches(g, "abde"));
    EXPECT_FALSE(matches(g, "aade"));
    EXPECT_FALSE(matches(g, "aabcccde"));
    EXPECT_FALSE(matches(g, "aabdedede"));
}

TEST(StructuredGrammar, RecursionAndAlternativesAcrossRules) {
    // Balanced brackets, and an ambiguity between rules (x then "b" or y).
    auto g = compile_text(R"(
root ::= list | amb
list ::= "[" (list ("," list)*)? "]"
amb  ::= x "b" | y
x    ::= "a"+
y    ::= "a"* "b" "c"
)");
    EXPECT_TRUE(matches(g, "[]"));
    EXPECT_TRUE(matches(g, "[[],[[]],[]]"));
    EXPECT_FALSE(matches(g, "[[]"));
    EXPECT_FALSE(matches(g, "[],[]"));
    EXPECT_TRUE(matches(g, "aab"));
    EXPECT_TRUE(matches(g, "aabc"));
    EXPECT_TRUE(matches(g, "bc"));
    EXPECT_FALSE(matches(g, "b"));
    // Deep nesting stays linear: one stack per open bracket.
    std::string deep(2000, '[');
    deep += std::string(2000, ']');
    EXPECT_TRUE(matches(g, deep));
}

TEST(StructuredGrammar, NullableRepetitionTerminates) {
    auto g = compile_text("root ::= (e)* \"x\"\ne ::= \"\" | \"y\"\n");
    EXPECT_TRUE(matches(g, "x"));
    EXPECT_TRUE(matches(g, "yyx"));
}

TEST(StructuredGrammar, ContinuationLineStartingWithBar) {
    auto g = compile_text("root ::= \"a\"\n     | \"b\"\n");
    EXPECT_TRUE(matches(g, "a"));
    EXPECT_TRUE(matches(g, "b"));
}

TEST(StructuredGrammar, ErrorsNameLineColumnAndWhat) {
    expect_error("root ::= \"a\"\nfoo \"b\"\n",
                 "grammar line 2 col 5: expected '::=' after rule name 'foo'");
    expect_error("root ::= \"abc\n", "line 1 col 14: unterminated string literal");
    expect_error("root ::= [a-z\n", "unterminated character class");
    expect_error("root ::= [z-a]\n", "range is backwards");
    expect_error("root ::= (\"a\" | \"b\"\n", "expected ')' to close the group");
    expect_error("root ::= \"a\" )\n", "unmatched ')'");
    expect_error("root ::= \"a\"{3,1}\n", "the maximum is below the minimum");
    expect_error("root ::= \"a\"{2\n", "expected '}'");
    expect_error("root ::= \"a\"{0,99999}\n", "repetition count above 10000");
    expect_error("root ::= \"\\q\"\n", "line 1 col 11: unknown escape '\\q'");
    expect_error("root ::= \"\\u12\"\n", "expected 4 hex digits");
    expect_error("root ::= @\n", "line 1 col 10: unexpected '@'");
    expect_error("root ::= value\n", "rule 'value' is used at line 1 col 10 but never defined");
    expect_error("root ::= \"a\"\nroot ::= \"b\"\n", "rule 'root' is defined twice");
    expect_error("start ::= \"a\"\n", "no 'root' rule");
    expect_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n",
                 "rule 'expr' is left-recursive");
    expect_error("root ::= \"y\" | a\na ::= \"x\" a\n", "rule 'a' can never finish");
    expect_error("root ::= [^\\x00-\\U0010FFFF]\n", "character class matches nothing");
    expect_error("root ::= \"a\xC3(\"\n", "invalid UTF-8 in the grammar text");
    expect_error("root ::= \"a\xC3", "invalid UTF-8 in the grammar text");
}

// The node the output stands on after `input` (one stack: no ambiguity).
int32_t node_after(const std::shared_ptr<const CompiledGrammar>& g, std::string_view input) {
    Matcher m(g);
    EXPECT_TRUE(m.accept_bytes(input)) << input;
    EXPECT_EQ(m.stacks().size(), 1u) << input;
    return m.stacks().front().back();
}

TEST(StructuredGrammar, NodesThatContinueAlikeShareAClassOthersDoNot) {
    // num is inlined into both alternatives: two copies of its nodes.
    auto same = compile_text("root ::= \"a\" num \"!\" | \"b\" num \"!\"\nnum ::= [0-9]+");
    ASSERT_EQ(same->node_class.size(), same->nodes.size());
    const int32_t a = node_after(same, "a1"), b = node_after(same, "b1");
    EXPECT_NE(a, b);
    EXPECT_EQ(same->node_class[a], same->node_class[b]);
    EXPECT_LT(same->n_node_classes, int32_t(same->nodes.size()));
    // Different text after the number: the copies differ two bytes on.
    auto differ = compile_text("root ::= \"a\" num \"!\" | \"b\" num \"?\"\nnum ::= [0-9]+");
    EXPECT_NE(differ->node_class[node_after(differ, "a1")],
              differ->node_class[node_after(differ, "b1")]);
    // The start differs from both (it takes 'a' and 'b', they take digits).
    EXPECT_NE(same->node_class[same->root_start], same->node_class[a]);
}

TEST(StructuredGrammar, PositionsWithRoomForAnyShortTokenShareAShortClass) {
    // A bounded string: each position is its own node_class (the room left
    // differs), but positions with room for kShortTokenBytes more letters
    // take every string of that length alike.
    static_assert(kShortTokenBytes == 16, "the rooms below assume 16");
    auto g = compile_text(R"(root ::= "\"" [a-z]{0,20} "\"")");
    ASSERT_EQ(g->short_class.size(), g->nodes.size());
    const std::string q = "\"";
    const int32_t room19 = node_after(g, q + "a"), room18 = node_after(g, q + "ab"),
                  room16 = node_after(g, q + std::string(4, 'a')),
                  room15 = node_after(g, q + std::string(5, 'a'));
    EXPECT_NE(g->node_class[room19], g->node_class[room18]);
    EXPECT_EQ(g->short_class[room19], g->short_class[room18]);
    EXPECT_EQ(g->short_class[room19], g->short_class[room16]);
    // Room 15 refuses sixteen letters.
    EXPECT_NE(g->short_class[room16], g->short_class[room15]);
    EXPECT_LT(g->n_short_classes, g->n_node_classes);
}

TEST(StructuredMatcher, RollbackCopyAndSerializeResumeTheSameState) {
    auto g = compile_text(R"(
root ::= "[" (v ("," v)*)? "]"
v    ::= "[" (v ("," v)*)? "]" | [0-9]+
)");
    Matcher m(g, 4);
    ASSERT_TRUE(m.accept_bytes("[[1"));
    ASSERT_TRUE(m.accept_bytes(",[2"));
    EXPECT_FALSE(m.accept_bytes("]]]]"));  // one ] too many: refused whole
    EXPECT_TRUE(m.accept_bytes("]"));
    Matcher copy = m;
    std::string state = m.serialize();
    m.rollback(2);  // back to "[[1"
    EXPECT_FALSE(m.accept_bytes("]]]"));
    EXPECT_TRUE(m.accept_bytes("]]"));
    EXPECT_TRUE(m.is_complete());
    EXPECT_FALSE(m.can_continue());

    Matcher resumed = Matcher::deserialize(g, state);
    EXPECT_EQ(resumed.stacks(), copy.stacks());
    EXPECT_FALSE(resumed.is_complete());
    EXPECT_TRUE(resumed.accept_bytes("]]"));
    EXPECT_TRUE(resumed.is_complete());
    EXPECT_TRUE(copy.accept_bytes("]]"));

    EXPECT_THROW(Matcher::deserialize(g, "junk"), minfer::Error);
    std::string bad = state;
    bad[bad.size() - 1] = char(0x7F);  // a node id far out of range
    EXPECT_THROW(Matcher::deserialize(g, bad), minfer::Error);
    EXPECT_THROW(Matcher::deserialize(g, state + "x"), minfer::Error);
}
