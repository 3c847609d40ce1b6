// Chat prompt formatting. Only ChatML (Qwen's format) is built in; we do not
// run the model's jinja template, we recognise it.
#pragma once

#include <string>
#include <vector>

namespace minfer::tokenizer {

struct ChatMessage {
    std::string role;  // "system", "user", "assistant", ...
    std::string content;
};

enum class ChatTemplateKind { ChatML, Unknown };

// ChatML if the jinja source writes <|im_start|>, else Unknown.
ChatTemplateKind detect_chat_template(const std::string& jinja);

// <|im_start|>ROLE\nCONTENT<|im_end|>\n for each message, then, with
// add_generation_prompt, "<|im_start|>assistant\n". no_think_qwen3 appends
// "<think>\n\n</think>\n\n" after the generation prompt, as Qwen3's template
// does when thinking is disabled (enable_thinking=false).
std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          bool no_think_qwen3 = false);

}  // namespace minfer::tokenizer
