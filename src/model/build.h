// Graph builders: one forward pass of a model as a graph::Graph, in build
// order. The builder emits the plain (unfused) graph; fusion is a later pass
// (graph/fuse.h), so both forms share one builder.
#pragma once

#include <cstdint>

#include "ir/ir.h"
#include "model/model.h"

namespace minfer::model {

struct BuildParams {
    int64_t n_tokens = 1;  // tokens in this pass
    int64_t n_out = 1;     // rows that get logits (the last n_out rows selected by tail_ids)
    int64_t n_ctx = 4096;  // KV region rows (cells); a multiple of kv_page when paged
    tensor::DType kv_type = tensor::DType::F32;
    // Paged KV (kv_page > 0): the regions are pools of pages of kv_page
    // cells; each token names the cell it writes and the page-table row of
    // its sequence (n_seqs rows of n_ctx / kv_page pages).
    int32_t kv_page = 0;
    int64_t n_seqs = 1;
};

// Inputs, filled by name after allocation:
//   token_ids [n_tokens]  positions [n_tokens]  tail_ids [n_out] (only when n_out < n_tokens)
//   paged only: kv_cells [n_tokens]  kv_rows [n_tokens]  kv_pages [n_seqs * n_ctx / kv_page]
// Output: logits [n_vocab, n_out].
graph::Graph build_graph(const Model& model, const BuildParams& params);

}  // namespace minfer::model
