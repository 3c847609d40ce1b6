#include "tokenizer/chat_template.h"

namespace minfer::tokenizer {

ChatTemplateKind detect_chat_template(const std::string& jinja) {
    return jinja.find("<|im_start|>") != std::string::npos ? ChatTemplateKind::ChatML
                                                           : ChatTemplateKind::Unknown;
}

std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          bool no_think_qwen3) {
    std::string out;
    for (const ChatMessage& m : messages) {
        out += "<|im_start|>";
        out += m.role;
        out += '\n';
        out += m.content;
        out += "<|im_end|>\n";
    }
    if (add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        if (no_think_qwen3) out += "<think>\n\n</think>\n\n";
    }
    return out;
}

}  // namespace minfer::tokenizer
