// Byte-level BPE tokenizer that reproduces llama.cpp's ids for Qwen-family
// GGUF vocabularies (tokenizer.ggml.model = "gpt2", pre = "qwen2").
//
// encode(): special tokens are cut out first (llama.cpp's
// tokenizer_st_partition: longest token text first, every occurrence, text
// around them kept verbatim), then each remaining fragment is split into
// words (pretokenize.h), each word is mapped byte -> GPT-2 code point and
// merged by BPE rank (lowest rank first, leftmost first on ties), and the
// merged symbols become ids.
//
// Thread safety: a Tokenizer is immutable after construction; encode() and
// every other const member may be called concurrently from many threads
// (the per-word cache lives inside each encode() call).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace minfer::gguf {
class File;
}

namespace minfer::tokenizer {

// llama.cpp's token attributes (llama_token_attr), derived from TokenType
// plus llama.cpp's fix-ups by token text (EOG/FIM tokens become CONTROL).
enum TokenAttr : uint32_t {
    kAttrUndefined = 0,
    kAttrUnknown = 1u << 0,
    kAttrUnused = 1u << 1,
    kAttrNormal = 1u << 2,
    kAttrControl = 1u << 3,
    kAttrUserDefined = 1u << 4,
    kAttrByte = 1u << 5,
};

class Tokenizer {
  public:
    // Validates the vocabulary (sizes, duplicate tokens, ids in range) and
    // builds the lookup tables. Throws minfer::Error.
    explicit Tokenizer(Vocab vocab);
    static Tokenizer from_gguf(const gguf::File& f);

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // parse_special: cut out CONTROL tokens written in the text (USER_DEFINED
    // ones such as <think> are always cut out, as in llama.cpp).
    // add_special: prepend BOS / append EOS when the vocabulary asks for it
    // (add_bos_token / add_eos_token; both false for Qwen).
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true,
                                bool add_special = true) const;

    // The bytes of one token. CONTROL/UNKNOWN tokens render as their text
    // only when `special` is true (else ""), like llama_token_to_piece.
    // Out-of-range ids give "".
    std::string token_to_piece(int32_t id, bool special = false) const;
    // Concatenation of token_to_piece over ids.
    std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

    int32_t n_vocab() const;
    // End of generation: eos, eot, eom, and the tokens llama.cpp marks EOG by
    // their text (<|im_end|>, <|endoftext|>, <|eot_id|>, <|fim_pad|>,
    // <|repo_name|>, <|file_sep|>, ...).
    bool is_eog(int32_t id) const;
    const std::vector<int32_t>& eog_ids() const;
    int32_t bos() const;  // -1 if none
    int32_t eos() const;  // -1 if none
    int32_t pad() const;  // -1 if none
    bool add_bos() const;
    bool is_control(int32_t id) const;
    uint32_t token_attr(int32_t id) const;
    const std::string& token_text(int32_t id) const;  // raw vocabulary text
    int32_t token_id(std::string_view text) const;    // -1 if not a token
    const Vocab& vocab() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text that never ends inside a UTF-8
// character: push() returns only complete characters and holds back an
// incomplete tail (at most 3 bytes) until the next token completes it.
// Bytes that can never form a valid character (a stray continuation byte,
// an overlong or surrogate form, a lead byte whose sequence is broken) are
// replaced by U+FFFD, one per byte, so the output is always valid UTF-8;
// for valid input the concatenated output equals decode(ids) exactly.
class StreamDecoder {
  public:
    explicit StreamDecoder(const Tokenizer& tok, bool special = false)
        : tok_(&tok), special_(special) {}
    std::string push(int32_t id);
    std::string push_bytes(std::string_view bytes);
    // End of stream: an incomplete tail becomes U+FFFD per byte.
    std::string flush();
    size_t pending() const { return pending_.size(); }

  private:
    const Tokenizer* tok_;
    bool special_;
    std::string pending_;
};

}  // namespace minfer::tokenizer
