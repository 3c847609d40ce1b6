#include "graph/kv_pages.h"

#include "util/error.h"

namespace minfer::graph {

KvPagePool::KvPagePool(int32_t n_pages)
    : refs_(static_cast<size_t>(n_pages), 0),
      ready_(static_cast<size_t>(n_pages), 0),
      lru_pos_(static_cast<size_t>(n_pages)),
      in_lru_(static_cast<size_t>(n_pages), 0) {
    if (n_pages < 1) throw Error("the KV cache needs at least one page");
    // Lowest pages first out of the stack.
    for (int32_t p = n_pages - 1; p >= 0; --p) free_.push_back(p);
}

int32_t KvPagePool::take() {
    int32_t p = -1;
    if (!free_.empty()) {
        p = free_.back();
        free_.pop_back();
    } else if (!lru_.empty()) {
        p = lru_.front();
        lru_.pop_front();
        in_lru_[static_cast<size_t>(p)] = 0;
        unpublish(p);
    } else {
        return -1;
    }
    refs_[static_cast<size_t>(p)] = 1;
    ready_[static_cast<size_t>(p)] = 0;
    ++n_used_;
    return p;
}

void KvPagePool::ref(int32_t page) {
    auto& r = refs_.at(static_cast<size_t>(page));
    if (r == 0) {
        MINFER_ASSERT_MSG(in_lru_[static_cast<size_t>(page)], "ref of a free page");
        lru_.erase(lru_pos_[static_cast<size_t>(page)]);
        in_lru_[static_cast<size_t>(page)] = 0;
        ++n_used_;
    }
    ++r;
}

void KvPagePool::unref(int32_t page) {
    auto& r = refs_.at(static_cast<size_t>(page));
    MINFER_ASSERT_MSG(r > 0, "unref of a page nobody holds");
    if (--r > 0) return;
    --n_used_;
    if (published(page) && ready(page)) {
        lru_.push_back(page);
        lru_pos_[static_cast<size_t>(page)] = std::prev(lru_.end());
        in_lru_[static_cast<size_t>(page)] = 1;
    } else {
        unpublish(page);
        free_.push_back(page);
    }
}

bool KvPagePool::publish(int32_t page, uint64_t hash) {
    MINFER_ASSERT(refs_.at(static_cast<size_t>(page)) > 0);
    if (index_.count(hash) != 0 || published(page)) return false;
    index_.emplace(hash, page);
    hash_of_.emplace(page, hash);
    return true;
}

void KvPagePool::mark_ready(int32_t page) {
    ready_.at(static_cast<size_t>(page)) = 1;
}

void KvPagePool::unpublish(int32_t page) {
    auto it = hash_of_.find(page);
    if (it == hash_of_.end()) return;
    index_.erase(it->second);
    hash_of_.erase(it);
}

int32_t KvPagePool::lookup(uint64_t hash) const {
    auto it = index_.find(hash);
    return it == index_.end() ? -1 : it->second;
}

void KvPagePool::check(const std::vector<int32_t>* holders) const {
    int32_t used = 0;
    std::vector<uint8_t> seen(refs_.size(), 0);
    for (int32_t p : free_) {
        if (seen.at(static_cast<size_t>(p))++)
            throw Error("KV pages: page " + std::to_string(p) + " is free twice");
        if (refs_[static_cast<size_t>(p)] != 0 || published(p))
            throw Error("KV pages: free page " + std::to_string(p) + " is held or indexed");
    }
    for (int32_t p : lru_) {
        if (seen.at(static_cast<size_t>(p))++)
            throw Error("KV pages: page " + std::to_string(p) + " is both free and cached");
        if (refs_[static_cast<size_t>(p)] != 0 || !published(p))
            throw Error("KV pages: cached page " + std::to_string(p) + " is held or unindexed");
    }
    for (size_t p = 0; p < refs_.size(); ++p) {
        if (refs_[p] < 0) throw Error("KV pages: page " + std::to_string(p) + " refs < 0");
        if (refs_[p] > 0) {
            ++used;
            if (seen[p]) throw Error("KV pages: held page " + std::to_string(p) + " is listed");
        } else if (!seen[p]) {
            throw Error("KV pages: page " + std::to_string(p) + " is lost (no holder, not listed)");
        }
        if (holders && (*holders)[p] != refs_[p])
            throw Error("KV pages: page " + std::to_string(p) + " has " + std::to_string(refs_[p]) +
                        " references but its holders count " + std::to_string((*holders)[p]));
    }
    if (used != n_used_) throw Error("KV pages: used count drifted");
    for (const auto& [h, p] : index_) {
        auto it = hash_of_.find(p);
        if (it == hash_of_.end() || it->second != h)
            throw Error("KV pages: the prefix index is inconsistent at page " + std::to_string(p));
    }
    if (index_.size() != hash_of_.size()) throw Error("KV pages: prefix index size mismatch");
}

uint64_t page_hash(uint64_t prev, const int32_t* tokens, int64_t n) {
    // FNV-1a over the previous key and the token ids, then a final mix
    // (splitmix64) so neighbouring chains spread over the table.
    uint64_t h = 1469598103934665603ull ^ prev;
    h *= 1099511628211ull;
    for (int64_t i = 0; i < n; ++i) {
        auto t = static_cast<uint32_t>(tokens[i]);
        for (int b = 0; b < 4; ++b) {
            h ^= (t >> (8 * b)) & 0xff;
            h *= 1099511628211ull;
        }
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

}  // namespace minfer::graph
