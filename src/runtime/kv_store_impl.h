// The engine's KV store: the pages of every layer's K and V region, who holds
// them (graph::KvPagePool), the prefix index beside them (page hashes and the
// tokens of indexed pages), and the copy of computed cells from one
// sequence's pages into another's. The regions' memory is the graph
// allocator's (persistent buffers no plan frees or reuses, as the design's
// allocator owns the KV cache); the store is attached to them once they
// exist and is the runtime's one reader and writer of their cells, in the
// layout of ir/kv_layout.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "graph/kv_pages.h"
#include "runtime/sequence_impl.h"
#include "tensor/dtype.h"

namespace minfer::graph {
class GraphAllocator;
}

namespace minfer::runtime {

class KvStore {
  public:
    // Pages for n_ctx cells; `prefix_cache` off salts every hash by its
    // request, so nothing is found across requests.
    KvStore(int64_t n_ctx, bool prefix_cache);

    int32_t n_pages() const { return n_pages_; }
    // One page more than n_pages: read (never written) by padding tokens.
    int32_t trash_page() const { return n_pages_; }
    // Cells of the regions the graphs are built for: the pages and the trash page.
    int64_t n_ctx_cells() const { return int64_t{n_pages_ + 1} * kPageCells; }
    bool prefix_cache() const { return prefix_cache_; }
    graph::KvPagePool& pool() { return *pool_; }
    const graph::KvPagePool& pool() const { return *pool_; }

    // The hash chain of the first n full pages of a sequence's tokens.
    std::vector<uint64_t> page_hashes(const Sequence& s, int64_t n) const;
    // Maps the longest run of indexed pages matching s's prompt and takes
    // fresh pages for the rest of it (indexing the full ones, not ready).
    // False (nothing taken) when the pool cannot hold it.
    bool map_prefix_and_reserve(Sequence& s);
    // Marks the indexed pages s filled itself (past its mapped ones) ready,
    // as far as its cells are written: waiters may map them now.
    void mark_filled_pages_ready(const Sequence& s);
    // Lets go of s's pages, indexing its computed full pages first.
    void release_pages(Sequence& s);
    // The regions the pages are cells of: every layer's K and V persistent
    // buffer in `alloc`, rows of n_kv_embd values of kv_type.
    void attach_regions(graph::GraphAllocator& alloc, int64_t n_kv_embd, tensor::DType kv_type);
    // Past s's mapped pages, the longest run of its prompt another running
    // sequence has computed, copied into s's own pages. Returns the cells
    // copied. The regions must be attached.
    int64_t copy_computed_cells(Sequence& s, const std::vector<std::unique_ptr<Sequence>>& seqs);
    // Throws minfer::Error when the page accounting is broken (see Engine::Impl).
    void check(const std::vector<std::unique_ptr<Sequence>>& seqs) const;

  private:
    bool index_page(const Sequence& s, int64_t i, uint64_t hash);
    // The cells of o written so far: a mapped page counts once it is ready.
    int64_t cells_written(const Sequence& o) const;
    void copy_cells(const Sequence& donor, const Sequence& s, int64_t from, int64_t to);

    int32_t n_pages_ = 0;
    bool prefix_cache_ = true;
    std::unique_ptr<graph::KvPagePool> pool_;
    graph::GraphAllocator* regions_ = nullptr;  // attach_regions
    int64_t n_kv_embd_ = 0;
    size_t row_bytes_ = 0, elem_bytes_ = 0;          // of one cell's row: f32 or f16 values
    std::vector<std::vector<int32_t>> page_tokens_;  // [n_pages] tokens of indexed pages
    std::vector<uint8_t> copy_staging_;              // copy_cells' V rows or donor K page
    std::vector<uint8_t> own_page_staging_;          // ... and the K page they are patched into
};

}  // namespace minfer::runtime
