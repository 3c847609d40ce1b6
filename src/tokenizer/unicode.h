// Unicode helpers for the tokenizer: code point classes (generated tables,
// see scripts/gen_unicode_tables.py), UTF-8 decoding with llama.cpp's error
// rules, UTF-8 encoding, and GPT-2's byte <-> code point mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace minfer::tokenizer {

// General-category groups (as llama.cpp's unicode_cpt_flags categories).
enum class UCat : uint8_t {
    Undefined = 0,  // Cn, and anything >= 0x110000
    Number = 1,     // Nd Nl No
    Letter = 2,     // Lu Ll Lt Lm Lo
    Separator = 3,  // Zs Zl Zp
    Mark = 4,       // Mn Mc Me
    Punctuation = 5,
    Symbol = 6,
    Control = 7,  // Cc Cf Co Cs
};

namespace detail {
extern const uint16_t kUnicodeStage1[0x110000 >> 8];
extern const uint8_t kUnicodeStage2[];
inline uint8_t unicode_bits(uint32_t cpt) {
    if (cpt >= 0x110000) return 0;
    return kUnicodeStage2[(size_t(kUnicodeStage1[cpt >> 8]) << 8) | (cpt & 0xFF)];
}
}  // namespace detail

inline UCat unicode_category(uint32_t cpt) {
    return UCat(detail::unicode_bits(cpt) & 7);
}
// The White_Space property (the set llama.cpp uses for \s).
inline bool unicode_is_whitespace(uint32_t cpt) {
    return detail::unicode_bits(cpt) & 8;
}

constexpr uint32_t kReplacementChar = 0xFFFD;

// Decodes one code point at text[*pos], advancing *pos, exactly as llama.cpp's
// unicode_cpts_from_utf8 does: a lead byte followed by the right number of
// continuation bytes (10xxxxxx) is accepted without checking for overlong
// forms or surrogates; anything else (a stray continuation byte, a truncated
// sequence, a 0xF8..0xFF lead) yields U+FFFD and advances by ONE byte.
// Differences: llama.cpp later throws on 4-byte sequences that decode above
// U+10FFFF (lead F4 with a high second byte, or F5..F7); we map them to
// U+FFFD (advancing one byte) instead of failing.
inline uint32_t utf8_decode_llama(std::string_view text, size_t* pos) {
    const size_t i = *pos;
    const size_t n = text.size();
    const uint8_t b0 = uint8_t(text[i]);
    auto cont = [&](size_t k) { return i + k < n && (uint8_t(text[i + k]) & 0xC0) == 0x80; };
    if (b0 < 0x80) {
        *pos = i + 1;
        return b0;
    }
    if ((b0 & 0x40) == 0) {  // stray continuation byte
        *pos = i + 1;
        return kReplacementChar;
    }
    if ((b0 & 0x20) == 0) {
        if (!cont(1)) {
            *pos = i + 1;
            return kReplacementChar;
        }
        *pos = i + 2;
        return (uint32_t(b0 & 0x1F) << 6) | (uint8_t(text[i + 1]) & 0x3F);
    }
    if ((b0 & 0x10) == 0) {
        if (!cont(1) || !cont(2)) {
            *pos = i + 1;
            return kReplacementChar;
        }
        *pos = i + 3;
        return (uint32_t(b0 & 0x0F) << 12) | (uint32_t(uint8_t(text[i + 1]) & 0x3F) << 6) |
               (uint8_t(text[i + 2]) & 0x3F);
    }
    if ((b0 & 0x08) == 0) {
        if (!cont(1) || !cont(2) || !cont(3)) {
            *pos = i + 1;
            return kReplacementChar;
        }
        const uint32_t c =
            (uint32_t(b0 & 0x07) << 18) | (uint32_t(uint8_t(text[i + 1]) & 0x3F) << 12) |
            (uint32_t(uint8_t(text[i + 2]) & 0x3F) << 6) | (uint8_t(text[i + 3]) & 0x3F);
        if (c > 0x10FFFF) {
            *pos = i + 1;
            return kReplacementChar;
        }
        *pos = i + 4;
        return c;
    }
    *pos = i + 1;
    return kReplacementChar;
}

// Appends the UTF-8 encoding of cpt (cpt <= 0x10FFFF; surrogates are encoded
// as three bytes like llama.cpp does). Returns the number of bytes written.
inline size_t utf8_encode(uint32_t cpt, char* out) {
    if (cpt < 0x80) {
        out[0] = char(cpt);
        return 1;
    }
    if (cpt < 0x800) {
        out[0] = char(0xC0 | (cpt >> 6));
        out[1] = char(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt < 0x10000) {
        out[0] = char(0xE0 | (cpt >> 12));
        out[1] = char(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = char(0x80 | (cpt & 0x3F));
        return 3;
    }
    out[0] = char(0xF0 | (cpt >> 18));
    out[1] = char(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = char(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = char(0x80 | (cpt & 0x3F));
    return 4;
}
inline void utf8_append(std::string& s, uint32_t cpt) {
    char buf[4];
    s.append(buf, utf8_encode(cpt, buf));
}

// GPT-2's reversible byte -> code point map (printable bytes map to
// themselves, the rest to U+0100 + n in byte order).
uint32_t gpt2_byte_to_cpt(uint8_t b);
// Inverse; returns -1 for code points that are not in the map.
int gpt2_cpt_to_byte(uint32_t cpt);

// Length in bytes of the UTF-8 sequence that `lead` starts, 0 if it cannot
// start one (a continuation byte or 0xF8..0xFF). Strict: used by the stream
// decoder.
int utf8_sequence_length(uint8_t lead);

}  // namespace minfer::tokenizer
