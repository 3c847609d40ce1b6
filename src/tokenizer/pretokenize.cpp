#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

namespace minfer::tokenizer {

uint8_t split_class(uint32_t cpt) {
    if (cpt < 0x80) {
        // ASCII keeps its identity in llama.cpp's collapsed text, so the regex
        // classes apply directly: [A-Za-z], [0-9], and the C locale's isspace.
        if ((cpt | 0x20) >= 'a' && (cpt | 0x20) <= 'z') return kClsLetter;
        if (cpt >= '0' && cpt <= '9') return kClsNumber;
        if (cpt == ' ' || (cpt >= 0x09 && cpt <= 0x0D)) return kClsSpace;
        return kClsOther;
    }
    if (unicode_is_whitespace(cpt)) return kClsSpace;  // collapsed to \v
    switch (unicode_category(cpt)) {
        case UCat::Letter:
            return kClsLetter;
        case UCat::Number:
            return kClsNumber;
        default:
            return kClsOther;
    }
}

namespace {
inline bool is_crlf(uint32_t c) {
    return c == '\r' || c == '\n';
}
inline uint32_t ascii_lower(uint32_t c) {
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}
}  // namespace

void split_words(const uint32_t* cpts, const uint8_t* cls, size_t n, std::vector<uint32_t>& ends) {
    size_t i = 0;
    while (i < n) {
        const uint32_t c = cpts[i];
        const uint8_t k = cls[i];

        // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
        if (c == '\'' && i + 1 < n) {
            const uint32_t c1 = ascii_lower(cpts[i + 1]);
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
                i += 2;
                ends.push_back(uint32_t(i));
                continue;
            }
            if (i + 2 < n) {
                const uint32_t c2 = ascii_lower(cpts[i + 2]);
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
                    (c1 == 'l' && c2 == 'l')) {
                    i += 3;
                    ends.push_back(uint32_t(i));
                    continue;
                }
            }
        }

        // [^\r\n\p{L}\p{N}]?\p{L}+  (the optional prefix may be whitespace)
        if (k == kClsLetter ||
            (k != kClsNumber && !is_crlf(c) && i + 1 < n && cls[i + 1] == kClsLetter)) {
            size_t j = i + 1;
            while (j < n && cls[j] == kClsLetter) ++j;
            i = j;
            ends.push_back(uint32_t(i));
            continue;
        }

        // \p{N}: one code point per word
        if (k == kClsNumber) {
            ++i;
            ends.push_back(uint32_t(i));
            continue;
        }

        // " ?[^\s\p{L}\p{N}]+[\r\n]*"
        {
            size_t j = i;
            if (c == ' ' && i + 1 < n && cls[i + 1] == kClsOther) j = i + 1;
            if (cls[j] == kClsOther) {
                while (j < n && cls[j] == kClsOther) ++j;
                while (j < n && is_crlf(cpts[j])) ++j;
                i = j;
                ends.push_back(uint32_t(i));
                continue;
            }
        }

        // Here cpts[i] is whitespace. Measure the run.
        size_t j = i;
        size_t last_crlf_end = 0;
        while (j < n && cls[j] == kClsSpace) {
            if (is_crlf(cpts[j])) last_crlf_end = j + 1;
            ++j;
        }
        if (last_crlf_end > 0) {
            // \s*[\r\n]+ : backtracking \s* stops right after the last CR/LF of the run
            i = last_crlf_end;
        } else if (j == n) {
            // \s+(?!\S) at the end of the fragment takes the whole run
            i = j;
        } else if (j - i >= 2) {
            // \s+(?!\S) gives back the last whitespace, which then joins the next word
            i = j - 1;
        } else {
            i = j;  // \s+
        }
        ends.push_back(uint32_t(i));
    }
}

std::vector<std::string> pretokenize(std::string_view text) {
    std::vector<uint32_t> cpts;
    std::vector<uint8_t> cls;
    size_t pos = 0;
    while (pos < text.size()) {
        const uint32_t c = utf8_decode_llama(text, &pos);
        cpts.push_back(c);
        cls.push_back(split_class(c));
    }
    std::vector<uint32_t> ends;
    split_words(cpts.data(), cls.data(), cpts.size(), ends);
    std::vector<std::string> words;
    size_t start = 0;
    for (uint32_t e : ends) {
        std::string w;
        for (size_t k = start; k < e; ++k) utf8_append(w, cpts[k]);
        words.push_back(std::move(w));
        start = e;
    }
    return words;
}

}  // namespace minfer::tokenizer
