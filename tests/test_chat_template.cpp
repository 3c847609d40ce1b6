#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

using namespace minfer::tokenizer;

TEST(ChatTemplate, ChatmlExactString) {
    const std::vector<ChatMessage> msgs = {{"system", "You are a helpful assistant."},
                                           {"user", "Hi!"}};
    EXPECT_EQ(render_chatml(msgs, true),
              "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(render_chatml(msgs, false),
              "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
              "<|im_start|>user\nHi!<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3NoThinkAppendsEmptyThinkBlock) {
    EXPECT_EQ(render_chatml({{"user", "2+2?"}}, true, true),
              "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    // Without a generation prompt there is nothing to attach it to.
    EXPECT_EQ(render_chatml({{"user", "x"}}, false, true), "<|im_start|>user\nx<|im_end|>\n");
    EXPECT_EQ(render_chatml({}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Detect) {
    EXPECT_EQ(
        detect_chat_template("{% for message in messages %}{{'<|im_start|>' + message['role']"),
        ChatTemplateKind::ChatML);
    EXPECT_EQ(detect_chat_template("{{ bos_token }}[INST] {{ m }} [/INST]"),
              ChatTemplateKind::Unknown);
    EXPECT_EQ(detect_chat_template(""), ChatTemplateKind::Unknown);
}
