// Fuzz target: a GGUF file of arbitrary bytes through everything that reads
// a model before the first forward pass — the GGUF parser, the typed getters,
// the hyper-parameter and tensor validation of model::Model, the vocabulary
// checks of the tokenizer, and the graph build for a short pass. Any
// minfer::Error is a correct answer; a crash, a sanitizer report or any other
// exception is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gguf/gguf.h"
#include "model/build.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace minfer;

namespace {

// Touches every getter the CLI's `info` uses, on every key.
void read_all_metadata(const gguf::File& f) {
    for (const auto& kv : f.metadata()) {
        try {
            (void)f.get_string(kv.key);
        } catch (const Error&) {
        }
        try {
            (void)f.get_int(kv.key);
        } catch (const Error&) {
        }
        try {
            (void)f.get_float(kv.key);
        } catch (const Error&) {
        }
        try {
            (void)f.get_string_array(kv.key);
        } catch (const Error&) {
        }
        try {
            (void)f.get_int_array(kv.key);
        } catch (const Error&) {
        }
    }
    for (const auto& t : f.tensors()) {
        // Every byte a TensorInfo claims must be inside the buffer: ASan
        // reports the first and last byte otherwise.
        if (t.nbytes) {
            volatile uint8_t first = t.data[0];
            volatile uint8_t last = t.data[t.nbytes - 1];
            (void)first;
            (void)last;
        }
        if (f.find_tensor(t.name) == nullptr) __builtin_trap();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        gguf::File f = gguf::File::parse(data, size, "fuzz.gguf");
        read_all_metadata(f);
        try {
            tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(f);
            (void)tok.encode("Hello, world <|im_start|>", true);
        } catch (const Error&) {
        }
        model::Model m = model::Model::from_file(std::move(f));
        // A validated model must build its graph without surprises; a small
        // context keeps the fuzzer fast (the graph holds shapes, not data).
        model::BuildParams bp;
        bp.n_ctx = std::min<int64_t>(m.hp.n_ctx_train, 16);
        bp.n_tokens = 2;
        bp.n_out = 1;
        graph::Graph g = model::build_graph(m, bp);
        (void)g;
    } catch (const Error&) {
    }
    return 0;
}
