#include "tokenizer/unicode.h"

#include <array>

namespace minfer::tokenizer {

namespace {
struct Gpt2Maps {
    std::array<uint32_t, 256> byte_to_cpt{};
    std::array<int16_t, 512> cpt_to_byte{};  // all mapped code points are < 0x144
    Gpt2Maps() {
        cpt_to_byte.fill(-1);
        auto printable = [](int b) {
            return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        };
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            byte_to_cpt[b] = printable(b) ? uint32_t(b) : uint32_t(256 + n++);
            cpt_to_byte[byte_to_cpt[b]] = int16_t(b);
        }
    }
};
const Gpt2Maps& gpt2_maps() {
    static const Gpt2Maps maps;
    return maps;
}
}  // namespace

uint32_t gpt2_byte_to_cpt(uint8_t b) {
    return gpt2_maps().byte_to_cpt[b];
}

int gpt2_cpt_to_byte(uint32_t cpt) {
    return cpt < 512 ? gpt2_maps().cpt_to_byte[cpt] : -1;
}

int utf8_sequence_length(uint8_t lead) {
    if (lead < 0x80) return 1;
    if (lead < 0xC2) return 0;  // continuation byte or overlong lead C0/C1
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    if (lead < 0xF5) return 4;
    return 0;
}

}  // namespace minfer::tokenizer
