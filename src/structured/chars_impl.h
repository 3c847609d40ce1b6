// Internal to structured/: reading the characters of a GBNF grammar's text
// (grammar.cpp) and of a JSON Schema pattern (json_schema_scalars.cpp) —
// one UTF-8 character, one hex digit of an escape — and writing a code
// point's UTF-8 bytes (a literal's bytes, compiled.cpp's byte ranges),
// each written once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace minfer::structured {

// A character decoded from UTF-8: its code point and its length in bytes;
// len 0 when the bytes are not one (a byte that cannot start a character,
// a sequence cut short by the end, a byte that does not continue it).
struct Utf8Char {
    uint32_t cp = 0;
    int len = 0;
};

inline Utf8Char decode_utf8_at(std::string_view text, size_t pos) {
    const auto c = static_cast<unsigned char>(text[pos]);
    const int len = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xE  ? 3
                    : (c >> 3) == 0x1E ? 4
                                       : 0;
    if (len == 0 || pos + size_t(len) > text.size()) return {};
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (int i = 1; i < len; ++i) {
        const auto cc = static_cast<unsigned char>(text[pos + size_t(i)]);
        if ((cc & 0xC0) != 0x80) return {};
        cp = (cp << 6) | (cc & 0x3F);
    }
    return {cp, len};
}

// The UTF-8 bytes of a code point (at most 0x10FFFF) into b; returns how many (1-4).
inline int encode_utf8(uint32_t cp, uint8_t b[4]) {
    if (cp < 0x80) {
        b[0] = uint8_t(cp);
        return 1;
    }
    if (cp < 0x800) {
        b[0] = uint8_t(0xC0 | (cp >> 6));
        b[1] = uint8_t(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = uint8_t(0xE0 | (cp >> 12));
        b[1] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
        b[2] = uint8_t(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = uint8_t(0xF0 | (cp >> 18));
    b[1] = uint8_t(0x80 | ((cp >> 12) & 0x3F));
    b[2] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
    b[3] = uint8_t(0x80 | (cp & 0x3F));
    return 4;
}

// The control character of the letter escapes GBNF and regular
// expressions share (\n, \r, \t), -1 for another letter.
inline int control_escape(char e) {
    switch (e) {
        case 'n':
            return '\n';
        case 'r':
            return '\r';
        case 't':
            return '\t';
        default:
            return -1;
    }
}

// The value of a hex digit (0-9, a-f, A-F), -1 for any other character.
inline int hex_digit_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace minfer::structured
