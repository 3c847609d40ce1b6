// A grammar ready to constrain sampling: compiled once, with its token masker
// over one vocabulary, shared (read-only) by every sequence that uses it.
// Each sequence keeps its own Matcher (matcher.h) as its position.
//
// ConstraintCache keeps constraints by grammar text, so the same schema sent
// by many requests is parsed, compiled and has its per-node masks warmed
// once; the masker's caches then serve every later request.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "structured/compiled.h"
#include "structured/matcher.h"

namespace minfer::structured {

struct Constraint {
    std::string gbnf;  // the grammar's source text (GBNF)
    std::shared_ptr<const CompiledGrammar> grammar;
    std::shared_ptr<const TokenMasker> masker;
    double compile_ms = 0.0;  // parse + compile (masks are filled on first use)
};

// How a new constraint's per-node masks get built: each on its first use by
// a mask, or also ahead of use by the masker's low-priority warming thread
// (TokenMasker::start_warming), so decoding finds them built.
enum class Warm { OnFirstUse, InBackground };

// Parses and compiles `gbnf` for `vocab`. Throws minfer::Error naming what is
// wrong with the grammar (line and column, the rule).
std::shared_ptr<const Constraint> compile_constraint(std::string gbnf,
                                                     std::shared_ptr<const TokenVocab> vocab,
                                                     Warm warm = Warm::OnFirstUse);

// Thread-safe; least recently used constraints are dropped past `capacity`
// (a sequence holding one keeps it alive).
class ConstraintCache {
  public:
    static constexpr size_t kDefaultCapacity = 64;
    explicit ConstraintCache(std::shared_ptr<const TokenVocab> vocab,
                             size_t capacity = kDefaultCapacity, Warm warm = Warm::OnFirstUse);
    // The constraint for `gbnf`, compiled on a miss (`hit` says which).
    // Throws as compile_constraint does; a failed grammar is not cached.
    std::shared_ptr<const Constraint> get(const std::string& gbnf, bool* hit = nullptr);
    const std::shared_ptr<const TokenVocab>& vocab() const { return vocab_; }
    size_t size() const;

  private:
    std::shared_ptr<const TokenVocab> vocab_;
    size_t capacity_;
    Warm warm_;
    mutable std::mutex mu_;
    std::list<std::string> lru_;  // most recent first
    struct Entry {
        std::shared_ptr<const Constraint> constraint;
        std::list<std::string>::iterator pos;
    };
    std::unordered_map<std::string, Entry> map_;
};

}  // namespace minfer::structured
