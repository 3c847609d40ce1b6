#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "util/error.h"

namespace minfer::tokenizer {

namespace {

// Open-addressing hash map from a (left, right) symbol pair to the merge's
// rank and resulting symbol; the BPE inner loop does one lookup per pair.
class PairMap {
  public:
    struct Entry {
        uint64_t key;
        int32_t rank;
        int32_t result;
    };
    void build(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap <<= 1;
        slots_.assign(cap, Entry{kEmpty, 0, 0});
        mask_ = cap - 1;
    }
    // Keeps the first (lowest-rank) entry for a key, like llama.cpp's emplace.
    void insert(uint64_t key, int32_t rank, int32_t result) {
        size_t i = hash(key) & mask_;
        while (slots_[i].key != kEmpty) {
            if (slots_[i].key == key) return;
            i = (i + 1) & mask_;
        }
        slots_[i] = Entry{key, rank, result};
    }
    const Entry* find(uint64_t key) const {
        size_t i = hash(key) & mask_;
        while (true) {
            const Entry& e = slots_[i];
            if (e.key == key) return &e;
            if (e.key == kEmpty) return nullptr;
            i = (i + 1) & mask_;
        }
    }
    static uint64_t make_key(int32_t a, int32_t b) {
        return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    }

  private:
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    static size_t hash(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        return size_t(k);
    }
    std::vector<Entry> slots_;
    size_t mask_ = 0;
};

const char* const kQwen2Pre[] = {"qwen2",     "deepseek-r1-qwen", "kormo",      "f2llmv2", "megrez",
                                 "stablelm2", "hunyuan",          "solar-open", "grok-2"};

}  // namespace

bool is_supported_pre_tokenizer(const std::string& pre) {
    for (const char* p : kQwen2Pre)
        if (pre == p) return true;
    return false;
}

struct Tokenizer::Impl {
    Vocab vocab;
    int32_t n_vocab = 0;
    std::vector<uint32_t> attrs;      // [n_vocab]
    std::vector<std::string> pieces;  // [n_vocab] token_to_piece(id, special=true)
    std::unordered_map<std::string_view, int32_t> text_to_id;  // views into vocab.tokens
    // BPE symbols: ids < n_vocab are tokens; larger ids are strings that occur
    // in merges but are not tokens (kept so that odd vocabularies still merge
    // exactly as llama.cpp does).
    std::vector<std::string> extra_texts;
    std::vector<std::vector<int32_t>> extra_fallback;  // ids llama.cpp emits for such a symbol
    std::unordered_map<std::string, int32_t> extra_ids;
    int32_t byte_sym[256] = {};
    PairMap merges;
    std::vector<int32_t> specials;  // CONTROL|USER_DEFINED|UNKNOWN, longest text first
    std::vector<int32_t> eog;       // sorted
    int32_t eot = -1, eom = -1;

    int32_t intern(const std::string& s) {
        auto it = text_to_id.find(std::string_view(s));
        if (it != text_to_id.end()) return it->second;
        auto jt = extra_ids.find(s);
        if (jt != extra_ids.end()) return jt->second;
        const int32_t id = n_vocab + int32_t(extra_texts.size());
        extra_texts.push_back(s);
        extra_ids.emplace(s, id);
        // llama.cpp: a final symbol that is not a token is emitted byte by byte,
        // each byte looked up as a one-byte token text (missing ones dropped).
        std::vector<int32_t> fb;
        for (char ch : s) {
            auto kt = text_to_id.find(std::string_view(&ch, 1));
            if (kt != text_to_id.end()) fb.push_back(kt->second);
        }
        extra_fallback.push_back(std::move(fb));
        return id;
    }

    void emit_symbol(int32_t sym, std::vector<int32_t>& out) const {
        if (sym < n_vocab) {
            out.push_back(sym);
        } else {
            const auto& fb = extra_fallback[size_t(sym - n_vocab)];
            out.insert(out.end(), fb.begin(), fb.end());
        }
    }

    void build();
    void bpe_word(std::string_view word, std::vector<int32_t>& out, struct Scratch& s) const;
    void encode_fragment(std::string_view text, std::vector<int32_t>& out, struct Scratch& s) const;
};

struct Scratch {
    // pre-tokenizer
    std::vector<uint32_t> cpts;
    std::vector<uint8_t> cls;
    std::vector<uint32_t> offs;  // byte offset of each code point in `norm`, plus the end
    std::vector<uint32_t> ends;
    std::string norm;
    // BPE
    struct Sym {
        int32_t id;
        int32_t prev, next;
    };
    struct Bigram {
        int32_t rank, left, right, left_id, right_id;
    };
    std::vector<Sym> syms;
    std::vector<Bigram> heap;
    // word cache: word bytes -> [offset, length) in cache_ids
    std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
    std::vector<int32_t> cache_ids;
    std::deque<std::string> owned_words;  // keeps cached keys of re-encoded text alive
};

void Tokenizer::Impl::build() {
    const size_t n = vocab.tokens.size();
    if (n == 0) throw Error("tokenizer: the vocabulary is empty (tokenizer.ggml.tokens)");
    if (n >= size_t(INT32_MAX) / 2) throw Error("tokenizer: vocabulary too large");
    if (vocab.model != "gpt2")
        throw Error("tokenizer: unsupported tokenizer model '" + vocab.model +
                    "' (tokenizer.ggml.model; only \"gpt2\" byte-level BPE is supported)");
    if (!is_supported_pre_tokenizer(vocab.pre))
        throw Error("tokenizer: unsupported pre-tokenizer '" + vocab.pre +
                    "' (tokenizer.ggml.pre; supported: qwen2 and the names llama.cpp maps to "
                    "its regex)");
    if (!vocab.token_types.empty() && vocab.token_types.size() != n)
        throw Error("tokenizer: tokenizer.ggml.token_type has " +
                    std::to_string(vocab.token_types.size()) + " entries for " + std::to_string(n) +
                    " tokens");
    n_vocab = int32_t(n);
    for (size_t i = 0; i < n; ++i) {
        // llama.cpp renames empty tokens so that they can be looked up.
        if (vocab.tokens[i].empty()) vocab.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
    }
    text_to_id.reserve(n * 2);
    for (size_t i = 0; i < n; ++i) {
        auto [it, inserted] = text_to_id.emplace(std::string_view(vocab.tokens[i]), int32_t(i));
        if (!inserted)
            throw Error("tokenizer: duplicate token '" + vocab.tokens[i] + "' (ids " +
                        std::to_string(it->second) + " and " + std::to_string(i) + ")");
    }

    attrs.assign(n, kAttrNormal);
    if (!vocab.token_types.empty()) {
        for (size_t i = 0; i < n; ++i) {
            switch (TokenType(vocab.token_types[i])) {
                case TokenType::Normal:
                    attrs[i] = kAttrNormal;
                    break;
                case TokenType::Unknown:
                    attrs[i] = kAttrUnknown;
                    break;
                case TokenType::Control:
                    attrs[i] = kAttrControl;
                    break;
                case TokenType::UserDefined:
                    attrs[i] = kAttrUserDefined;
                    break;
                case TokenType::Unused:
                    attrs[i] = kAttrUnused;
                    break;
                case TokenType::Byte:
                    attrs[i] = kAttrByte;
                    break;
                default:
                    attrs[i] = kAttrUndefined;
                    break;
            }
        }
    }
    auto check_id = [&](int32_t& id, const char* key) {
        if (id >= n_vocab) id = -1;  // llama.cpp ignores out-of-range special ids
        (void)key;
        if (id < -1) id = -1;
    };
    check_id(vocab.bos_id, "bos");
    check_id(vocab.eos_id, "eos");
    check_id(vocab.eot_id, "eot");
    check_id(vocab.eom_id, "eom");
    check_id(vocab.pad_id, "pad");
    if (vocab.add_bos && vocab.bos_id < 0)
        throw Error("tokenizer: tokenizer.ggml.add_bos_token is true, but bos_token_id is not set");
    if (vocab.add_eos && vocab.eos_id < 0)
        throw Error("tokenizer: tokenizer.ggml.add_eos_token is true, but eos_token_id is not set");

    // llama.cpp's fix-ups by token text (llama_vocab::impl::load): EOT, EOM and
    // FIM tokens found by name become CONTROL; EOG is a set of names plus
    // eos/eot/eom and the FIM pad/repo/sep tokens.
    auto has = [&](const char* t) -> int32_t {
        auto it = text_to_id.find(std::string_view(t));
        return it == text_to_id.end() ? -1 : it->second;
    };
    auto first_of = [&](std::initializer_list<const char*> names) -> int32_t {
        for (const char* nm : names) {
            int32_t id = has(nm);
            if (id >= 0) return id;
        }
        return -1;
    };
    auto make_control = [&](int32_t id) {
        if (id >= 0) attrs[size_t(id)] |= kAttrControl;
    };
    eot = vocab.eot_id;
    eom = vocab.eom_id;
    if (eot < 0) {
        eot = first_of({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                        "<\xEF\xBD\x9C"
                        "end\xE2\x96\x81"
                        "of\xE2\x96\x81"
                        "sentence\xEF\xBD\x9C>",
                        "<end_of_utterance>"});
        make_control(eot);
    }
    if (eom < 0) {
        eom = has("<|eom_id|>");
        make_control(eom);
    }
    const int32_t fim_pre = first_of({"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>",
                                      "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
    const int32_t fim_suf = first_of({"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>",
                                      "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
    const int32_t fim_mid = first_of({"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>",
                                      "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
    const int32_t fim_pad = first_of({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
    const int32_t fim_rep =
        first_of({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
    const int32_t fim_sep = has("<|file_sep|>");
    for (int32_t id : {fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep}) make_control(id);
    for (size_t i = 0; i < n; ++i) {
        if ((attrs[i] & kAttrControl) && vocab.tokens[i].find("unused") != std::string::npos)
            attrs[i] |= kAttrUnused;
    }
    std::vector<int32_t> eog_set;
    for (int32_t id : {fim_pad, fim_rep, fim_sep}) eog_set.push_back(id);
    for (const char* nm : {"<|eot_id|>",
                           "<|im_end|>",
                           "<|end|>",
                           "<|return|>",
                           "<|call|>",
                           "<|flush|>",
                           "<|calls|>",
                           "<end_of_turn>",
                           "<|endoftext|>",
                           "</s>",
                           "<|eom_id|>",
                           "<EOT>",
                           "_<EOT>",
                           "[EOT]",
                           "[EOS]",
                           "<|end_of_text|>",
                           "<end_of_utterance>",
                           "<eos>",
                           "<turn|>",
                           "<|tool_response>"}) {
        const int32_t id = has(nm);
        make_control(id);
        eog_set.push_back(id);
    }
    eog_set.push_back(vocab.eos_id);
    eog_set.push_back(eot);
    eog_set.push_back(eom);
    for (int32_t id : eog_set)
        if (id >= 0) eog.push_back(id);
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

    // Special-token partition order: longest text first (llama.cpp sorts by
    // length only; equal lengths keep id order here).
    for (int32_t id = 0; id < n_vocab; ++id)
        if (attrs[size_t(id)] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
            specials.push_back(id);
    std::stable_sort(specials.begin(), specials.end(), [&](int32_t a, int32_t b) {
        return vocab.tokens[size_t(a)].size() > vocab.tokens[size_t(b)].size();
    });

    // Pieces (llama.cpp's token_to_piece cache, special = true).
    pieces.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const uint32_t a = attrs[i];
        const std::string& t = vocab.tokens[i];
        if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
            pieces[i] = t;
        } else if (a & kAttrNormal) {
            std::string out;
            size_t pos = 0;
            while (pos < t.size()) {
                const size_t start = pos;
                const uint32_t c = utf8_decode_llama(t, &pos);
                const int b = gpt2_cpt_to_byte(c);
                if (b >= 0) {
                    out.push_back(char(b));
                } else {
                    // llama_decode_text's marker for a code point outside the byte map
                    std::string enc;
                    utf8_append(enc, c);
                    out += "[UNK_BYTE_0x";
                    static const char* hex = "0123456789abcdef";
                    for (unsigned char ch : enc) {
                        out.push_back(hex[ch >> 4]);
                        out.push_back(hex[ch & 15]);
                    }
                    out += t + "]";
                    (void)start;
                }
            }
            pieces[i] = std::move(out);
        } else if (a & kAttrByte) {
            // "<0xXX>"
            unsigned v = 0;
            if (t.size() >= 5) v = unsigned(std::strtoul(t.substr(3, 2).c_str(), nullptr, 16));
            pieces[i] = std::string(1, char(v));
        }
    }

    // BPE tables.
    for (int b = 0; b < 256; ++b) {
        std::string s;
        utf8_append(s, gpt2_byte_to_cpt(uint8_t(b)));
        byte_sym[b] = intern(s);
    }
    merges.build(vocab.merges.size() + 16);
    for (size_t r = 0; r < vocab.merges.size(); ++r) {
        const std::string& m = vocab.merges[r];
        const size_t sp = m.find(' ', 1);  // as llama.cpp: a leading space belongs to the left part
        if (sp == std::string::npos) continue;
        const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
        if (left.empty() || right.empty()) continue;  // can never match a symbol
        const int32_t a = intern(left), b = intern(right);
        const int32_t res = intern(left + right);
        merges.insert(PairMap::make_key(a, b), int32_t(r), res);
    }
}

void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<int32_t>& out, Scratch& s) const {
    const int32_t n = int32_t(word.size());
    if (n == 1) {
        emit_symbol(byte_sym[uint8_t(word[0])], out);
        return;
    }
    auto& syms = s.syms;
    auto& heap = s.heap;
    syms.resize(size_t(n));
    for (int32_t i = 0; i < n; ++i)
        syms[size_t(i)] = {byte_sym[uint8_t(word[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};
    heap.clear();
    // Min-heap on (rank, left position): llama.cpp's llm_bigram_bpe comparator.
    auto worse = [](const Scratch::Bigram& x, const Scratch::Bigram& y) {
        return x.rank > y.rank || (x.rank == y.rank && x.left > y.left);
    };
    auto try_add = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const auto* e = merges.find(PairMap::make_key(syms[size_t(l)].id, syms[size_t(r)].id));
        if (!e) return;
        heap.push_back({e->rank, l, r, syms[size_t(l)].id, syms[size_t(r)].id});
        std::push_heap(heap.begin(), heap.end(), worse);
    };
    for (int32_t i = 0; i + 1 < n; ++i) try_add(i, i + 1);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), worse);
        const Scratch::Bigram bg = heap.back();
        heap.pop_back();
        Scratch::Sym& L = syms[size_t(bg.left)];
        Scratch::Sym& R = syms[size_t(bg.right)];
        // Stale if either side was merged away or has grown since the push.
        if (L.id < 0 || R.id < 0 || L.next != bg.right || L.id != bg.left_id || R.id != bg.right_id)
            continue;
        L.id = merges.find(PairMap::make_key(bg.left_id, bg.right_id))->result;
        L.next = R.next;
        if (R.next >= 0) syms[size_t(R.next)].prev = bg.left;
        R.id = -1;
        try_add(L.prev, bg.left);
        try_add(bg.left, L.next);
    }
    for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) emit_symbol(syms[size_t(i)].id, out);
}

void Tokenizer::Impl::encode_fragment(std::string_view text, std::vector<int32_t>& out,
                                      Scratch& s) const {
    // 1. Decode with llama.cpp's rules. llama.cpp tokenizes the re-encoded
    // code points, so invalid bytes become U+FFFD and overlong forms their
    // shortest encoding; `norm` holds that text (only built when it differs).
    s.cpts.clear();
    s.cls.clear();
    s.offs.clear();
    bool regular = true;
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t start = pos;
        const uint8_t b = uint8_t(text[pos]);
        uint32_t c;
        if (b < 0x80) {
            c = b;
            ++pos;
        } else {
            c = utf8_decode_llama(text, &pos);
            char tmp[4];
            if (utf8_encode(c, tmp) != pos - start) regular = false;
        }
        s.cpts.push_back(c);
        s.cls.push_back(split_class(c));
        s.offs.push_back(uint32_t(start));
    }
    std::string_view norm = text;
    if (!regular) {
        s.norm.clear();
        for (size_t i = 0; i < s.cpts.size(); ++i) {
            s.offs[i] = uint32_t(s.norm.size());
            utf8_append(s.norm, s.cpts[i]);
        }
        s.owned_words.push_back(s.norm);  // cache keys view into it
        norm = s.owned_words.back();
    }
    s.offs.push_back(uint32_t(norm.size()));

    // 2. Split into words, 3. BPE each word (cached per distinct word).
    s.ends.clear();
    split_words(s.cpts.data(), s.cls.data(), s.cpts.size(), s.ends);
    uint32_t wstart = 0;
    for (uint32_t wend : s.ends) {
        const uint32_t b0 = s.offs[wstart], b1 = s.offs[wend];
        wstart = wend;
        const std::string_view word = norm.substr(b0, b1 - b0);
        auto it = s.cache.find(word);
        if (it != s.cache.end()) {
            const auto [off, len] = it->second;
            out.insert(out.end(), s.cache_ids.begin() + off, s.cache_ids.begin() + off + len);
            continue;
        }
        const size_t before = out.size();
        bpe_word(word, out, s);
        const uint32_t off = uint32_t(s.cache_ids.size());
        s.cache_ids.insert(s.cache_ids.end(), out.begin() + long(before), out.end());
        s.cache.emplace(word, std::make_pair(off, uint32_t(out.size() - before)));
    }
}

Tokenizer::Tokenizer(Vocab vocab) : impl_(std::make_unique<Impl>()) {
    impl_->vocab = std::move(vocab);
    impl_->build();
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
    Vocab v = load_vocab(f);  // its errors name the file already
    try {
        return Tokenizer(std::move(v));
    } catch (const Error& e) {
        // A bad vocabulary is a bad file: say which one.
        throw Error("'" + f.path() + "': " + e.what());
    }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special,
                                       bool add_special) const {
    const Impl& im = *impl_;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_special && im.vocab.add_bos) out.push_back(im.vocab.bos_id);

    // Special-token partition (llama.cpp's tokenizer_st_partition): for each
    // special token, longest first, split every text fragment at each of its
    // occurrences. A fragment is a token (id >= 0) or a text range.
    struct Frag {
        int32_t id;
        size_t off, len;
    };
    std::vector<Frag> frags, next;
    if (!text.empty()) frags.push_back({-1, 0, text.size()});
    for (int32_t sid : im.specials) {
        const uint32_t a = im.attrs[size_t(sid)];
        if (!parse_special && (a & (kAttrControl | kAttrUnknown))) continue;
        const std::string& st = im.vocab.tokens[size_t(sid)];
        bool any = false;
        for (const Frag& f : frags) {
            if (f.id < 0 && f.len >= st.size() &&
                text.substr(f.off, f.len).find(st) != std::string_view::npos) {
                any = true;
                break;
            }
        }
        if (!any) continue;
        next.clear();
        for (const Frag& f : frags) {
            if (f.id >= 0) {
                next.push_back(f);
                continue;
            }
            const std::string_view ft = text.substr(f.off, f.len);
            size_t p = 0;
            while (true) {
                const size_t m = ft.find(st, p);
                if (m == std::string_view::npos) break;
                if (m > p) next.push_back({-1, f.off + p, m - p});
                next.push_back({sid, 0, 0});
                p = m + st.size();
            }
            if (p < ft.size()) next.push_back({-1, f.off + p, ft.size() - p});
        }
        frags.swap(next);
    }

    Scratch s;
    for (const Frag& f : frags) {
        if (f.id >= 0)
            out.push_back(f.id);
        else
            im.encode_fragment(text.substr(f.off, f.len), out, s);
    }
    if (add_special && im.vocab.add_eos) out.push_back(im.vocab.eos_id);
    return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
    const Impl& im = *impl_;
    if (id < 0 || id >= im.n_vocab) return {};
    if (!special && (im.attrs[size_t(id)] & (kAttrUnknown | kAttrControl))) return {};
    return im.pieces[size_t(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
    std::string out;
    for (int32_t id : ids) out += token_to_piece(id, special);
    return out;
}

int32_t Tokenizer::n_vocab() const {
    return impl_->n_vocab;
}
bool Tokenizer::is_eog(int32_t id) const {
    return id >= 0 && std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}
const std::vector<int32_t>& Tokenizer::eog_ids() const {
    return impl_->eog;
}
int32_t Tokenizer::bos() const {
    return impl_->vocab.bos_id;
}
int32_t Tokenizer::eos() const {
    return impl_->vocab.eos_id;
}
int32_t Tokenizer::pad() const {
    return impl_->vocab.pad_id;
}
bool Tokenizer::add_bos() const {
    return impl_->vocab.add_bos;
}
bool Tokenizer::is_control(int32_t id) const {
    return id >= 0 && id < impl_->n_vocab && (impl_->attrs[size_t(id)] & kAttrControl);
}
uint32_t Tokenizer::token_attr(int32_t id) const {
    return id >= 0 && id < impl_->n_vocab ? impl_->attrs[size_t(id)] : 0;
}
const std::string& Tokenizer::token_text(int32_t id) const {
    static const std::string empty;
    return id >= 0 && id < impl_->n_vocab ? impl_->vocab.tokens[size_t(id)] : empty;
}
int32_t Tokenizer::token_id(std::string_view text) const {
    auto it = impl_->text_to_id.find(text);
    return it == impl_->text_to_id.end() ? -1 : it->second;
}
const Vocab& Tokenizer::vocab() const {
    return impl_->vocab;
}

// ---------------------------------------------------------------------------

namespace {
// Is b a valid byte at position k (1..3) of a sequence starting with lead?
bool valid_cont(uint8_t lead, int k, uint8_t b) {
    if (k == 1) {
        if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;  // no overlong
        if (lead == 0xED) return b >= 0x80 && b <= 0x9F;  // no surrogates
        if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;  // no overlong
        if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;  // <= U+10FFFF
    }
    return (b & 0xC0) == 0x80;
}
const char kFFFD[] = "\xEF\xBF\xBD";
}  // namespace

std::string StreamDecoder::push(int32_t id) {
    return push_bytes(tok_->token_to_piece(id, special_));
}

std::string StreamDecoder::push_bytes(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    size_t i = 0;
    const size_t n = pending_.size();
    while (i < n) {
        const uint8_t lead = uint8_t(pending_[i]);
        const int len = utf8_sequence_length(lead);
        if (len == 0) {
            out += kFFFD;
            ++i;
            continue;
        }
        if (len == 1) {
            out.push_back(char(lead));
            ++i;
            continue;
        }
        int k = 1;
        while (k < len && i + size_t(k) < n &&
               valid_cont(lead, k, uint8_t(pending_[i + size_t(k)])))
            ++k;
        if (k == len) {
            out.append(pending_, i, size_t(len));
            i += size_t(len);
        } else if (i + size_t(k) == n) {
            break;  // a valid but incomplete prefix: hold it back
        } else {
            out += kFFFD;  // broken sequence: replace the lead, rescan from the next byte
            ++i;
        }
    }
    pending_.erase(0, i);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    for (size_t i = 0; i < pending_.size(); ++i) out += kFFFD;
    pending_.clear();
    return out;
}

}  // namespace minfer::tokenizer
