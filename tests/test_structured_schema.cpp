// JSON Schema -> grammar (src/structured/json_schema.*), on single keywords
// and on the corpus tests/data/schemas/corpus.jsonl (scripts/gen_schema_corpus.py).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "structured/compiled.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "structured_corpus.h"
#include "util/error.h"

using namespace minfer::structured;
using minfer::testing::load_schema_corpus;

namespace {

std::shared_ptr<const CompiledGrammar> schema_grammar(const std::string& schema) {
    return std::make_shared<const CompiledGrammar>(
        compile_grammar(parse_gbnf(json_schema_text_to_gbnf(schema))));
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view input) {
    Matcher m(g);
    return m.accept_bytes(input) && m.is_complete();
}

void expect_refused(const std::string& schema, const std::string& text) {
    try {
        std::string g = json_schema_text_to_gbnf(schema);
        ADD_FAILURE() << "no error for " << schema << "; grammar:\n" << g;
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
            << "error '" << e.what() << "' lacks '" << text << "'";
    }
}

}  // namespace

TEST(StructuredSchema, ObjectKeysInSchemaOrderOptionalOnesMayBeLeftOut) {
    auto g = schema_grammar(R"({"type":"object","properties":{"a":{"type":"integer"},
        "b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
    EXPECT_TRUE(matches(g, R"({"b":"x"})"));
    EXPECT_TRUE(matches(g, R"({"a":1,"b":"x","c":true})"));
    EXPECT_TRUE(matches(g, R"({"a": 1, "b": "x"})"));
    EXPECT_FALSE(matches(g, R"({"b":"x","a":1})"));  // out of order
    EXPECT_FALSE(matches(g, R"({"a":1})"));          // b is required
    EXPECT_FALSE(matches(g, R"({"b":"x","d":1})"));  // not listed
    EXPECT_FALSE(matches(g, R"({,"b":"x"})"));
}

TEST(StructuredSchema, WhitespaceIsAtMostOneSpaceAfterColonAndComma) {
    auto g = schema_grammar(
        R"({"type":"array","items":{"type":"object","properties":{"k":{"type":"integer"}},"required":["k"]}})");
    EXPECT_TRUE(matches(g, R"([{"k":1},{"k":2}])"));
    EXPECT_TRUE(matches(g, R"([{"k": 1}, {"k": 2}])"));
    EXPECT_FALSE(matches(g, R"([{"k":  1}])"));
    EXPECT_FALSE(matches(g, R"([ {"k":1}])"));
    EXPECT_FALSE(matches(g, R"([{"k":1} ])"));
    EXPECT_FALSE(matches(g, "[{\"k\":1},\n{\"k\":2}]"));
    // Generic values (json_object mode) follow the same rule.
    auto any =
        std::make_shared<const CompiledGrammar>(compile_grammar(parse_gbnf(json_object_gbnf())));
    EXPECT_TRUE(matches(any, R"({"a": [1, {"b": null}], "c": "d"})"));
    EXPECT_FALSE(matches(any, R"({"a":  1})"));
    EXPECT_FALSE(matches(any, R"([1])"));  // an object, not any value
}

TEST(StructuredSchema, StringsLengthsEscapesAndUnicode) {
    auto g = schema_grammar(R"({"type":"string","minLength":2,"maxLength":3})");
    EXPECT_TRUE(matches(g, R"("ab")"));
    EXPECT_TRUE(matches(g, "\"\xC3\xA9\\n\\u00e9\""));  // 3 characters: é, \n, \u00e9
    EXPECT_FALSE(matches(g, R"("a")"));
    EXPECT_FALSE(matches(g, R"("abcd")"));
    auto s = schema_grammar(R"({"type":"string"})");
    EXPECT_TRUE(matches(s, R"("a\"b\\c\/d\b\f\n\r\t\u12aF")"));
    EXPECT_FALSE(matches(s, "\"a\nb\""));     // raw control character
    EXPECT_FALSE(matches(s, R"("\ud800")"));  // surrogate half
    EXPECT_FALSE(matches(s, R"("\x41")"));    // not a JSON escape
}

TEST(StructuredSchema, NumbersIntegersAndRanges) {
    auto n = schema_grammar(R"({"type":"number"})");
    for (const char* ok : {"0", "-0.5", "12e3", "1.25E-7", "-3"}) EXPECT_TRUE(matches(n, ok)) << ok;
    for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1", "1e1234"})
        EXPECT_FALSE(matches(n, bad)) << bad;
    auto r = schema_grammar(R"({"type":"integer","minimum":-15,"maximum":1203})");
    for (int v = -40; v <= 1300; ++v)
        EXPECT_EQ(matches(r, std::to_string(v)), v >= -15 && v <= 1203) << v;
    EXPECT_FALSE(matches(r, "007"));
    EXPECT_FALSE(matches(r, "-0"));
    auto x = schema_grammar(R"({"type":"integer","exclusiveMinimum":99,"exclusiveMaximum":1000})");
    EXPECT_FALSE(matches(x, "99"));
    EXPECT_TRUE(matches(x, "100"));
    EXPECT_TRUE(matches(x, "999"));
    EXPECT_FALSE(matches(x, "1000"));
    auto lo = schema_grammar(R"({"type":"integer","minimum":95})");
    for (int v = 0; v <= 2000; ++v) EXPECT_EQ(matches(lo, std::to_string(v)), v >= 95) << v;
    EXPECT_TRUE(matches(lo, "1234567890123456"));
    auto nn = schema_grammar(R"({"type":"number","minimum":0})");
    EXPECT_TRUE(matches(nn, "0.5"));
    EXPECT_FALSE(matches(nn, "-0.5"));
}

TEST(StructuredSchema, EnumConstAnyOfTypeArraysAndRefs) {
    auto e = schema_grammar(R"({"enum":["a\"b",1,null,{"x":[true]}]})");
    EXPECT_TRUE(matches(e, R"("a\"b")"));
    EXPECT_TRUE(matches(e, R"({"x":[true]})"));
    EXPECT_FALSE(matches(e, R"({"x": [true]})"));  // enum values are written compactly
    EXPECT_FALSE(matches(e, "2"));
    auto t = schema_grammar(R"({"type":["integer","null"]})");
    EXPECT_TRUE(matches(t, "null"));
    EXPECT_TRUE(matches(t, "7"));
    EXPECT_FALSE(matches(t, "\"7\""));
    auto rec = schema_grammar(
        R"({"$defs":{"n":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},"required":["next"]}},"$ref":"#/$defs/n"})");
    EXPECT_TRUE(matches(rec, R"({"next":{"next":{"next":null}}})"));
    EXPECT_FALSE(matches(rec, R"({"next":{"next":{}}})"));
}

TEST(StructuredSchema, ArraysBoundsAndPrefixItems) {
    auto a =
        schema_grammar(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})");
    EXPECT_FALSE(matches(a, "[]"));
    EXPECT_TRUE(matches(a, "[1]"));
    EXPECT_TRUE(matches(a, "[1, 2,3]"));
    EXPECT_FALSE(matches(a, "[1,2,3,4]"));
    auto p = schema_grammar(
        R"({"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}],"items":{"type":"null"},"maxItems":3})");
    EXPECT_TRUE(matches(p, R"(["a",true])"));
    EXPECT_TRUE(matches(p, R"(["a",true,null])"));
    EXPECT_FALSE(matches(p, R"(["a",true,null,null])"));
    EXPECT_FALSE(matches(p, R"([true,"a"])"));
}

TEST(StructuredSchema, FormatsAndPatterns) {
    auto d = schema_grammar(R"({"type":"string","format":"date-time"})");
    EXPECT_TRUE(matches(d, R"("2024-02-28T23:59:59.5+01:00")"));
    EXPECT_FALSE(matches(d, R"("2024-02-30T23:59:59Z")"));
    EXPECT_FALSE(matches(d, R"("2024-04-31T00:00:00Z")"));
    EXPECT_FALSE(matches(d, R"("2024-01-01T24:00:00Z")"));
    auto u = schema_grammar(R"({"type":"string","format":"uuid"})");
    EXPECT_TRUE(matches(u, R"("00000000-aaaa-BBBB-1111-abcdefABCDEF")"));
    EXPECT_FALSE(matches(u, R"("00000000-aaaa-BBBB-1111-abcdefABCDE")"));
    auto re = schema_grammar(R"({"type":"string","pattern":"^(?:[a-c]x|\\d{2,3})+[^a-z]?$"})");
    EXPECT_TRUE(matches(re, R"("ax12")"));
    EXPECT_TRUE(matches(re, R"("123bxA")"));
    EXPECT_TRUE(matches(re, R"("12\"")"));  // a quote in the class is written escaped
    EXPECT_FALSE(matches(re, R"("12"")"));
    EXPECT_FALSE(matches(re, R"("dx")"));
    EXPECT_FALSE(matches(re, R"("1")"));
    auto un = schema_grammar(R"({"type":"string","pattern":"a|^b$"})");
    EXPECT_TRUE(matches(un, R"("xay")"));
    EXPECT_TRUE(matches(un, R"("b")"));
    EXPECT_FALSE(matches(un, R"("xb")"));
}

// A pattern's characters are read as UTF-8 the way a grammar's are (one
// reader, structured/chars_impl.h): a multi-byte character in a class is one
// character, and bytes that are no character are refused, not read as one.
TEST(StructuredSchema, PatternCharactersAreUtf8) {
    auto g = schema_grammar(R"({"type":"string","pattern":"^[\u00e9\u4e2d]x$"})");
    EXPECT_TRUE(matches(g, "\"\xC3\xA9x\""));
    EXPECT_TRUE(matches(g, "\"\xE4\xB8\xADx\""));
    EXPECT_FALSE(matches(g, "\"\xC3x\""));
    const nlohmann::ordered_json broken = {{"type", "string"}, {"pattern", "a\xC3(b"}};
    try {
        std::string gbnf = minfer::structured::json_schema_to_gbnf(broken);
        ADD_FAILURE() << "no error for a pattern with broken UTF-8; grammar:\n" << gbnf;
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find("invalid UTF-8"), std::string::npos) << e.what();
    }
}

TEST(StructuredSchema, KeywordsItCannotEnforceAreErrorsNamingThem) {
    expect_refused(R"({"type":"integer","multipleOf":3})", "'multipleOf'");
    expect_refused(R"({"type":"array","uniqueItems":true})", "'uniqueItems' is not supported at #");
    expect_refused(R"({"not":{"type":"string"}})",
                   "keyword 'not' is not supported (it cannot be enforced) at #/not");
    expect_refused(R"({"if":{},"then":{}})", "keyword 'if'");
    expect_refused(R"({"type":"object","properties":{"a":{"type":"string","format":"email"}}})",
                   "format 'email' is not supported (date, time, date-time, uuid are) at "
                   "#/properties/a/format");
    expect_refused(R"({"type":"number","maximum":3.5})", "'maximum' on a number is not supported");
    expect_refused(R"({"type":"object","minProperties":1})", "'minProperties'");
    expect_refused(R"({"type":"string","pattern":"(?=a)b"})", "lookaround");
    expect_refused(R"({"type":"string","pattern":"(a)\\1"})", "backreferences");
    expect_refused(R"({"type":"string","pattern":"a^b"})", "'^' is only supported at the start");
    expect_refused(R"({"type":"string","minLength":1,"pattern":"a"})",
                   "pattern together with minLength");
    expect_refused(R"({"$ref":"https://example.com/s.json"})",
                   "is not a reference inside this schema");
    expect_refused(R"({"$ref":"#/$defs/missing"})", "points to nothing");
    expect_refused(R"({"oneOf":[{"type":"string"},{"type":"string","maxLength":3}]})",
                   "oneOf branches 0 and 1 may both match");
    expect_refused(
        R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false},{"properties":{"b":{}}}]})",
        "does not list property 'b'");
    expect_refused(R"({"type":"object","properties":{"a":{}},"required":["b"]})",
                   "required property 'b' is not in properties");
    expect_refused(R"({"type":"string","maxItems":3})",
                   "'maxItems' does not apply to type 'string'");
    expect_refused(R"({"type":"thing"})", "unknown type 'thing'");
    expect_refused(R"(false)", "schema 'false' matches nothing");
    expect_refused(R"({"type": "string",)", "not valid JSON");
}

TEST(StructuredSchema, CorpusAcceptsItsValidInstancesAndRefusesTheOthers) {
    auto corpus = load_schema_corpus();
    ASSERT_GE(corpus.size(), 50u);
    size_t n_valid = 0, n_refused = 0;
    for (const auto& c : corpus) {
        SCOPED_TRACE(c.name);
        std::shared_ptr<const CompiledGrammar> g;
        ASSERT_NO_THROW(g = schema_grammar(c.schema.dump())) << c.name;
        for (const auto& v : c.valid) {
            EXPECT_TRUE(matches(g, v)) << c.name << ": " << v;
            ++n_valid;
        }
        for (const auto& r : c.refused) {
            EXPECT_FALSE(matches(g, r)) << c.name << ": " << r;
            ++n_refused;
        }
    }
    EXPECT_GE(n_valid, 100u);
    EXPECT_GE(n_refused, 80u);
}
