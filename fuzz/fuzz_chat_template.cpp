// Fuzz target: ChatML rendering (tokenizer/chat_template.h) of arbitrary
// messages, then the tokenizer on the rendered prompt as the chat does it
// (special tokens parsed).
//  - the rendering is exactly the concatenation of the ChatML frames, so a
//    message can never change the framing of another (byte counts match and
//    each frame starts where the previous one ended);
//  - detect_chat_template never crashes on arbitrary jinja text;
//  - the tokenized prompt decodes (special=true) back to the rendering when
//    the rendering is valid UTF-8, and the streamed decode is valid UTF-8.
// Input layout: byte 0 = flags (add_generation_prompt, no_think), the rest
// is split at 0x00 bytes into role, content, role, content, ...
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace minfer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const bool add_gen = data[0] & 1;
    const bool no_think = data[0] & 2;
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    (void)tokenizer::detect_chat_template(std::string(rest));

    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t i = 0; i <= rest.size(); ++i) {
        if (i == rest.size() || rest[i] == '\0') {
            parts.emplace_back(rest.substr(start, i - start));
            start = i + 1;
        }
    }
    std::vector<tokenizer::ChatMessage> messages;
    for (size_t i = 0; i + 1 < parts.size() && messages.size() < 64; i += 2)
        messages.push_back({parts[i], parts[i + 1]});

    const std::string out = tokenizer::render_chatml(messages, add_gen, no_think);
    size_t pos = 0;
    for (const auto& m : messages) {
        const std::string frame = "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        if (out.compare(pos, frame.size(), frame) != 0)
            fuzz::fail("a ChatML frame is not where it belongs");
        pos += frame.size();
    }
    std::string tail = add_gen ? "<|im_start|>assistant\n" : "";
    if (add_gen && no_think) tail += "<think>\n\n</think>\n\n";
    if (out.size() != pos + tail.size() || out.compare(pos, tail.size(), tail) != 0)
        fuzz::fail("the generation prompt is wrong");

    const tokenizer::Tokenizer& tok = fuzz::tiny_tokenizer();
    const std::vector<int32_t> ids = tok.encode(out, true);
    for (int32_t id : ids)
        if (id < 0 || id >= tok.n_vocab()) fuzz::fail("encode produced an id out of range");
    if (fuzz::valid_utf8(out) && tok.decode(ids, true) != out)
        fuzz::fail("the tokenized chat prompt does not decode back");
    tokenizer::StreamDecoder sd(tok, true);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    if (!fuzz::valid_utf8(streamed)) fuzz::fail("StreamDecoder produced invalid UTF-8");
    return 0;
}
