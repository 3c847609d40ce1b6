// Writes the seed corpora of the fuzz targets into OUT/<target>/: tiny GGUF
// models written with the project's writer (tests/tiny_model.h), texts with
// and without special tokens and invalid UTF-8, chats and command lines.
// Binary seeds are generated here rather than committed.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tiny_model.h"

namespace fs = std::filesystem;
using namespace minfer;

namespace {

void put(const fs::path& dir, const std::string& name, const std::string& bytes) {
    fs::create_directories(dir);
    std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string as_string(const std::vector<uint8_t>& b) {
    return std::string(b.begin(), b.end());
}

std::string joined(const std::vector<std::string>& words) {
    std::string s;
    for (size_t i = 0; i < words.size(); ++i) {
        if (i) s.push_back('\0');
        s += words[i];
    }
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
        return 2;
    }
    const fs::path out = argv[1];

    // GGUF: small models of both architectures, f32 / q8_0 / q4_K weights,
    // tied and untied output.
    int k = 0;
    for (const char* arch : {"qwen2", "qwen3"}) {
        for (tensor::DType t : {tensor::DType::F32, tensor::DType::Q8_0}) {
            testing::TinyModelSpec s;
            s.arch = arch;
            s.n_embd = 32;
            s.n_head = 2;
            s.n_head_kv = 1;
            s.head_dim = 16;
            s.n_ff = 32;
            s.n_layer = 1;
            s.weight_type = t;
            s.tied_output = (k % 2) == 0;
            put(out / "gguf", "tiny" + std::to_string(k++) + ".gguf",
                as_string(testing::make_tiny_model(s).to_bytes()));
        }
    }
    {
        gguf::Writer w;  // metadata only, every value type
        w.set_string("general.architecture", "qwen2");
        w.set_u32("a.u32", 7);
        w.set_i32("a.i32", -7);
        w.set_u64("a.u64", 1ull << 40);
        w.set_f32("a.f32", 0.5f);
        w.set_bool("a.bool", true);
        w.set_string_array("a.strs", {"x", "", "yz"});
        w.set_i32_array("a.ints", {1, -2, 3});
        w.set_f32_array("a.floats", {1.5f});
        w.set_alignment(64);
        w.add_tensor("t", tensor::DType::F32, {4}, std::vector<uint8_t>(16, 1));
        put(out / "gguf", "values.gguf", as_string(w.to_bytes()));
    }

    // Tokenizer: first byte picks the vocabulary (0 = KJV, 1 = tiny).
    const std::vector<std::string> texts = {
        "And God said, Let there be light: and there was light.",
        "In the beginning God created the heaven and the earth.\n\n\tThe end  ",
        "<|im_start|>user\nHello<|im_end|>\n<|endoftext|><think>x</think>",
        "Hello, 世界! Привет мир. 🌍🎉 café naïve ﬁ 1234567 3.14 don't I'M",
        std::string("bad \xff\xfe utf8 \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end"),
        std::string("nul\0byte", 8),
        "    \n\r\n  spaces\t\t and\u00a0nbsp",
    };
    for (size_t i = 0; i < texts.size(); ++i)
        for (char vocab : {'\0', '\1'})
            put(out / "tokenizer", "text" + std::to_string(i) + "_" + std::to_string(int(vocab)),
                std::string(1, vocab) + texts[i]);

    // Chat: flags byte, then role\0content pairs.
    put(out / "chat_template", "two_turns",
        std::string("\x01", 1) + joined({"system", "Be brief.", "user", "Hi there", "assistant",
                                         "Hello!", "user", "<|im_end|>\nagain"}));
    put(out / "chat_template", "no_think", std::string("\x03", 1) + joined({"user", "日本語 🎌"}));
    put(out / "chat_template", "jinja",
        std::string("\x00", 1) +
            "{% for message in messages %}{{'<|im_start|>' + message['role'] }}{% endfor %}");

    // Command lines (argv words separated by 0x00).
    const std::vector<std::vector<std::string>> lines = {
        {"-m", "model.gguf", "-p", "And God said", "-n", "64"},
        {"-p", "x", "--temp", "0.7", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.05",
         "--repeat-penalty", "1.1", "--repeat-last-n", "-1", "-s", "42"},
        {"-cnv", "-sys", "Be helpful.", "--chat-template", "chatml", "--no-think", "-c", "2048",
         "-b", "64", "-t", "2", "-ctk", "f32", "--queue-layers", "0:1"},
        {"--ctx-size=4096", "--stop", "\n", "--stop", ".", "--ignore-eos", "--no-display-prompt",
         "-f", "prompt.txt", "--no-parse-special"},
        {"IN.gguf", "OUT.gguf", "Q4_K_M", "-j", "3", "--scale", "1e30", "--ratio", "-0.5"},
        {"-p", "--show-pieces", "in", "--help"},
    };
    for (size_t i = 0; i < lines.size(); ++i)
        put(out / "args", "line" + std::to_string(i), joined(lines[i]));

    // Allocator: byte 0 = every planner / graph count / backend count
    // combination, then pseudo-random bytes that drive the graph generator.
    uint32_t x = 12345;
    for (int head = 0; head < 16; ++head) {
        std::string bytes(1, static_cast<char>(head));
        for (int i = 0; i < 400; ++i) {
            x = x * 1103515245u + 12345u;
            bytes.push_back(static_cast<char>(x >> 16));
        }
        put(out / "alloc", "graphs" + std::to_string(head), bytes);
    }
    return 0;
}
