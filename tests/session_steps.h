// The logits of a prompt fed to a Session one token a pass: every row through
// the decode (one-token) kernels, to compare with a reference over the prompt.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"

namespace minfer::testing {

// [n_vocab, prompt.size()]: row i after reading prompt[0..i].
inline std::vector<float> logits_token_by_token(const model::Model& model,
                                                std::span<const int32_t> prompt) {
    runtime::SessionOptions o;
    o.n_ctx = 64;
    o.n_threads = 2;
    runtime::Session sess(model, o);
    std::vector<float> rows;
    for (int32_t id : prompt) {
        const std::vector<float> row = sess.eval(std::vector<int32_t>{id});
        rows.insert(rows.end(), row.begin(), row.end());
    }
    return rows;
}

}  // namespace minfer::testing
