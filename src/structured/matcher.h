// Per-sequence grammar state over bytes, and the allowed-token mask over a
// vocabulary.
//
// Matcher: where one output stands in the grammar (a set of stacks, see
// compiled.h). It takes bytes, says whether the output so far is a complete
// sentence (so end-of-generation may be allowed only then), is a value that
// copies, rolls back a bounded number of accepted chunks, and serializes (a
// preempted sequence resumes from the bytes).
//
// TokenMasker: one per (grammar, vocabulary), shared by the sequences using
// that grammar. compute_mask fills the bitset of tokens whose whole byte
// string the matcher accepts. Per class of equivalent DFA nodes it caches,
// on first use, which tokens are accepted whatever the rules around the node
// are (the node's rule does not end inside the token) and which depend on
// them (the rule may end inside the token: the rest is checked against the
// actual stack below); the rest are rejected. It does so in two parts: the
// tokens of at most kShortTokenBytes bytes per CompiledGrammar::short_class
// (nodes that take every string of that length alike), the longer ones per
// node_class (nodes that take every string alike), so positions that differ
// only further on than a short token reaches (the counted positions of a
// bounded string) share the larger part. A mask is then the OR of cached
// bitsets plus a walk of the few context-dependent tokens. compute_mask and accept_token are
// safe to call from several threads at once (the cache is filled under a lock,
// read without one).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "structured/compiled.h"

namespace minfer::tokenizer {
class Tokenizer;
}

namespace minfer::structured {

class Matcher {
  public:
    // max_rollback: how many accepted chunks (tokens) rollback() can undo.
    explicit Matcher(std::shared_ptr<const CompiledGrammar> g, size_t max_rollback = 8);

    // Takes the bytes if the grammar allows all of them (one chunk for
    // rollback), else leaves the state as it was and returns false.
    bool accept_bytes(std::string_view bytes);
    // Undoes the last n accepted chunks (n <= n_rollback()).
    void rollback(size_t n);
    size_t n_rollback() const { return history_.size(); }

    // The output so far is a sentence of the grammar: it may end here.
    bool is_complete() const;
    // Some byte may still follow.
    bool can_continue() const;
    // After end of generation was accepted: nothing more is.
    bool is_terminated() const { return terminated_; }
    void terminate() { terminated_ = true; }

    const StackSet& stacks() const { return stacks_; }
    const CompiledGrammar& grammar() const { return *g_; }
    const std::shared_ptr<const CompiledGrammar>& grammar_ptr() const { return g_; }

    // The position as bytes (no rollback history); deserialize checks every
    // node id and stack and throws minfer::Error on data that is not a state
    // of this grammar.
    std::string serialize() const;
    static Matcher deserialize(std::shared_ptr<const CompiledGrammar> g, std::string_view data,
                               size_t max_rollback = 8);

  private:
    std::shared_ptr<const CompiledGrammar> g_;
    StackSet stacks_;
    std::vector<StackSet> history_;
    size_t max_rollback_;
    bool terminated_ = false;
};

// Tokens in byte order, for a walk over them that shares common prefixes.
struct SortedTokens {
    std::vector<int32_t> ids;
    // For each, the length of the prefix it shares with the one before.
    std::vector<uint32_t> shared_prefix;
    // The tokens' bytes back to back, in that order (token k of the order is
    // [begin[k], begin[k + 1])): a node's walk over the vocabulary reads them
    // in sequence instead of chasing each token's string around the heap,
    // which was most of its time.
    std::string bytes;
    std::vector<uint32_t> begin;  // [ids + 1]
    // For token k: the first later one sharing fewer than shared_prefix[k]
    // bytes with its predecessor (ids.size() if none). A walk that finds a
    // prefix dead jumps along it past every token that begins with that
    // prefix.
    std::vector<uint32_t> prefix_end;

    // The order of `ids` (tokens of `all_bytes`).
    static SortedTokens of(std::vector<int32_t> ids, const std::vector<std::string>& all_bytes);
    std::string_view token(size_t k) const {
        return std::string_view(bytes.data() + begin[k], begin[k + 1] - begin[k]);
    }
};

// A vocabulary as byte strings, sorted for the walks that share prefixes.
struct TokenVocab {
    std::vector<std::string> bytes;  // [n_vocab] raw bytes of each token
    std::vector<bool> special;       // [n_vocab] never allowed by a grammar
    std::vector<int32_t> eog_ids;    // allowed exactly when the output is complete
    // The non-special, non-empty tokens of at most kShortTokenBytes bytes
    // (compiled.h) and the longer ones, each in byte order: a node's mask is
    // built in these two parts, shared by different classes of nodes.
    SortedTokens short_tokens, long_tokens;
    size_t max_len = 0;

    int32_t n_vocab() const { return int32_t(bytes.size()); }

    // Builds the sorted order; `special` empty = none.
    static TokenVocab from_bytes(std::vector<std::string> bytes, std::vector<bool> special,
                                 std::vector<int32_t> eog_ids);
    // Token bytes as the detokenizer renders them; control, unknown and unused
    // tokens (<|im_end|>, ...) are special. User-defined tokens (<think>,
    // <tool_call>) are their text: the grammar allows them where it allows
    // those bytes.
    static TokenVocab from_tokenizer(const tokenizer::Tokenizer& tok);
};

// A bitset over the vocabulary: bit i of word i / 64.
struct TokenBitset {
    std::vector<uint64_t> words;
    void resize(int32_t n_vocab) { words.assign((size_t(n_vocab) + 63) / 64, 0); }
    void clear() { std::fill(words.begin(), words.end(), 0); }
    void set(int32_t i) { words[size_t(i) >> 6] |= uint64_t(1) << (i & 63); }
    bool test(int32_t i) const { return (words[size_t(i) >> 6] >> (i & 63)) & 1; }
    size_t count() const;
};

class TokenMasker {
  public:
    TokenMasker(std::shared_ptr<const CompiledGrammar> g, std::shared_ptr<const TokenVocab> vocab);
    ~TokenMasker();

    // Sets exactly the tokens the matcher accepts next (EOG ids when complete).
    void compute_mask(const Matcher& m, TokenBitset& out) const;
    // Takes the token's bytes (or end of generation when complete); false and
    // no change when the grammar does not allow it.
    bool accept_token(Matcher& m, int32_t id) const;

    // Fills the cache for every node (what first use would do, all at once).
    void warm_all() const;
    // Fills it on a thread of its own at the lowest CPU priority, nodes in
    // the order a parse reaches them from the start (breadth first), so a
    // sequence finds the nodes it reaches built instead of building them in
    // its mask; stops early when the masker is destroyed. Once.
    void start_warming();
    // The warming thread has built every node (false if never started).
    bool warmed() const { return warmed_.load(std::memory_order_acquire); }
    // Node masks built: one per short_class and one per node_class that has
    // bytes.
    size_t n_cached_masks() const;
    // Node masks built by compute_mask because they were not yet.
    size_t n_built_on_use() const { return built_on_use_.load(std::memory_order_relaxed); }

    const TokenVocab& vocab() const { return *vocab_; }

  private:
    struct NodeMask;
    // A node's mask comes in two parts: over the short tokens, shared by the
    // node's short_class, and over the long ones, shared by its node_class.
    struct Part {
        const SortedTokens* tokens;
        const std::vector<int32_t>* node_class;
        // [classes]: the part's mask of each class, once built
        std::unique_ptr<std::atomic<const NodeMask*>[]> cache;
        // The cache slot of the node's class.
        std::atomic<const NodeMask*>& slot(int32_t node) const {
            return cache[size_t((*node_class)[size_t(node)])];
        }
    };
    const NodeMask& node_mask(int32_t node, const Part& part) const;
    const NodeMask& cache_node_mask(int32_t node, const Part& part) const;
    // Builds the node's masks unless it has them (or has no byte edges).
    void build_if_missing(int32_t node) const;
    std::unique_ptr<NodeMask> build_node_mask(int32_t node, const SortedTokens& tokens) const;
    void warm_loop();

    std::shared_ptr<const CompiledGrammar> g_;
    std::shared_ptr<const TokenVocab> vocab_;
    Part parts_[2];  // short tokens, long tokens
    // [n_nodes] 1 where the node neither calls nor may end: a step onto it
    // keeps a single stack single (read on every byte of a node's walk).
    std::vector<uint8_t> simple_;
    mutable std::mutex mu_;
    mutable std::vector<std::unique_ptr<NodeMask>> owned_;
    mutable std::atomic<size_t> built_on_use_{0};
    std::atomic<bool> stop_warming_{false};
    std::atomic<bool> warmed_{false};
    std::thread warmer_;
};

}  // namespace minfer::structured
