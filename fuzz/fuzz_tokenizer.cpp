// Fuzz target: the tokenizer on arbitrary bytes (invalid UTF-8 included).
//  - encode never crashes and every id is inside the vocabulary;
//  - byte-level BPE loses nothing: for valid UTF-8 text,
//    decode(encode(text, parse_special=false)) == text, and with special
//    tokens parsed, decode(..., special=true) == text as well (llama.cpp
//    replaces invalid UTF-8 by U+FFFD, so only valid text round-trips);
//  - StreamDecoder output is always valid UTF-8, equals the text for valid
//    input, whether fed token by token or in arbitrary byte chunks.
// The first input byte picks the vocabulary: the built-in KJV model's (a real
// BPE with thousands of merges) or the tests' tiny one (tests/tiny_model.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace minfer;

namespace {

void check_stream(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids, bool special,
                  std::string_view text, bool text_valid, std::string_view chunking) {
    tokenizer::StreamDecoder sd(tok, special);
    std::string out;
    for (int32_t id : ids) out += sd.push(id);
    out += sd.flush();
    if (!fuzz::valid_utf8(out)) fuzz::fail("StreamDecoder produced invalid UTF-8");
    if (text_valid && out != text) fuzz::fail("StreamDecoder output differs from the text");

    // The same bytes in arbitrary chunks (sizes from the input).
    tokenizer::StreamDecoder sb(tok, special);
    std::string out2;
    size_t pos = 0, k = 0;
    while (pos < text.size()) {
        size_t n = chunking.empty() ? 1 : 1 + uint8_t(chunking[k++ % chunking.size()]) % 7;
        n = std::min(n, text.size() - pos);
        out2 += sb.push_bytes(text.substr(pos, n));
        pos += n;
    }
    out2 += sb.flush();
    if (!fuzz::valid_utf8(out2)) fuzz::fail("StreamDecoder::push_bytes produced invalid UTF-8");
    if (text_valid && out2 != text) fuzz::fail("StreamDecoder::push_bytes changed valid text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const tokenizer::Tokenizer& tok =
        (data[0] & 1) ? fuzz::tiny_tokenizer() : fuzz::kjv_tokenizer();
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    const bool valid = fuzz::valid_utf8(text);

    for (bool parse_special : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(text, parse_special);
        for (int32_t id : ids)
            if (id < 0 || id >= tok.n_vocab()) fuzz::fail("encode produced an id out of range");
        if (valid) {
            // parse_special=false: control-token text is plain text, and
            // user-defined tokens (always cut out) render as their text.
            // parse_special=true: control tokens render with special=true.
            if (tok.decode(ids, parse_special) != text) fuzz::fail("decode(encode(text)) != text");
        }
        check_stream(tok, ids, parse_special, text, valid, text);
    }
    // Arbitrary ids (in and out of range) decode without crashing.
    for (size_t i = 0; i + 4 <= text.size() && i < 64; i += 4) {
        int32_t id;
        std::memcpy(&id, text.data() + i, 4);
        (void)tok.token_to_piece(id, true);
        (void)tok.token_to_piece(id % (tok.n_vocab() + 8), false);
    }
    return 0;
}
