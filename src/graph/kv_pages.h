// The KV cache as pages: every layer's persistent K and V region (the
// allocator's, committed when the cache is created) is cut into pages of
// kKvPageCells cells; page p is cells [p * P, (p + 1) * P) of every region.
// This class is the pages' bookkeeping only — who holds a page, which pages
// are known by their contents (shared prefixes), which are free. A page
// belongs to the pool; a sequence holds references to pages (its page
// table), so several sequences can map one page.
//
// A page is in exactly one state:
//   used    refs > 0 (held by at least one sequence)
//   cached  refs == 0 and published: its contents are known by a hash, kept
//           for a later sequence with the same prefix, evicted LRU
//   free    refs == 0, not published
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

namespace minfer::graph {

// Cells per page (vLLM's default block is 16; llama.cpp has no pages).
constexpr int32_t kKvPageCells = 32;

class KvPagePool {
  public:
    explicit KvPagePool(int32_t n_pages);

    int32_t n_pages() const { return static_cast<int32_t>(refs_.size()); }
    // A page for a new holder (refs 1, unpublished): a free one, else the
    // least recently used cached one (its hash is forgotten). -1 when every
    // page is used.
    int32_t take();
    // Pages take() could hand out now (free + cached).
    int32_t available() const { return n_free() + n_cached(); }
    // Another holder of a used or cached page (a cached page is used again).
    void ref(int32_t page);
    // A holder lets go. With no holder left the page is cached when
    // published (and ready), else free.
    void unref(int32_t page);
    int32_t refs(int32_t page) const { return refs_.at(static_cast<size_t>(page)); }

    // --- the prefix index ----------------------------------------------------
    // Index a page under `hash` (its tokens and every token before them).
    // Not ready until mark_ready(): its cells are still being computed by
    // its first holder, and later holders wait for them. A hash already
    // indexed keeps its page (returns false; nothing changes).
    bool publish(int32_t page, uint64_t hash);
    void mark_ready(int32_t page);
    bool ready(int32_t page) const { return ready_.at(static_cast<size_t>(page)) != 0; }
    bool published(int32_t page) const { return hash_of_.count(page) != 0; }
    // Drop a page from the index (its filler gave up before it was ready).
    void unpublish(int32_t page);
    // The page indexed under hash, or -1.
    int32_t lookup(uint64_t hash) const;

    int32_t n_used() const { return n_used_; }
    int32_t n_cached() const { return static_cast<int32_t>(lru_.size()); }
    int32_t n_free() const { return static_cast<int32_t>(free_.size()); }

    // Throws minfer::Error naming the first broken invariant: every page in
    // exactly one state, the index and the LRU list consistent. `holders`
    // [n_pages], when given, is the number of references the sequences
    // believe they hold on each page; it must equal refs.
    void check(const std::vector<int32_t>* holders = nullptr) const;

  private:
    std::vector<int32_t> refs_;
    std::vector<uint8_t> ready_;
    std::vector<int32_t> free_;  // a stack
    std::list<int32_t> lru_;     // cached pages, least recently used first
    std::vector<std::list<int32_t>::iterator> lru_pos_;
    std::vector<uint8_t> in_lru_;
    std::unordered_map<uint64_t, int32_t> index_;
    std::unordered_map<int32_t, uint64_t> hash_of_;
    int32_t n_used_ = 0;
};

// The hash chain of prefix pages: a page's key covers its tokens and (via
// `prev`, the previous page's key, or `salt` for the first) every token
// before them.
uint64_t page_hash(uint64_t prev, const int32_t* tokens, int64_t n);

}  // namespace minfer::graph
