// Shared by the fuzz targets: strict UTF-8 validation, a failure that the
// fuzzer records as a crash, and the two vocabularies the tokenizer targets
// use (built once per process).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "gguf/gguf.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace minfer::fuzz {

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "fuzz check failed: %s\n", what);
    std::abort();
}

// RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
inline bool valid_utf8(std::string_view s) {
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
        const uint8_t c = uint8_t(s[i]);
        if (c < 0x80) {
            ++i;
            continue;
        }
        int len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + size_t(len) > n) return false;
        for (int k = 1; k < len; ++k) {
            const uint8_t b = uint8_t(s[i + size_t(k)]);
            if ((b & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (b & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
            return false;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += size_t(len);
    }
    return true;
}

// The tests' tiny vocabulary: 256 byte tokens, 4 merges, ChatML control
// tokens and a user-defined <think>.
inline const tokenizer::Tokenizer& tiny_tokenizer() {
    static const tokenizer::Tokenizer tok = [] {
        gguf::Writer w;
        int64_t n_vocab = 0;
        testing::add_tiny_vocab(w, &n_vocab);
        static const std::vector<uint8_t> bytes = w.to_bytes();
        return tokenizer::Tokenizer::from_gguf(gguf::File::parse(bytes.data(), bytes.size()));
    }();
    return tok;
}

// The built-in model's vocabulary (models/kjv-tiny-q8_0.gguf in the source
// tree, or $MINFER_FUZZ_MODEL); the tiny one when the file is missing.
inline const tokenizer::Tokenizer& kjv_tokenizer() {
    static const tokenizer::Tokenizer* tok = []() -> const tokenizer::Tokenizer* {
        const char* env = std::getenv("MINFER_FUZZ_MODEL");
        const std::string path = env ? env : MINFER_SOURCE_DIR "/models/kjv-tiny-q8_0.gguf";
        try {
            return new tokenizer::Tokenizer(
                tokenizer::Tokenizer::from_gguf(gguf::File::open(path)));
        } catch (const minfer::Error& e) {
            std::fprintf(stderr, "fuzz: %s; using the tiny vocabulary\n", e.what());
            return &tiny_tokenizer();
        }
    }();
    return *tok;
}

}  // namespace minfer::fuzz
