// The vocabulary of a byte-level BPE tokenizer as GGUF stores it
// (tokenizer.ggml.*). A plain struct so that tests and fuzzers can build one
// by hand; Tokenizer (tokenizer.h) validates it and builds its tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace minfer::gguf {
class File;
}

namespace minfer::tokenizer {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
};

struct Vocab {
    std::string model = "gpt2";        // tokenizer.ggml.model
    std::string pre = "qwen2";         // tokenizer.ggml.pre
    std::vector<std::string> tokens;   // [n_vocab] byte-level (GPT-2 mapped) text
    std::vector<int32_t> token_types;  // [n_vocab] TokenType values; empty = all Normal
    std::vector<std::string> merges;   // "left right"; the rank is the index
    // Special ids; -1 = none.
    int32_t bos_id = -1;
    int32_t eos_id = -1;
    int32_t eot_id = -1;  // tokenizer.ggml.eot_token_id (rare)
    int32_t eom_id = -1;  // tokenizer.ggml.eom_token_id (rare)
    int32_t pad_id = -1;
    bool add_bos = false;
    bool add_eos = false;
    std::string chat_template;  // tokenizer.chat_template (jinja), may be empty
};

// The pre-tokenizer names (tokenizer.ggml.pre) that llama.cpp maps to the
// Qwen2 split regex; the only ones this tokenizer implements.
bool is_supported_pre_tokenizer(const std::string& pre);

// Reads tokenizer.ggml.* from a GGUF file. Throws minfer::Error naming the key
// (or value) at fault: a model other than "gpt2", an unsupported pre-tokenizer,
// missing tokens or merges, array length mismatches.
Vocab load_vocab(const gguf::File& f);

}  // namespace minfer::tokenizer
