#include "structured/constraint.h"

#include <chrono>

#include "structured/grammar.h"

namespace minfer::structured {

std::shared_ptr<const Constraint> compile_constraint(std::string gbnf,
                                                     std::shared_ptr<const TokenVocab> vocab,
                                                     Warm warm) {
    const auto t0 = std::chrono::steady_clock::now();
    auto c = std::make_shared<Constraint>();
    c->grammar = std::make_shared<const CompiledGrammar>(compile_grammar(parse_gbnf(gbnf)));
    auto masker = std::make_shared<TokenMasker>(c->grammar, std::move(vocab));
    if (warm == Warm::InBackground) masker->start_warming();
    c->masker = std::move(masker);
    c->gbnf = std::move(gbnf);
    c->compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return c;
}

ConstraintCache::ConstraintCache(std::shared_ptr<const TokenVocab> vocab, size_t capacity,
                                 Warm warm)
    : vocab_(std::move(vocab)), capacity_(capacity > 0 ? capacity : 1), warm_(warm) {}

std::shared_ptr<const Constraint> ConstraintCache::get(const std::string& gbnf, bool* hit) {
    {
        std::lock_guard lock(mu_);
        if (auto it = map_.find(gbnf); it != map_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second.pos);
            if (hit) *hit = true;
            return it->second.constraint;
        }
    }
    if (hit) *hit = false;
    // Compiled outside the lock: a slow grammar does not hold up the others.
    // Two requests racing on one new grammar both compile it; the first kept wins.
    auto c = compile_constraint(gbnf, vocab_, warm_);
    std::lock_guard lock(mu_);
    if (auto it = map_.find(gbnf); it != map_.end()) return it->second.constraint;
    lru_.push_front(gbnf);
    map_.emplace(gbnf, Entry{c, lru_.begin()});
    while (map_.size() > capacity_) {
        map_.erase(lru_.back());
        lru_.pop_back();
    }
    return c;
}

size_t ConstraintCache::size() const {
    std::lock_guard lock(mu_);
    return map_.size();
}

}  // namespace minfer::structured
