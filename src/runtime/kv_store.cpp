#include <algorithm>
#include <string>

#include "graph/alloc.h"
#include "ir/kv_layout.h"
#include "runtime/kv_store_impl.h"
#include "util/error.h"

namespace minfer::runtime {

static_assert(kPageCells % graph::kKBlockCells == 0, "a page is whole K blocks");

KvStore::KvStore(int64_t n_ctx, bool prefix_cache)
    : n_pages_(static_cast<int32_t>((n_ctx + kPageCells - 1) / kPageCells)),
      prefix_cache_(prefix_cache),
      pool_(std::make_unique<graph::KvPagePool>(n_pages_)),
      page_tokens_(static_cast<size_t>(n_pages_)) {}

// With the prefix cache off, salted by the request: nothing is found across
// requests.
std::vector<uint64_t> KvStore::page_hashes(const Sequence& s, int64_t n) const {
    std::vector<uint64_t> hashes(static_cast<size_t>(n));
    uint64_t h = prefix_cache_ ? 0 : 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(s.req->id);
    for (int64_t i = 0; i < n; ++i)
        hashes[static_cast<size_t>(i)] = h =
            graph::page_hash(h, s.tokens.data() + i * kPageCells, kPageCells);
    return hashes;
}

// Indexes page i of a sequence under `hash` and keeps its tokens (an
// admission checks them against its own). False when the hash is indexed
// already (the page stays unindexed).
bool KvStore::index_page(const Sequence& s, int64_t i, uint64_t hash) {
    const int32_t p = s.pages[static_cast<size_t>(i)];
    if (!pool_->publish(p, hash)) return false;
    page_tokens_[static_cast<size_t>(p)].assign(s.tokens.begin() + i * kPageCells,
                                                s.tokens.begin() + (i + 1) * kPageCells);
    return true;
}

void KvStore::mark_filled_pages_ready(const Sequence& s) {
    for (int64_t i = s.n_hit_pages; i < s.n_done / kPageCells; ++i) {
        const int32_t p = s.pages[static_cast<size_t>(i)];
        if (pool_->published(p) && !pool_->ready(p)) pool_->mark_ready(p);
    }
}

void KvStore::release_pages(Sequence& s) {
    // Every page whose cells are all computed goes to the index if it is not
    // there (pages filled while generating, and the prompt's last full
    // page): when nobody holds it, it stays cached, so a chat that goes on
    // from this reply, or this sequence admitted again after a preemption,
    // maps it instead of computing it.
    const int64_t n_full =
        std::min<int64_t>(s.n_done / kPageCells, static_cast<int64_t>(s.pages.size()));
    const std::vector<uint64_t> hashes =
        prefix_cache_ ? page_hashes(s, n_full) : std::vector<uint64_t>{};
    for (size_t i = 0; i < s.pages.size(); ++i) {
        const int32_t p = s.pages[i];
        // A prompt page this sequence was still filling: nobody else will
        // fill it, so it leaves the index (waiters see it and recompute).
        if (static_cast<int64_t>(i) >= s.n_hit_pages && pool_->published(p) && !pool_->ready(p))
            pool_->unpublish(p);
        if (i < hashes.size() && !pool_->published(p) &&
            index_page(s, static_cast<int64_t>(i), hashes[i]))
            pool_->mark_ready(p);
        pool_->unref(p);
    }
    s.pages.clear();
    s.n_hit_pages = 0;
    s.n_done = 0;
}

bool KvStore::map_prefix_and_reserve(Sequence& s) {
    const auto n_tok = static_cast<int64_t>(s.tokens.size());
    // Full pages before the last token (the last is always computed: its
    // logits are the next sample's).
    const int64_t n_full = (n_tok - 1) / kPageCells;
    const std::vector<uint64_t> hashes = page_hashes(s, n_full);
    // Map the longest run of indexed pages whose tokens match.
    std::vector<int32_t> hit;
    for (int64_t i = 0; i < n_full; ++i) {
        const int32_t p = pool_->lookup(hashes[static_cast<size_t>(i)]);
        if (p < 0) break;
        const auto& pt = page_tokens_[static_cast<size_t>(p)];
        if (!std::equal(pt.begin(), pt.end(), s.tokens.begin() + i * kPageCells,
                        s.tokens.begin() + (i + 1) * kPageCells) ||
            pt.size() != static_cast<size_t>(kPageCells))
            break;
        hit.push_back(p);
    }
    const int64_t need = (n_tok + kPageCells - 1) / kPageCells - static_cast<int64_t>(hit.size());
    // Pages the hits take out of the cached list do not count as available.
    int64_t hit_cached = 0;
    for (int32_t p : hit)
        if (pool_->refs(p) == 0) ++hit_cached;
    if (pool_->available() - hit_cached < need) return false;
    for (int32_t p : hit) pool_->ref(p);
    s.pages = hit;
    s.n_hit_pages = static_cast<int64_t>(hit.size());
    s.n_done = s.n_hit_pages * kPageCells;
    for (int64_t i = s.n_hit_pages; i < s.n_hit_pages + need; ++i) {
        const int32_t p = pool_->take();
        MINFER_ASSERT(p >= 0);
        s.pages.push_back(p);
        if (i < n_full) {
            // Indexed at once, not ready: a sequence admitted a moment later
            // with the same prefix maps it and waits for it.
            index_page(s, i, hashes[static_cast<size_t>(i)]);
        }
    }
    return true;
}

int64_t KvStore::cells_written(const Sequence& o) const {
    // One its filler gave up on stays unwritten until the sequence notices
    // and recomputes it.
    int64_t done = o.n_done;  // o.tokens holds at least n_done
    for (int64_t i = 0; i < o.n_hit_pages; ++i)
        if (!pool_->ready(o.pages[static_cast<size_t>(i)])) return std::min(done, i * kPageCells);
    return done;
}

void KvStore::attach_regions(graph::GraphAllocator& alloc, int64_t n_kv_embd,
                             tensor::DType kv_type) {
    regions_ = &alloc;
    n_kv_embd_ = n_kv_embd;
    row_bytes_ = tensor::row_size(kv_type, n_kv_embd);
    elem_bytes_ = row_bytes_ / static_cast<size_t>(n_kv_embd);
}

// The tokens after a running sequence's last full prompt page (only full
// pages are indexed), or pages it filled while generating (a chat that goes
// on from its reply), copied cell by cell into this sequence's own pages, as
// vLLM copies a shared block a fork writes into. The cells are bitwise those
// this sequence would compute (a token's K and V depend only on it and the
// tokens before it: batch invariance), so the copy changes no result. A copy
// at admission, a few cells per layer: what it saves is a pass's worth of
// tokens. The last prompt token is always computed (its logits are the first
// sample's).
int64_t KvStore::copy_computed_cells(Sequence& s,
                                     const std::vector<std::unique_ptr<Sequence>>& seqs) {
    MINFER_ASSERT(regions_ != nullptr);
    const int64_t from = s.n_done;
    const int64_t limit = static_cast<int64_t>(s.tokens.size()) - 1;
    const Sequence* donor = nullptr;
    int64_t best = from;
    for (const auto& o : seqs) {
        if (o.get() == &s || !o->running()) continue;
        const int64_t avail = std::min(cells_written(*o), limit);
        if (avail <= best ||
            !std::equal(s.tokens.begin(), s.tokens.begin() + from, o->tokens.begin()))
            continue;
        int64_t m = from;
        while (m < avail && s.tokens[static_cast<size_t>(m)] == o->tokens[static_cast<size_t>(m)])
            ++m;
        if (m > best) {
            best = m;
            donor = o.get();
        }
    }
    if (donor == nullptr) return 0;
    copy_cells(*donor, s, from, best);
    return best - from;
}

// Cells [from, to) of donor's pages into the same cells of s's, in every
// layer's K and V region.
void KvStore::copy_cells(const Sequence& donor, const Sequence& s, int64_t from, int64_t to) {
    const size_t row = row_bytes_;
    for (const auto& region : regions_->persistent()) {  // every layer's K and V
        backend::Backend& be = regions_->backend(region.ref.backend);
        for (int64_t p = from; p < to;) {
            const auto j = static_cast<size_t>(p / kPageCells);
            const int64_t in = p % kPageCells, n = std::min<int64_t>(to - p, kPageCells - in);
            backend::BufRef src = region.ref, dst = region.ref;
            if (!region.is_k) {  // V: the cells' rows, one contiguous range
                src.offset += static_cast<size_t>(donor.pages[j] * kPageCells + in) * row;
                dst.offset += static_cast<size_t>(s.pages[j] * kPageCells + in) * row;
                src.len = dst.len = static_cast<size_t>(n) * row;
            } else {  // K: both pages whole, the cells patched element by element
                src.offset += static_cast<size_t>(donor.pages[j] * kPageCells) * row;
                dst.offset += static_cast<size_t>(s.pages[j] * kPageCells) * row;
                src.len = dst.len = static_cast<size_t>(kPageCells) * row;
            }
            MINFER_ASSERT(std::max(src.offset, dst.offset) + src.len <=
                          region.ref.offset + region.ref.len);
            copy_staging_.resize(src.len);
            be.read_host(src, copy_staging_.data(), src.len);
            if (region.is_k) {
                // the page starts a K block (whole blocks a page)
                own_page_staging_.resize(dst.len);
                be.read_host(dst, own_page_staging_.data(), dst.len);
                graph::copy_k_cells(own_page_staging_.data(), copy_staging_.data(), in, n,
                                    n_kv_embd_, elem_bytes_);
                copy_staging_.swap(own_page_staging_);
            }
            be.write_host(dst, copy_staging_.data(), dst.len);
            p += n;
        }
    }
}

void KvStore::check(const std::vector<std::unique_ptr<Sequence>>& seqs) const {
    std::vector<int32_t> holders(static_cast<size_t>(n_pages_), 0);
    for (const auto& s : seqs) {
        if (!s->running() && !s->pages.empty())
            throw Error("KV pages: a sequence that is not running holds pages");
        if (s->running() && static_cast<int64_t>(s->pages.size()) * kPageCells < s->n_done)
            throw Error("KV pages: a sequence has computed cells outside its pages");
        std::vector<int32_t> mine = s->pages;
        std::sort(mine.begin(), mine.end());
        if (std::adjacent_find(mine.begin(), mine.end()) != mine.end())
            throw Error("KV pages: a sequence maps one page twice");
        for (int32_t p : s->pages) ++holders.at(static_cast<size_t>(p));
    }
    pool_->check(&holders);
    // A page written by a sequence (past its shared prefix) has that one holder.
    for (const auto& s : seqs)
        for (size_t i = static_cast<size_t>(s->n_hit_pages); i < s->pages.size(); ++i) {
            const int32_t p = s->pages[i];
            if (!pool_->published(p) && pool_->refs(p) != 1)
                throw Error("KV pages: page " + std::to_string(p) +
                            " is written by one sequence but held by " +
                            std::to_string(pool_->refs(p)));
        }
}

}  // namespace minfer::runtime
