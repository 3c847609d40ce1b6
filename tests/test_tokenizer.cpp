// Tokenizer tests: parity with llama.cpp's ids on the reference files, and
// self-contained tests on a hand-built vocabulary and hand-picked strings.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "shared_files.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

using namespace minfer::tokenizer;
using Words = std::vector<std::string>;

namespace {

struct ParityResult {
    int matched = 0, total = 0;
    std::string first_failure;
};

ParityResult run_parity(const std::string& model, const std::string& jsonl) {
    auto f = minfer::gguf::File::open(model);
    Tokenizer tok = Tokenizer::from_gguf(f);
    ParityResult r;
    std::ifstream in(jsonl);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        auto j = nlohmann::json::parse(line);
        const std::string text = j["text"];
        const std::vector<int32_t> want = j["ids"];
        const auto got = tok.encode(text);
        ++r.total;
        if (got == want)
            ++r.matched;
        else if (r.first_failure.empty())
            r.first_failure = nlohmann::json(text).dump() + " got " + nlohmann::json(got).dump() +
                              " want " + nlohmann::json(want).dump();
    }
    return r;
}

// GPT-2 byte-level text of a plain string.
std::string g2(std::string_view s) {
    std::string out;
    for (unsigned char c : s) utf8_append(out, gpt2_byte_to_cpt(c));
    return out;
}

// A small vocabulary: the 256 byte tokens (id = byte value), then merges.
Vocab tiny_vocab() {
    Vocab v;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(g2(std::string(1, char(b))));
    v.token_types.assign(256, 1);
    auto add = [&](const std::string& t, int type) {
        v.tokens.push_back(t);
        v.token_types.push_back(type);
    };
    add("he", 1);           // 256
    add("ll", 1);           // 257
    add("hell", 1);         // 258
    add(g2(" w"), 1);       // 259
    add("aa", 1);           // 260
    add("<|im_end|>", 3);   // 261 control
    add("<think>", 4);      // 262 user-defined
    add("<|im_end|>x", 3);  // 263 longer control token that contains another
    v.merges = {"h e", "l l", "he ll", g2(" ") + " w", "a a"};
    v.eos_id = 261;
    return v;
}

}  // namespace

TEST(TokenizerParity, QwenReferenceIds) {
    const auto model = minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf");
    const auto ref = minfer::testing::shared_file("ref/tokenize.jsonl");
    MINFER_REQUIRE_SHARED_FILES(model, ref);
    auto r = run_parity(model, ref);
    EXPECT_EQ(r.matched, r.total) << r.first_failure;
    EXPECT_GT(r.total, 0);
}

TEST(TokenizerParity, KjvTinyReferenceIds) {
    const auto model = minfer::testing::shared_file("models/kjv-tiny-q8_0.gguf");
    const auto ref = minfer::testing::shared_file("ref/kjv-tiny-tokenize.jsonl");
    MINFER_REQUIRE_SHARED_FILES(model, ref);
    auto r = run_parity(model, ref);
    EXPECT_EQ(r.matched, r.total) << r.first_failure;
    EXPECT_GT(r.total, 0);
}

// ---------------------------------------------------------------------------
// Pre-tokenizer: expected words derived from the regex semantics llama.cpp
// runs (std::regex over the collapsed text; see pretokenize.h), and
// cross-checked with an independent regex-engine emulation during development.

TEST(Pretokenize, ContractionsFoldAsciiCaseOnly) {
    // 'S and 'LL are contractions; 'ſ (long s) is not: it joins the letters.
    EXPECT_EQ(pretokenize("I'm He'S x'\u017f don'T they'LL"),
              (Words{"I", "'m", " He", "'S", " x", "'\u017f", " don", "'T", " they", "'LL"}));
    EXPECT_EQ(pretokenize("'"), (Words{"'"}));
    EXPECT_EQ(pretokenize("'x"), (Words{"'x"}));
    EXPECT_EQ(pretokenize("a ' b"), (Words{"a", " '", " b"}));
}

TEST(Pretokenize, NumbersSplitOneCodePointEach) {
    // Arabic-Indic three, Roman numeral twelve and superscript two are \p{N}.
    EXPECT_EQ(pretokenize("1234 \u0663\u216b\u00b2"),
              (Words{"1", "2", "3", "4", " ", "\u0663", "\u216b", "\u00b2"}));
}

TEST(Pretokenize, WhitespaceRuns) {
    EXPECT_EQ(pretokenize("   word"), (Words{"  ", " word"}));  // \s+(?!\S) gives one back
    EXPECT_EQ(pretokenize("a  "), (Words{"a", "  "}));          // at the end: the whole run
    EXPECT_EQ(pretokenize("x\t\ty"), (Words{"x", "\t", "\ty"}));
    EXPECT_EQ(pretokenize("a\r\n\r\nb"), (Words{"a", "\r\n\r\n", "b"}));
    EXPECT_EQ(pretokenize("  \n  x"),
              (Words{"  \n", " ", " x"}));  // \s*[\r\n]+ ends at the last LF
    EXPECT_EQ(pretokenize("!!!\n\nz"), (Words{"!!!\n\n", "z"}));
    // NBSP is White_Space, so it prefixes the word like a space does.
    EXPECT_EQ(pretokenize("a\u00a0b"), (Words{"a", "\u00a0b"}));
    // U+001C is not \s for llama.cpp's std::regex (C locale), unlike Python's re.
    EXPECT_EQ(pretokenize("a\x1c b"), (Words{"a", "\x1c", " b"}));
}

TEST(Pretokenize, EmojiCjkAndCombiningMarks) {
    EXPECT_EQ(pretokenize("\U0001F44B\U0001F3FD \U0001F389"),
              (Words{"\U0001F44B\U0001F3FD", " \U0001F389"}));
    EXPECT_EQ(pretokenize("\u4e2d\u6587\uff0c\u597d"), (Words{"\u4e2d\u6587", "\uff0c\u597d"}));
    // A combining mark is not \p{L}: it splits the word and prefixes the rest.
    EXPECT_EQ(pretokenize("e\u0301t"), (Words{"e", "\u0301t"}));
}

TEST(Pretokenize, InvalidUtf8BecomesReplacementPerByte) {
    // llama.cpp: each byte that does not start a complete sequence is one U+FFFD.
    EXPECT_EQ(pretokenize(std::string("a\x80\xE4\xB8", 4)), (Words{"a", "\uFFFD\uFFFD\uFFFD"}));
    // An overlong C0 80 decodes (unchecked) to U+0000.
    EXPECT_EQ(pretokenize(std::string("\xC0\x80", 2)), (Words{std::string(1, '\0')}));
    // Truncated sequence at the very end must not read past the end.
    EXPECT_EQ(pretokenize(std::string("x\xF0\x9F\x98", 4)), (Words{"x", "\uFFFD\uFFFD\uFFFD"}));
}

TEST(UnicodeTables, CategoriesOfLlamaCppsUnicode151) {
    EXPECT_EQ(unicode_category('A'), UCat::Letter);
    EXPECT_EQ(unicode_category(0x2EBF0), UCat::Letter);  // CJK Ext. I (Unicode 15.1)
    EXPECT_EQ(unicode_category(0x31350), UCat::Letter);  // CJK Ext. H (15.0)
    EXPECT_EQ(unicode_category(0x1C89),
              UCat::Undefined);  // added in 16.0: not in llama.cpp's table
    EXPECT_EQ(unicode_category(0x0301), UCat::Mark);
    EXPECT_EQ(unicode_category(0x00B2), UCat::Number);
    EXPECT_EQ(unicode_category(0x110000), UCat::Undefined);
    EXPECT_TRUE(unicode_is_whitespace(0x85));
    EXPECT_TRUE(unicode_is_whitespace(0x3000));
    EXPECT_FALSE(unicode_is_whitespace(0x200B));  // ZERO WIDTH SPACE is Cf, not White_Space
    EXPECT_FALSE(unicode_is_whitespace(0x1C));
}

// ---------------------------------------------------------------------------
// BPE on a hand-built vocabulary (ids computed by hand).

TEST(TokenizerBpe, MergesByRankThenLeftmost) {
    Tokenizer tok(tiny_vocab());
    // "hello": h e l l o -> (h e, rank 0) he l l o -> (l l, rank 1) he ll o -> (he ll) hell o
    EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{258, 'o'}));
    // " world": the space joins the word; "Ġ w" merges, the rest stays bytes.
    EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{258, 'o', 259, 'o', 'r', 'l', 'd'}));
    // Equal ranks: the leftmost pair merges first: aaa -> aa a, aaaa -> aa aa.
    EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{260, 'a'}));
    EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{260, 260}));
    // Bytes that never merge map to their byte tokens (here: the 4 bytes of U+1F600).
    EXPECT_EQ(tok.encode("\U0001F600"), (std::vector<int32_t>{0xF0, 0x9F, 0x98, 0x80}));
    EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
}

TEST(TokenizerBpe, SpecialTokensWithAndWithoutParseSpecial) {
    Tokenizer tok(tiny_vocab());
    // The longer control token is cut out first; text around it is kept as is.
    EXPECT_EQ(tok.encode("he<|im_end|>x<|im_end|> he"),
              (std::vector<int32_t>{256, 263, 261, ' ', 256}));  // " he": Ġ + (h e)
    // Without parse_special, control tokens are plain text, but user-defined
    // tokens (<think>) are still cut out, as llama.cpp does.
    const auto plain = tok.encode("<think><|im_end|>", /*parse_special=*/false);
    ASSERT_GE(plain.size(), 2u);
    EXPECT_EQ(plain[0], 262);
    EXPECT_EQ(plain[1], '<');
    EXPECT_EQ(plain.size(), 1u + std::string("<|im_end|>").size());
    EXPECT_EQ(tok.encode("<think>", true), (std::vector<int32_t>{262}));
}

TEST(TokenizerBpe, PiecesAndEog) {
    Tokenizer tok(tiny_vocab());
    EXPECT_EQ(tok.token_to_piece(259), " w");
    EXPECT_EQ(tok.token_to_piece(0x0A), "\n");
    EXPECT_EQ(tok.token_to_piece(261), "");  // control: hidden unless special
    EXPECT_EQ(tok.token_to_piece(261, true), "<|im_end|>");
    EXPECT_EQ(tok.token_to_piece(262), "<think>");  // user-defined: always shown
    EXPECT_EQ(tok.token_to_piece(-1), "");
    EXPECT_EQ(tok.token_to_piece(99999), "");
    EXPECT_TRUE(tok.is_eog(261));
    EXPECT_FALSE(tok.is_eog(262));
    EXPECT_EQ(tok.decode(tok.encode("hello world \U0001F600")), "hello world \U0001F600");
}

TEST(TokenizerBpe, AddBosHonoured) {
    Vocab v = tiny_vocab();
    v.bos_id = 262;
    v.add_bos = true;
    Tokenizer tok(std::move(v));
    EXPECT_EQ(tok.encode("aa"), (std::vector<int32_t>{262, 260}));
    EXPECT_EQ(tok.encode("aa", true, /*add_special=*/false), (std::vector<int32_t>{260}));
}

TEST(TokenizerBpe, BadVocabulariesAreErrorsNamingTheValue) {
    Vocab v = tiny_vocab();
    v.model = "llama";
    try {
        Tokenizer t(v);
        FAIL();
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find("'llama'"), std::string::npos);
    }
    v = tiny_vocab();
    v.pre = "gpt-4o";
    try {
        Tokenizer t(v);
        FAIL();
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find("'gpt-4o'"), std::string::npos);
    }
    v = tiny_vocab();
    v.tokens.push_back("he");  // duplicate
    v.token_types.push_back(1);
    EXPECT_THROW(Tokenizer{v}, minfer::Error);
}

TEST(TokenizerBpe, InvalidUtf8NeverCrashes) {
    Tokenizer tok(tiny_vocab());
    // Every invalid byte becomes U+FFFD = EF BF BD, tokenized as its bytes.
    EXPECT_EQ(tok.encode(std::string("\xFF", 1)), (std::vector<int32_t>{0xEF, 0xBF, 0xBD}));
    std::string junk;
    for (int i = 0; i < 2000; ++i) junk.push_back(char((i * 7919) & 0xFF));
    const auto ids = tok.encode(junk);
    for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < tok.n_vocab());
}

// ---------------------------------------------------------------------------

TEST(StreamDecoder, NeverEmitsPartialCharacters) {
    Tokenizer tok(tiny_vocab());
    StreamDecoder sd(tok);
    // U+1F600 arrives as four byte tokens.
    EXPECT_EQ(sd.push(0xF0), "");
    EXPECT_EQ(sd.push(0x9F), "");
    EXPECT_EQ(sd.push(0x98), "");
    EXPECT_EQ(sd.push(0x80), "\U0001F600");
    EXPECT_EQ(sd.pending(), 0u);
    EXPECT_EQ(sd.push('a'), "a");
    EXPECT_EQ(sd.push(0xE4), "");
    EXPECT_EQ(sd.push(258), "\uFFFDhell");  // broken sequence: U+FFFD, then the rest
    EXPECT_EQ(sd.push(0x80), "\uFFFD");     // stray continuation byte
    EXPECT_EQ(sd.push(0xC3), "");
    EXPECT_EQ(sd.flush(), "\uFFFD");  // incomplete at the end of the stream
    // An overlong lead (C0) or a surrogate (ED A0) is invalid at once.
    EXPECT_EQ(sd.push_bytes(std::string("\xED\xA0\x80", 3)), "\uFFFD\uFFFD\uFFFD");
    EXPECT_EQ(sd.push(261), "");  // control token, special = false
}

TEST(StreamDecoder, MatchesDecodeOnRealVocabulary) {
    const auto model = minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf");
    MINFER_REQUIRE_SHARED_FILES(model);
    auto f = minfer::gguf::File::open(model);
    Tokenizer tok = Tokenizer::from_gguf(f);
    const std::string text =
        "emoji: \U0001F44B\U0001F3FD \U0001F389 \U0001F468\u200d\U0001F469 \u4e2d\u6587 caf\u00e9";
    const auto ids = tok.encode(text);
    StreamDecoder sd(tok);
    std::string out;
    for (int32_t id : ids) {
        const std::string part = sd.push(id);
        // every chunk is itself complete UTF-8
        size_t pos = 0;
        while (pos < part.size()) {
            const size_t before = pos;
            EXPECT_NE(utf8_decode_llama(part, &pos), kReplacementChar) << before;
        }
        out += part;
    }
    out += sd.flush();
    EXPECT_EQ(out, text);
    EXPECT_TRUE(tok.is_eog(151645));   // <|im_end|>
    EXPECT_TRUE(tok.is_eog(151643));   // <|endoftext|>
    EXPECT_FALSE(tok.is_eog(151644));  // <|im_start|>
    EXPECT_EQ(tok.bos(), 151643);
    EXPECT_FALSE(tok.add_bos());
}
