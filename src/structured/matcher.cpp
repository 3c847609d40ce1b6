#include "structured/matcher.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace minfer::structured {

// ---------------------------------------------------------------------------
// Matcher

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g, size_t max_rollback)
    : g_(std::move(g)), stacks_(initial_stacks(*g_)), max_rollback_(max_rollback) {}

bool Matcher::accept_bytes(std::string_view bytes) {
    if (terminated_) return false;
    StackSet cur = stacks_, nxt;
    for (char c : bytes) {
        if (!advance_stacks(*g_, cur, uint8_t(c), nxt)) return false;
        std::swap(cur, nxt);
    }
    if (max_rollback_ > 0) {
        if (history_.size() == max_rollback_) history_.erase(history_.begin());
        history_.push_back(std::move(stacks_));
    }
    stacks_ = std::move(cur);
    return true;
}

void Matcher::rollback(size_t n) {
    MINFER_ASSERT_MSG(n <= history_.size(), "rollback beyond the kept history");
    if (n == 0) return;
    stacks_ = std::move(history_[history_.size() - n]);
    history_.resize(history_.size() - n);
    terminated_ = false;
}

bool Matcher::is_complete() const {
    return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool Matcher::can_continue() const {
    return !terminated_ &&
           std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return !s.empty(); });
}

namespace {

constexpr char kStateMagic[4] = {'M', 'S', 'M', '1'};

void put_u32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out += char((v >> (8 * i)) & 0xFF);
}

struct Reader {
    std::string_view d;
    size_t pos = 0;
    uint32_t u32() {
        if (pos + 4 > d.size()) throw Error("grammar state: data ends early");
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(d[pos + size_t(i)])) << (8 * i);
        pos += 4;
        return v;
    }
};

}  // namespace

std::string Matcher::serialize() const {
    std::string out(kStateMagic, 4);
    out += char(terminated_ ? 1 : 0);
    put_u32(out, uint32_t(stacks_.size()));
    for (const Stack& s : stacks_) {
        put_u32(out, uint32_t(s.size()));
        for (int32_t n : s) put_u32(out, uint32_t(n));
    }
    return out;
}

Matcher Matcher::deserialize(std::shared_ptr<const CompiledGrammar> g, std::string_view data,
                             size_t max_rollback) {
    if (data.size() < 5 || data.substr(0, 4) != std::string_view(kStateMagic, 4))
        throw Error("grammar state: not a serialized matcher state (bad magic)");
    Matcher m(g, max_rollback);
    m.terminated_ = data[4] != 0;
    Reader r{data, 5};
    uint32_t n_stacks = r.u32();
    if (n_stacks > data.size()) throw Error("grammar state: stack count out of range");
    StackSet stacks;
    for (uint32_t i = 0; i < n_stacks; ++i) {
        uint32_t depth = r.u32();
        if (depth > data.size()) throw Error("grammar state: stack depth out of range");
        Stack s;
        for (uint32_t k = 0; k < depth; ++k) {
            uint32_t n = r.u32();
            if (n >= g->nodes.size())
                throw Error("grammar state: node " + std::to_string(n) +
                            " is not a node of this grammar");
            s.push_back(int32_t(n));
        }
        if (!s.empty() && !g->nodes[s.back()].has_bytes)
            throw Error("grammar state: a stack's top node takes no byte");
        stacks.push_back(std::move(s));
    }
    if (r.pos != data.size()) throw Error("grammar state: trailing bytes");
    normalize_stacks(stacks);
    m.stacks_ = std::move(stacks);
    return m;
}

// ---------------------------------------------------------------------------
// TokenVocab

TokenVocab TokenVocab::from_bytes(std::vector<std::string> bytes, std::vector<bool> special,
                                  std::vector<int32_t> eog_ids) {
    TokenVocab v;
    v.bytes = std::move(bytes);
    v.special = special.empty() ? std::vector<bool>(v.bytes.size(), false) : std::move(special);
    if (v.special.size() != v.bytes.size())
        throw Error("token vocabulary: " + std::to_string(v.special.size()) +
                    " special flags for " + std::to_string(v.bytes.size()) + " tokens");
    for (int32_t id : eog_ids)
        if (id < 0 || id >= v.n_vocab())
            throw Error("token vocabulary: end-of-generation id " + std::to_string(id) +
                        " out of range");
    v.eog_ids = std::move(eog_ids);
    std::vector<int32_t> short_ids, long_ids;
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
        bool eog = std::find(v.eog_ids.begin(), v.eog_ids.end(), id) != v.eog_ids.end();
        if (v.special[id] || eog || v.bytes[id].empty()) continue;
        (v.bytes[id].size() <= size_t(kShortTokenBytes) ? short_ids : long_ids).push_back(id);
        v.max_len = std::max(v.max_len, v.bytes[id].size());
    }
    v.short_tokens = SortedTokens::of(std::move(short_ids), v.bytes);
    v.long_tokens = SortedTokens::of(std::move(long_ids), v.bytes);
    return v;
}

SortedTokens SortedTokens::of(std::vector<int32_t> ids, const std::vector<std::string>& all_bytes) {
    SortedTokens v;
    v.ids = std::move(ids);
    std::sort(v.ids.begin(), v.ids.end(),
              [&](int32_t a, int32_t b) { return all_bytes[a] < all_bytes[b]; });
    v.shared_prefix.resize(v.ids.size(), 0);
    v.begin.reserve(v.ids.size() + 1);
    for (size_t i = 0; i < v.ids.size(); ++i) {
        const std::string& t = all_bytes[v.ids[i]];
        v.begin.push_back(uint32_t(v.bytes.size()));
        v.bytes += t;
        if (i == 0) continue;
        const std::string& p = all_bytes[v.ids[i - 1]];
        size_t k = 0;
        while (k < t.size() && k < p.size() && t[k] == p[k]) ++k;
        v.shared_prefix[i] = uint32_t(k);
    }
    if (v.bytes.size() > UINT32_MAX)
        throw Error("token vocabulary: more than 4 GiB of token bytes");
    v.begin.push_back(uint32_t(v.bytes.size()));
    // prefix_end by a stack of the tokens still waiting for a smaller
    // shared_prefix (their shared_prefix ascends from bottom to top).
    const size_t n = v.ids.size();
    v.prefix_end.assign(n, uint32_t(n));
    std::vector<uint32_t> waiting;
    for (size_t k = 0; k < n; ++k) {
        while (!waiting.empty() && v.shared_prefix[waiting.back()] > v.shared_prefix[k]) {
            v.prefix_end[waiting.back()] = uint32_t(k);
            waiting.pop_back();
        }
        waiting.push_back(uint32_t(k));
    }
    return v;
}

TokenVocab TokenVocab::from_tokenizer(const tokenizer::Tokenizer& tok) {
    std::vector<std::string> bytes(size_t(tok.n_vocab()));
    std::vector<bool> special(bytes.size(), false);
    const uint32_t kNever =
        tokenizer::kAttrControl | tokenizer::kAttrUnknown | tokenizer::kAttrUnused;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
        special[id] = (tok.token_attr(id) & kNever) != 0;
        if (!special[id]) bytes[id] = tok.token_to_piece(id, false);
    }
    return from_bytes(std::move(bytes), std::move(special), tok.eog_ids());
}

size_t TokenBitset::count() const {
    size_t n = 0;
    for (uint64_t w : words) n += size_t(__builtin_popcountll(w));
    return n;
}

// ---------------------------------------------------------------------------
// TokenMasker

struct TokenMasker::NodeMask {
    // Accepted whatever lies below the node on the stack: a bitset when many,
    // else a list (most structural positions allow a handful of tokens).
    std::vector<uint64_t> accepted_bits;
    std::vector<int32_t> accepted_ids;
    // Tokens the node's rule may finish inside: at each of their pop offsets
    // the rest of the token must be taken by the stack below.
    std::vector<int32_t> uncertain_ids;
    std::vector<uint32_t> uncertain_begin;  // [uncertain + 1] into pop_offsets
    std::vector<uint16_t> pop_offsets;
};

TokenMasker::TokenMasker(std::shared_ptr<const CompiledGrammar> g,
                         std::shared_ptr<const TokenVocab> vocab)
    : g_(std::move(g)), vocab_(std::move(vocab)) {
    if (vocab_->max_len > 65535)
        throw Error("token vocabulary: a token is longer than 65535 bytes");
    MINFER_ASSERT_MSG(
        g_->node_class.size() == g_->nodes.size() && g_->short_class.size() == g_->nodes.size(),
        "TokenMasker: the grammar's node classes (compile_grammar) are missing");
    auto part = [](const SortedTokens& tokens, const std::vector<int32_t>& node_class,
                   int32_t n_classes) {
        Part p{&tokens, &node_class,
               std::make_unique<std::atomic<const NodeMask*>[]>(size_t(n_classes))};
        for (int32_t i = 0; i < n_classes; ++i) p.cache[i].store(nullptr);
        return p;
    };
    parts_[0] = part(vocab_->short_tokens, g_->short_class, g_->n_short_classes);
    parts_[1] = part(vocab_->long_tokens, g_->node_class, g_->n_node_classes);
    simple_.reserve(g_->nodes.size());
    for (const auto& n : g_->nodes) simple_.push_back(n.calls.empty() && !n.final ? 1 : 0);
}

TokenMasker::~TokenMasker() {
    stop_warming_.store(true, std::memory_order_relaxed);
    if (warmer_.joinable()) warmer_.join();
}

const TokenMasker::NodeMask& TokenMasker::node_mask(int32_t node, const Part& part) const {
    const NodeMask* m = part.slot(node).load(std::memory_order_acquire);
    if (m) return *m;
    built_on_use_.fetch_add(1, std::memory_order_relaxed);
    return cache_node_mask(node, part);
}

const TokenMasker::NodeMask& TokenMasker::cache_node_mask(int32_t node, const Part& part) const {
    auto built = build_node_mask(node, *part.tokens);
    std::atomic<const NodeMask*>& slot = part.slot(node);
    std::lock_guard<std::mutex> lock(mu_);
    const NodeMask* m = slot.load(std::memory_order_acquire);
    if (m) return *m;  // another thread built it (or an equivalent node's) first
    owned_.push_back(std::move(built));
    slot.store(owned_.back().get(), std::memory_order_release);
    return *owned_.back();
}

void TokenMasker::build_if_missing(int32_t node) const {
    if (!g_->nodes[size_t(node)].has_bytes) return;
    for (const Part& part : parts_)
        if (!part.slot(node).load(std::memory_order_acquire)) cache_node_mask(node, part);
}

void TokenMasker::warm_all() const {
    for (size_t n = 0; n < g_->nodes.size(); ++n) build_if_missing(int32_t(n));
}

void TokenMasker::start_warming() {
    if (warmer_.joinable()) return;
    warmer_ = std::thread([this] { warm_loop(); });
}

void TokenMasker::warm_loop() {
    // Warming must not take CPU from the forward pass: SCHED_IDLE runs this
    // thread only on a core nothing else wants and gives the core up at once
    // when a pool thread wakes (nice 19 alone still shares a core for up to a
    // scheduler slice). Where SCHED_IDLE is refused, nice 19 for this thread
    // only (Linux: a thread id is a process id to setpriority).
    sched_param idle{};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) != 0)
        setpriority(PRIO_PROCESS, pid_t(syscall(SYS_gettid)), 19);
    const CompiledGrammar& g = *g_;
    const size_t n_nodes = g.nodes.size();
    std::vector<int32_t> order;
    std::vector<bool> seen(n_nodes, false);
    auto reach = [&](int32_t n) {
        if (n >= 0 && !seen[size_t(n)]) {
            seen[size_t(n)] = true;
            order.push_back(n);
        }
    };
    reach(g.root_start);
    for (size_t k = 0; k < order.size(); ++k) {
        const int32_t n = order[k];
        for (const auto& [callee, resume] : g.nodes[size_t(n)].calls) {
            reach(callee);
            reach(resume);
        }
        for (int32_t c = 0; c < g.n_classes; ++c)
            reach(g.next[size_t(n) * size_t(g.n_classes) + size_t(c)]);
    }
    for (size_t n = 0; n < n_nodes; ++n) reach(int32_t(n));  // any not reached from the start
    for (int32_t n : order) {
        if (stop_warming_.load(std::memory_order_relaxed)) return;
        build_if_missing(n);
    }
    warmed_.store(true, std::memory_order_release);
}

size_t TokenMasker::n_cached_masks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return owned_.size();
}

namespace {

// advance_stacks, reusing `out`'s storage for the common single-stack step.
bool step_into(const CompiledGrammar& g, const StackSet& in, uint8_t byte, StackSet& out) {
    if (in.size() == 1 && !in[0].empty()) {
        int32_t to = g.step(in[0].back(), byte);
        if (to < 0) {
            out.clear();
            return false;
        }
        const auto& node = g.nodes[to];
        if (node.calls.empty() && !node.final) {
            out.resize(1);
            out[0].assign(in[0].begin(), in[0].end());
            out[0].back() = to;
            return true;
        }
    }
    return advance_stacks(g, in, byte, out);
}

// Per-thread scratch for compute_mask's shared first steps (256 stack sets
// whose storage is reused from call to call).
std::array<StackSet, 256>& scratch_first_step() {
    thread_local std::array<StackSet, 256> scratch;
    return scratch;
}

bool has_empty(const StackSet& s) {
    return !s.empty() && s.front().empty();
}  // sorted: [] first

}  // namespace

std::unique_ptr<TokenMasker::NodeMask> TokenMasker::build_node_mask(int32_t node,
                                                                    const SortedTokens& v) const {
    const CompiledGrammar& g = *g_;
    auto nm = std::make_unique<NodeMask>();
    std::vector<int32_t> accepted;
    // level[d]: the positions after the first d bytes of the current token,
    // starting from the node alone (its rule at the bottom: an empty stack
    // means that rule returned). Levels 0..valid hold for the current prefix.
    // While the walk stays inside the node's rule on nodes that neither call
    // nor may end, a level is the one stack {top[d]}: kept as that id
    // (top[d] >= 0) without building the set, which is most of every walk.
    const size_t max_len = vocab_->max_len;
    std::vector<StackSet> level(max_len + 1);
    std::vector<int32_t> top(max_len + 1, -1);
    std::vector<uint8_t> popped(max_len + 1, 0);
    top[0] = node;
    StackSet one(1);
    auto step_level = [&](size_t d, uint8_t byte) {
        if (top[d] >= 0) {
            const int32_t to = g.step(top[d], byte);
            if (to < 0) return false;
            if (simple_[size_t(to)]) {
                top[d + 1] = to;
                popped[d + 1] = 0;
                return true;
            }
            one[0].assign(1, top[d]);
            top[d + 1] = -1;
            if (!advance_stacks(g, one, byte, level[d + 1])) return false;
        } else {
            top[d + 1] = -1;
            if (!step_into(g, level[d], byte, level[d + 1])) return false;
        }
        popped[d + 1] = has_empty(level[d + 1]);
        return true;
    };
    size_t valid = 0;
    std::vector<uint16_t> offsets;
    const size_t n_sorted = v.ids.size();
    for (size_t i = 0; i < n_sorted;) {
        const int32_t id = v.ids[i];
        const std::string_view t = v.token(i);
        size_t d = v.shared_prefix[i];
        if (d > valid) {
            d = valid;  // the first valid + 1 bytes are the prefix that died
        } else {
            while (d < t.size() && step_level(d, uint8_t(t[d]))) ++d;
            valid = d;
            if (d == t.size()) {
                accepted.push_back(id);
                ++i;
                continue;
            }
        }
        offsets.clear();
        for (size_t k = 1; k <= d; ++k)
            if (popped[k]) offsets.push_back(uint16_t(k));
        if (offsets.empty()) {
            // Rejected, and so is every later token beginning with the same
            // d + 1 bytes (they die at the same byte with the same levels).
            size_t j = i + 1;
            while (j < n_sorted && v.shared_prefix[j] > d) j = v.prefix_end[j];
            i = j;
            continue;
        }
        nm->uncertain_ids.push_back(id);
        nm->uncertain_begin.push_back(uint32_t(nm->pop_offsets.size()));
        nm->pop_offsets.insert(nm->pop_offsets.end(), offsets.begin(), offsets.end());
        ++i;
    }
    nm->uncertain_begin.push_back(uint32_t(nm->pop_offsets.size()));
    if (accepted.size() * 32 > size_t(vocab_->n_vocab())) {
        TokenBitset bits;
        bits.resize(vocab_->n_vocab());
        for (int32_t id : accepted) bits.set(id);
        nm->accepted_bits = std::move(bits.words);
    } else {
        nm->accepted_ids = std::move(accepted);
    }
    return nm;
}

void TokenMasker::compute_mask(const Matcher& m, TokenBitset& out) const {
    const TokenVocab& v = *vocab_;
    out.resize(v.n_vocab());
    if (m.is_terminated()) return;
    StackSet below, cur, nxt;
    for (const Stack& s : m.stacks()) {
        if (s.empty()) continue;
        const NodeMask* nm[2] = {&node_mask(s.back(), parts_[0]), &node_mask(s.back(), parts_[1])};
        for (const NodeMask* p : nm) {
            if (!p->accepted_bits.empty()) {
                for (size_t w = 0; w < out.words.size(); ++w) out.words[w] |= p->accepted_bits[w];
            } else {
                for (int32_t id : p->accepted_ids) out.set(id);
            }
        }
        if (s.size() == 1) continue;  // the root ends: nothing follows
        if (nm[0]->uncertain_ids.empty() && nm[1]->uncertain_ids.empty()) continue;
        below.clear();
        close_stack(*g_, Stack(s.begin(), s.end() - 1), below);
        normalize_stacks(below);
        // The bytes the stack below can take first: most context-dependent
        // tokens go on with a byte it refuses, found without a walk.
        // Each first byte's step from below is taken once and shared (it
        // usually returns from rules: a closure worth not repeating).
        std::array<bool, 256> first_ok{};
        for (const Stack& b : below)
            if (!b.empty())
                for (int byte = 0; byte < 256; ++byte)
                    if (g_->step(b.back(), uint8_t(byte)) >= 0) first_ok[byte] = true;
        std::array<int8_t, 256> first_done{};
        std::array<StackSet, 256>& first_step = scratch_first_step();
        for (const NodeMask* p : nm)
            for (size_t u = 0; u < p->uncertain_ids.size(); ++u) {
                const int32_t id = p->uncertain_ids[u];
                if (out.test(id)) continue;
                const std::string& t = v.bytes[id];
                for (uint32_t k = p->uncertain_begin[u]; k < p->uncertain_begin[u + 1]; ++k) {
                    const uint8_t first = uint8_t(t[p->pop_offsets[k]]);
                    if (!first_ok[first]) continue;
                    if (!first_done[first]) {
                        first_done[first] = 1;
                        advance_stacks(*g_, below, first, first_step[first]);
                    }
                    bool ok = !first_step[first].empty();
                    const StackSet* from = &first_step[first];
                    for (size_t b = p->pop_offsets[k] + 1; b < t.size() && ok; ++b) {
                        ok = step_into(*g_, *from, uint8_t(t[b]), nxt);
                        std::swap(cur, nxt);
                        from = &cur;
                    }
                    if (ok) {
                        out.set(id);
                        break;
                    }
                }
            }
    }
    if (m.is_complete())
        for (int32_t id : v.eog_ids) out.set(id);
}

bool TokenMasker::accept_token(Matcher& m, int32_t id) const {
    const TokenVocab& v = *vocab_;
    if (id < 0 || id >= v.n_vocab() || m.is_terminated()) return false;
    if (std::find(v.eog_ids.begin(), v.eog_ids.end(), id) != v.eog_ids.end()) {
        if (!m.is_complete()) return false;
        m.terminate();
        return true;
    }
    if (v.special[id] || v.bytes[id].empty()) return false;
    return m.accept_bytes(v.bytes[id]);
}

}  // namespace minfer::structured
