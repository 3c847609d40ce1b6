// ConstraintCache: one compile per grammar text, failures named and not kept.
#include <gtest/gtest.h>

#include <string>

#include "structured/constraint.h"
#include "util/error.h"

using namespace minfer::structured;

namespace {

std::shared_ptr<const TokenVocab> letters_vocab() {
    return std::make_shared<const TokenVocab>(
        TokenVocab::from_bytes({"a", "b", "ab", "<eos>"}, {false, false, false, true}, {3}));
}

}  // namespace

TEST(StructuredConstraint, CacheCompilesEachGrammarOnceAndKeepsTheRecentOnes) {
    ConstraintCache cache(letters_vocab(), 2);
    bool hit = true;
    auto a1 = cache.get("root ::= \"a\"+", &hit);
    EXPECT_FALSE(hit);
    auto a2 = cache.get("root ::= \"a\"+", &hit);
    EXPECT_TRUE(hit);
    EXPECT_EQ(a1.get(), a2.get());
    cache.get("root ::= \"b\"", &hit);
    EXPECT_FALSE(hit);
    cache.get("root ::= \"a\"+", &hit);  // most recent again
    EXPECT_TRUE(hit);
    cache.get("root ::= \"ab\"", &hit);  // evicts the "b" grammar, the least recent
    EXPECT_FALSE(hit);
    EXPECT_EQ(cache.size(), 2u);
    cache.get("root ::= \"b\"", &hit);
    EXPECT_FALSE(hit);
    // A held constraint outlives its eviction and still masks.
    Matcher m(a1->grammar);
    TokenBitset mask;
    mask.resize(4);
    a1->masker->compute_mask(m, mask);
    EXPECT_TRUE(mask.test(0));
    EXPECT_FALSE(mask.test(1));
    EXPECT_FALSE(mask.test(3));  // not complete before the first "a"
}

TEST(StructuredConstraint, ABadGrammarIsNamedAndNotCached) {
    ConstraintCache cache(letters_vocab());
    try {
        cache.get("root ::= missing");
        FAIL() << "an undefined rule compiled";
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
    }
    EXPECT_EQ(cache.size(), 0u);
}
