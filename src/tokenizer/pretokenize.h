// The Qwen2 pre-tokenizer: splits text into words the way llama.cpp does for
// tokenizer.ggml.pre = "qwen2". llama.cpp runs the regex
//   (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with std::regex (ECMAScript: ordered alternation, backtracking) over a
// "collapsed" text where every non-ASCII code point is replaced by one byte
// standing for its class. So, per code point:
//   \s    = ASCII \t \n \v \f \r and space, or a non-ASCII White_Space code point
//           (ASCII 0x1C..0x1F are NOT \s, unlike Python's re);
//   \p{L} = general category L*, \p{N} = N* (non-whitespace only);
//   combining marks (M*) are neither: they split words;
//   contractions fold ASCII case only ('S but not 'ſ).
// This file implements that regex by hand, code point by code point.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace minfer::tokenizer {

// Class of one code point for the splitter.
enum : uint8_t { kClsOther = 0, kClsLetter = 1, kClsNumber = 2, kClsSpace = 3 };
uint8_t split_class(uint32_t cpt);

// Splits cpts[0..n) (one text fragment between special tokens); appends the
// end index (exclusive) of every word to `ends`, in order. `cls` holds
// split_class of each code point.
void split_words(const uint32_t* cpts, const uint8_t* cls, size_t n, std::vector<uint32_t>& ends);

// Convenience for tests and tools: decodes `text` with llama.cpp's UTF-8 rules
// and returns the words as UTF-8 strings (invalid bytes become U+FFFD).
std::vector<std::string> pretokenize(std::string_view text);

}  // namespace minfer::tokenizer
