#include "structured/compiled.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "structured/chars_impl.h"
#include "util/error.h"

namespace minfer::structured {

namespace {

// A rule's NFA is copied into a caller only while small: an inlined copy costs
// states at every use, a call costs a stack push and masks that depend on
// the caller. The totals bound memory on grammars that nest big rules.
constexpr size_t kInlineMaxStates = 20000;
constexpr size_t kRuleMaxStates = 200000;
constexpr size_t kMaxDfaNodes = 200000;

struct Nfa {
    struct Edge {
        enum Kind : uint8_t { Eps, Byte, Call } kind;
        uint8_t lo = 0, hi = 0;
        int32_t rule = -1;
        int32_t to = -1;
    };
    std::vector<std::vector<Edge>> out;
    int32_t start = -1, end = -1;

    int32_t add() {
        out.emplace_back();
        return int32_t(out.size() - 1);
    }
    void eps(int32_t a, int32_t b) { out[a].push_back({Edge::Eps, 0, 0, -1, b}); }
    void byte(int32_t a, uint8_t lo, uint8_t hi, int32_t b) {
        out[a].push_back({Edge::Byte, lo, hi, -1, b});
    }
};

// UTF-8 encodings of the code points lo..hi as sequences of byte ranges
// (the split of Rust's utf8-ranges: each sequence's bytes range independently).
void utf8_sequences(uint32_t lo, uint32_t hi,
                    std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
    if (lo > hi) return;
    // Surrogates are not characters.
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
        if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
        return;
    }
    static const uint32_t kMaxOfLen[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int i = 0; i < 3; ++i) {
        if (lo <= kMaxOfLen[i] && hi > kMaxOfLen[i]) {
            utf8_sequences(lo, kMaxOfLen[i], out);
            utf8_sequences(kMaxOfLen[i] + 1, hi, out);
            return;
        }
    }
    if (hi <= 0x7F) {
        out.push_back({{uint8_t(lo), uint8_t(hi)}});
        return;
    }
    int n = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < n; ++i) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_sequences(lo, lo | m, out);
                utf8_sequences((lo | m) + 1, hi, out);
                return;
            }
            if ((hi & m) != m) {
                utf8_sequences(lo, (hi & ~m) - 1, out);
                utf8_sequences(hi & ~m, hi, out);
                return;
            }
        }
    }
    uint8_t a[4], b[4];
    // lo and hi have the same length, n (the splits above).
    encode_utf8(lo, a);
    encode_utf8(hi, b);
    std::vector<std::pair<uint8_t, uint8_t>> seq;
    for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
    out.push_back(std::move(seq));
}

class Compiler {
  public:
    explicit Compiler(const Grammar& g) : g_(g), nfas_(g.rules.size()), built_(g.rules.size()) {}

    CompiledGrammar run() {
        find_recursive_rules();
        // Build the root, then every rule some built NFA still calls.
        std::vector<int32_t> need = {g_.root};
        std::set<int32_t> seen = {g_.root};
        for (size_t i = 0; i < need.size(); ++i) {
            build(need[i]);
            for (const auto& edges : nfas_[need[i]].out)
                for (const auto& e : edges)
                    if (e.kind == Nfa::Edge::Call && seen.insert(e.rule).second)
                        need.push_back(e.rule);
        }
        compute_byte_classes(need);
        for (int32_t r : need) determinize(r);
        // Resolve call targets now that every rule's start node exists.
        for (auto& n : cg_.nodes)
            for (auto& c : n.calls) c.first = start_node_.at(c.first);
        cg_.root_start = start_node_.at(g_.root);
        for (const auto& r : g_.rules) cg_.rule_names.push_back(r.name);
        check_productive_and_not_left_recursive(need);
        return std::move(cg_);
    }

  private:
    void find_recursive_rules() {
        size_t n = g_.rules.size();
        refs_.assign(n, {});
        std::function<void(const Expr&, std::set<int32_t>&)> collect = [&](const Expr& e,
                                                                           std::set<int32_t>& out) {
            if (e.kind == Expr::Kind::RuleRef) out.insert(e.rule);
            for (const auto& c : e.children) collect(c, out);
        };
        for (size_t r = 0; r < n; ++r) collect(g_.rules[r].body, refs_[r]);
        recursive_.assign(n, false);
        for (size_t r = 0; r < n; ++r) {
            std::vector<int32_t> stack(refs_[r].begin(), refs_[r].end());
            std::vector<bool> seen(n, false);
            while (!stack.empty()) {
                int32_t x = stack.back();
                stack.pop_back();
                if (size_t(x) == r) {
                    recursive_[r] = true;
                    break;
                }
                if (seen[x]) continue;
                seen[x] = true;
                for (int32_t y : refs_[x]) stack.push_back(y);
            }
        }
    }

    void build(int32_t r) {
        if (built_[r]) return;
        built_[r] = true;
        Nfa& nfa = nfas_[r];
        nfa.start = nfa.add();
        nfa.end = nfa.add();
        emit(r, g_.rules[r].body, nfa.start, nfa.end);
    }

    // Adds `e` between states a and b of rule r's NFA.
    void emit(int32_t r, const Expr& e, int32_t a, int32_t b) {
        Nfa& nfa = nfas_[r];
        if (nfa.out.size() > kRuleMaxStates)
            throw Error("grammar: rule '" + g_.rules[r].name + "' expands to more than " +
                        std::to_string(kRuleMaxStates) +
                        " automaton states (lower its repetition bounds)");
        switch (e.kind) {
            case Expr::Kind::Seq: {
                int32_t cur = a;
                for (size_t i = 0; i < e.children.size(); ++i) {
                    int32_t nxt = i + 1 == e.children.size() ? b : nfas_[r].add();
                    emit(r, e.children[i], cur, nxt);
                    cur = nxt;
                }
                if (e.children.empty()) nfas_[r].eps(a, b);
                return;
            }
            case Expr::Kind::Alt:
                for (const auto& c : e.children) {
                    int32_t s = nfas_[r].add(), t = nfas_[r].add();
                    nfas_[r].eps(a, s);
                    emit(r, c, s, t);
                    nfas_[r].eps(t, b);
                }
                return;
            case Expr::Kind::Literal: {
                int32_t cur = a;
                for (size_t i = 0; i < e.bytes.size(); ++i) {
                    int32_t nxt = i + 1 == e.bytes.size() ? b : nfas_[r].add();
                    uint8_t c = uint8_t(e.bytes[i]);
                    nfas_[r].byte(cur, c, c, nxt);
                    cur = nxt;
                }
                if (e.bytes.empty()) nfas_[r].eps(a, b);
                return;
            }
            case Expr::Kind::Class: {
                std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
                for (const auto& [lo, hi] : e.ranges) utf8_sequences(lo, hi, seqs);
                // Sequences sharing a first byte range share its state, which
                // keeps the NFA (and the subset construction) small.
                for (const auto& seq : seqs) {
                    int32_t cur = a;
                    for (size_t i = 0; i < seq.size(); ++i) {
                        int32_t nxt = i + 1 == seq.size() ? b : nfas_[r].add();
                        nfas_[r].byte(cur, seq[i].first, seq[i].second, nxt);
                        cur = nxt;
                    }
                }
                return;
            }
            case Expr::Kind::RuleRef: {
                int32_t callee = e.rule;
                if (!recursive_[callee] && callee != r) {
                    build(callee);
                    const Nfa& c = nfas_[callee];
                    if (c.out.size() <= kInlineMaxStates &&
                        nfas_[r].out.size() + c.out.size() <= kRuleMaxStates) {
                        inline_copy(r, callee, a, b);
                        return;
                    }
                }
                nfas_[r].out[a].push_back({Nfa::Edge::Call, 0, 0, callee, b});
                return;
            }
            case Expr::Kind::Repeat: {
                const Expr& item = e.children[0];
                int32_t cur = a;
                for (int32_t i = 0; i < e.min; ++i) {
                    int32_t nxt = nfas_[r].add();
                    emit(r, item, cur, nxt);
                    cur = nxt;
                }
                if (e.max < 0) {
                    // cur -> item -> cur, cur -> b
                    int32_t s = nfas_[r].add();
                    emit(r, item, cur, s);
                    nfas_[r].eps(s, cur);
                    nfas_[r].eps(cur, b);
                } else {
                    // Nested optionals: each further copy may stop the run.
                    for (int32_t i = e.min; i < e.max; ++i) {
                        nfas_[r].eps(cur, b);
                        int32_t nxt = i + 1 == e.max ? b : nfas_[r].add();
                        emit(r, item, cur, nxt);
                        cur = nxt;
                    }
                    if (e.max == e.min) nfas_[r].eps(cur, b);
                }
                return;
            }
        }
    }

    void inline_copy(int32_t r, int32_t callee, int32_t a, int32_t b) {
        // Copy by value first: adding states to nfas_[r] may not invalidate it
        // (r != callee), but the copy keeps the loop simple.
        const Nfa& c = nfas_[callee];
        int32_t base = int32_t(nfas_[r].out.size());
        for (size_t i = 0; i < c.out.size(); ++i) nfas_[r].add();
        for (size_t i = 0; i < c.out.size(); ++i)
            for (Nfa::Edge e : c.out[i]) {
                e.to += base;
                nfas_[r].out[base + int32_t(i)].push_back(e);
            }
        nfas_[r].eps(a, base + c.start);
        nfas_[r].eps(base + c.end, b);
    }

    void compute_byte_classes(const std::vector<int32_t>& rules) {
        std::vector<bool> boundary(257, false);
        boundary[0] = true;
        for (int32_t r : rules)
            for (const auto& edges : nfas_[r].out)
                for (const auto& e : edges)
                    if (e.kind == Nfa::Edge::Byte) {
                        boundary[e.lo] = true;
                        boundary[e.hi + 1] = true;
                    }
        int32_t cls = -1;
        for (int b = 0; b < 256; ++b) {
            if (boundary[b]) ++cls;
            cg_.byte_class[b] = uint8_t(cls);
        }
        cg_.n_classes = cls + 1;
    }

    std::vector<int32_t> eps_closure(const Nfa& nfa, std::vector<int32_t> states) {
        std::vector<bool> in(nfa.out.size(), false);
        for (int32_t s : states) in[s] = true;
        for (size_t i = 0; i < states.size(); ++i)
            for (const auto& e : nfa.out[states[i]])
                if (e.kind == Nfa::Edge::Eps && !in[e.to]) {
                    in[e.to] = true;
                    states.push_back(e.to);
                }
        std::sort(states.begin(), states.end());
        return states;
    }

    void determinize(int32_t r) {
        const Nfa& nfa = nfas_[r];
        std::map<std::vector<int32_t>, int32_t> ids;
        std::vector<std::vector<int32_t>> work;
        auto node_of = [&](std::vector<int32_t> set) {
            auto it = ids.find(set);
            if (it != ids.end()) return it->second;
            if (cg_.nodes.size() >= kMaxDfaNodes)
                throw Error("grammar: the automaton exceeds " + std::to_string(kMaxDfaNodes) +
                            " states (at rule '" + g_.rules[r].name + "')");
            int32_t id = int32_t(cg_.nodes.size());
            cg_.nodes.push_back({});
            cg_.nodes.back().rule = r;
            cg_.next.resize(cg_.nodes.size() * size_t(cg_.n_classes), -1);
            ids.emplace(set, id);
            work.push_back(std::move(set));
            return id;
        };
        start_node_[r] = node_of(eps_closure(nfa, {nfa.start}));
        std::vector<std::vector<int32_t>> by_class(cg_.n_classes);
        while (!work.empty()) {
            std::vector<int32_t> set = std::move(work.back());
            work.pop_back();
            int32_t id = ids.at(set);
            for (auto& v : by_class) v.clear();
            std::map<int32_t, std::vector<int32_t>> by_callee;
            bool final = false;
            for (int32_t s : set) {
                if (s == nfa.end) final = true;
                for (const auto& e : nfa.out[s]) {
                    if (e.kind == Nfa::Edge::Byte) {
                        for (int c = cg_.byte_class[e.lo]; c <= cg_.byte_class[e.hi]; ++c)
                            by_class[c].push_back(e.to);
                    } else if (e.kind == Nfa::Edge::Call) {
                        by_callee[e.rule].push_back(e.to);
                    }
                }
            }
            cg_.nodes[id].final = final;
            for (int32_t c = 0; c < cg_.n_classes; ++c) {
                if (by_class[c].empty()) continue;
                int32_t to = node_of(eps_closure(nfa, by_class[c]));
                cg_.next[size_t(id) * size_t(cg_.n_classes) + size_t(c)] = to;
                cg_.nodes[id].has_bytes = true;
            }
            for (auto& [callee, targets] : by_callee) {
                int32_t to = node_of(eps_closure(nfa, targets));
                // The callee's start node is filled in once every rule is built.
                cg_.nodes[id].calls.push_back({callee, to});
            }
        }
    }

    void check_productive_and_not_left_recursive(const std::vector<int32_t>& rules) {
        std::map<int32_t, std::vector<int32_t>> nodes_of;
        for (size_t i = 0; i < cg_.nodes.size(); ++i)
            nodes_of[cg_.nodes[i].rule].push_back(int32_t(i));
        // Productive: some path from the start to a final node, through bytes
        // and calls of productive rules. Nullable: the same without bytes.
        std::map<int32_t, bool> productive, nullable;
        auto reaches_final = [&](int32_t r, bool bytes_ok, const std::map<int32_t, bool>& ok) {
            std::vector<int32_t> todo = {start_node_.at(r)};
            std::set<int32_t> seen(todo.begin(), todo.end());
            while (!todo.empty()) {
                int32_t n = todo.back();
                todo.pop_back();
                const auto& node = cg_.nodes[n];
                if (node.final) return true;
                auto push = [&](int32_t x) {
                    if (x >= 0 && seen.insert(x).second) todo.push_back(x);
                };
                if (bytes_ok)
                    for (int32_t c = 0; c < cg_.n_classes; ++c)
                        push(cg_.next[size_t(n) * size_t(cg_.n_classes) + size_t(c)]);
                for (const auto& [callee_start, ret] : node.calls)
                    if (ok.count(cg_.nodes[callee_start].rule) &&
                        ok.at(cg_.nodes[callee_start].rule))
                        push(ret);
            }
            return false;
        };
        for (auto* m : {&productive, &nullable}) {
            bool bytes_ok = m == &productive;
            for (bool changed = true; changed;) {
                changed = false;
                for (int32_t r : rules)
                    if (!(*m)[r] && reaches_final(r, bytes_ok, *m)) (*m)[r] = changed = true;
            }
        }
        for (int32_t r : rules)
            if (!productive[r])
                throw Error("grammar: rule '" + g_.rules[r].name +
                            "' can never finish (each of its alternatives recurses without end)");
        // Left calls: the callees reachable from a rule's start without a byte.
        std::map<int32_t, std::set<int32_t>> left;
        for (int32_t r : rules) {
            std::vector<int32_t> todo = {start_node_.at(r)};
            std::set<int32_t> seen(todo.begin(), todo.end());
            while (!todo.empty()) {
                int32_t n = todo.back();
                todo.pop_back();
                for (const auto& [callee_start, ret] : cg_.nodes[n].calls) {
                    int32_t callee = cg_.nodes[callee_start].rule;
                    left[r].insert(callee);
                    if (nullable[callee] && seen.insert(ret).second) todo.push_back(ret);
                }
            }
        }
        for (int32_t r : rules) {
            std::vector<int32_t> todo(left[r].begin(), left[r].end());
            std::set<int32_t> seen;
            while (!todo.empty()) {
                int32_t x = todo.back();
                todo.pop_back();
                if (x == r)
                    throw Error("grammar: rule '" + g_.rules[r].name +
                                "' is left-recursive (it can reach itself before reading a byte)");
                if (!seen.insert(x).second) continue;
                for (int32_t y : left[x]) todo.push_back(y);
            }
        }
    }

    const Grammar& g_;
    std::vector<Nfa> nfas_;
    std::vector<bool> built_;
    std::vector<std::set<int32_t>> refs_;
    std::vector<bool> recursive_;
    std::map<int32_t, int32_t> start_node_;
    CompiledGrammar cg_;
};

}  // namespace

CompiledGrammar compile_grammar(const Grammar& g) {
    CompiledGrammar cg = Compiler(g).run();
    cg.node_class = equivalent_node_classes(cg);
    for (int32_t c : cg.node_class) cg.n_node_classes = std::max(cg.n_node_classes, c + 1);
    cg.short_class = short_token_classes(cg, kShortTokenBytes);
    for (int32_t c : cg.short_class) cg.n_short_classes = std::max(cg.n_short_classes, c + 1);
    return cg;
}

namespace {

// The hash of a refinement signature.
struct SignatureHash {
    size_t operator()(const std::vector<int32_t>& v) const {
        uint64_t h = 0x9e3779b97f4a7c15ull;
        for (int32_t x : v) h = (h ^ uint32_t(x)) * 0x100000001b3ull;
        return size_t(h ^ (h >> 29));
    }
};

// Each node's (byte class, successor) edges, [edge_begin[i], edge_begin[i +
// 1]) for node i: most nodes take one or two of the classes.
struct NodeEdges {
    std::vector<std::pair<int32_t, int32_t>> edges;
    std::vector<size_t> begin;
    explicit NodeEdges(const CompiledGrammar& g) : begin(g.nodes.size() + 1, 0) {
        const size_t n_cls = size_t(g.n_classes);
        for (size_t i = 0; i < g.nodes.size(); ++i) {
            for (size_t c = 0; c < n_cls; ++c)
                if (const int32_t to = g.next[i * n_cls + c]; to >= 0)
                    edges.emplace_back(int32_t(c), to);
            begin[i + 1] = edges.size();
        }
    }
    // Appends node i's edges to sig, successors by cls, then a separator.
    void append(size_t i, const std::vector<int32_t>& cls, std::vector<int32_t>& sig) const {
        for (size_t e = begin[i]; e < begin[i + 1]; ++e)
            sig.insert(sig.end(), {edges[e].first, cls[size_t(edges[e].second)]});
        sig.push_back(-1);
    }
};

// Appends node's distinct (callee, resume) pairs by cls.
void append_calls(const CompiledGrammar::Node& node, const std::vector<int32_t>& cls,
                  std::vector<int32_t>& sig) {
    std::vector<std::pair<int32_t, int32_t>> calls;
    for (const auto& [callee, resume] : node.calls)
        calls.emplace_back(cls[size_t(callee)], cls[size_t(resume)]);
    std::sort(calls.begin(), calls.end());
    calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
    for (const auto& [a, b] : calls) sig.insert(sig.end(), {a, b});
}

}  // namespace

std::vector<int32_t> short_token_classes(const CompiledGrammar& g, int k) {
    MINFER_ASSERT(g.node_class.size() == g.nodes.size() && k >= 1);
    const size_t n = g.nodes.size();
    const NodeEdges edges(g);
    std::unordered_map<std::vector<int32_t>, int32_t, SignatureHash> ids;
    ids.reserve(n);
    std::vector<int32_t> cls(n), next_cls(n), sig;
    // Round 0: what a node does before any byte (may end, calls).
    for (size_t i = 0; i < n; ++i) {
        sig.assign({g.nodes[i].final ? 1 : 0});
        append_calls(g.nodes[i], g.node_class, sig);
        cls[i] = ids.try_emplace(sig, int32_t(ids.size())).first->second;
    }
    size_t n_parts = ids.size();
    // Round r: alike on every string of r bytes.
    for (int r = 1; r <= k; ++r) {
        ids.clear();
        for (size_t i = 0; i < n; ++i) {
            sig.assign({cls[i]});
            edges.append(i, cls, sig);
            next_cls[i] = ids.try_emplace(sig, int32_t(ids.size())).first->second;
        }
        std::swap(cls, next_cls);
        if (ids.size() == n_parts) break;  // stable: alike on strings of any length
        n_parts = ids.size();
    }
    return cls;
}

std::vector<int32_t> equivalent_node_classes(const CompiledGrammar& g) {
    const size_t n = g.nodes.size();
    std::vector<int32_t> cls(n, 0), next_cls(n);
    size_t n_parts = n > 0 ? 1 : 0;
    const NodeEdges edges(g);
    // Each round splits classes whose members differ in a signature over the
    // last round's classes; the partition only refines, so an unchanged
    // class count means it is stable.
    std::unordered_map<std::vector<int32_t>, int32_t, SignatureHash> ids;
    ids.reserve(n);
    std::vector<int32_t> sig;
    for (;;) {
        ids.clear();
        for (size_t i = 0; i < n; ++i) {
            sig.assign({cls[i], g.nodes[i].final ? 1 : 0});
            edges.append(i, cls, sig);
            append_calls(g.nodes[i], cls, sig);
            next_cls[i] = ids.try_emplace(sig, int32_t(ids.size())).first->second;
        }
        std::swap(cls, next_cls);
        if (ids.size() == n_parts) return cls;
        n_parts = ids.size();
    }
}

void close_stack(const CompiledGrammar& g, Stack s, StackSet& out) {
    // Explored stacks are remembered so that a loop through a rule that can
    // match nothing (x ::= (y)*, y nullable) returns to a known stack and stops.
    StackSet todo = {std::move(s)};
    StackSet seen;
    while (!todo.empty()) {
        Stack cur = std::move(todo.back());
        todo.pop_back();
        if (std::find(seen.begin(), seen.end(), cur) != seen.end()) continue;
        seen.push_back(cur);
        if (cur.empty()) {
            out.push_back(cur);
            continue;
        }
        const auto& node = g.nodes[cur.back()];
        if (node.has_bytes) out.push_back(cur);
        for (const auto& [callee_start, ret] : node.calls) {
            Stack c = cur;
            c.back() = ret;
            c.push_back(callee_start);
            todo.push_back(std::move(c));
        }
        if (node.final) {
            cur.pop_back();
            todo.push_back(std::move(cur));
        }
    }
}

void normalize_stacks(StackSet& s) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
}

StackSet initial_stacks(const CompiledGrammar& g) {
    StackSet out;
    close_stack(g, Stack{g.root_start}, out);
    normalize_stacks(out);
    return out;
}

bool advance_stacks(const CompiledGrammar& g, const StackSet& in, uint8_t byte, StackSet& out) {
    out.clear();
    size_t live = 0;
    for (const Stack& s : in) {
        if (s.empty()) continue;
        int32_t to = g.step(s.back(), byte);
        if (to < 0) continue;
        const auto& node = g.nodes[to];
        ++live;
        if (node.calls.empty() && !node.final) {
            // The common case: the rule goes on inside its DFA.
            out.push_back(s);
            out.back().back() = to;
        } else {
            Stack t = s;
            t.back() = to;
            close_stack(g, std::move(t), out);
        }
    }
    if (live > 1 || (live == 1 && out.size() > 1)) normalize_stacks(out);
    return !out.empty();
}

}  // namespace minfer::structured
