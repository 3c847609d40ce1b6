#include "tokenizer/vocab.h"

#include "gguf/gguf.h"
#include "util/error.h"

namespace minfer::tokenizer {

Vocab load_vocab(const gguf::File& f) {
    Vocab v;
    const std::string src = f.path();
    auto model = f.get_string("tokenizer.ggml.model");
    if (!model) throw Error(src + ": missing key tokenizer.ggml.model");
    if (*model != "gpt2")
        throw Error(src + ": unsupported tokenizer.ggml.model '" + *model +
                    "' (only \"gpt2\" byte-level BPE is supported)");
    v.model = *model;
    auto pre = f.get_string("tokenizer.ggml.pre");
    if (!pre) throw Error(src + ": missing key tokenizer.ggml.pre (expected \"qwen2\")");
    if (!is_supported_pre_tokenizer(*pre))
        throw Error(src + ": unsupported tokenizer.ggml.pre '" + *pre +
                    "' (supported: qwen2 and the names llama.cpp maps to the same regex)");
    v.pre = *pre;

    const auto* tokens = f.get_string_array("tokenizer.ggml.tokens");
    if (!tokens) throw Error(src + ": missing key tokenizer.ggml.tokens");
    v.tokens = *tokens;
    const size_t n = v.tokens.size();
    if (const auto* types = f.get_int_array("tokenizer.ggml.token_type")) {
        if (types->size() < n)
            throw Error(src + ": tokenizer.ggml.token_type has " + std::to_string(types->size()) +
                        " entries for " + std::to_string(n) + " tokens");
        v.token_types.reserve(n);
        for (size_t i = 0; i < n; ++i) v.token_types.push_back(int32_t((*types)[i]));
    }
    const auto* merges = f.get_string_array("tokenizer.ggml.merges");
    if (!merges) throw Error(src + ": missing key tokenizer.ggml.merges");
    v.merges = *merges;

    // llama.cpp's defaults for a "gpt2" vocabulary are bos = eos = 11 when the
    // keys are absent (and the id is in range); an out-of-range value in the
    // file keeps the default.
    auto special = [&](const char* key, int32_t def) -> int32_t {
        if (def >= int64_t(n)) def = -1;
        auto x = f.get_int(key);
        if (!x) return def;
        if (*x < 0 || *x >= int64_t(n)) return def;
        return int32_t(*x);
    };
    v.bos_id = special("tokenizer.ggml.bos_token_id", 11);
    v.eos_id = special("tokenizer.ggml.eos_token_id", 11);
    v.eot_id = special("tokenizer.ggml.eot_token_id", -1);
    v.eom_id = special("tokenizer.ggml.eom_token_id", -1);
    v.pad_id = special("tokenizer.ggml.padding_token_id", -1);
    v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
    v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
    v.chat_template = f.get_string("tokenizer.chat_template").value_or("");
    return v;
}

}  // namespace minfer::tokenizer
