// minfer tokenize: the token ids of a text, llama-tokenize style.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "util/args.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot open text file '" + path + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string ids_json(const std::vector<int32_t>& ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(ids[i]);
    }
    return s + "]";
}

// JSON string with non-ASCII kept as UTF-8 (invalid bytes become U+FFFD).
std::string json_str(const std::string& s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int cmd_tokenize(int argc, char** argv, int first) {
    std::string model = default_model_path();
    std::string prompt, file, jsonl;
    bool prompt_given = false;
    bool no_parse_special = false, show_pieces = false, pretok = false, add_special = false;
    ArgParser p("minfer tokenize", "Print the token ids of a text as llama.cpp would tokenize it.");
    p.option({"-m", "--model"}, &model, "FILE", "GGUF model whose vocabulary to use");
    p.optional_value({"-p", "--prompt"}, &prompt_given, &prompt, "TEXT", "the text to tokenize");
    p.option({"-f", "--file"}, &file, "FILE", "read the text from FILE (bytes as they are)");
    p.option({"--jsonl"}, &jsonl, "FILE",
             "read lines {\"text\": ...} from FILE, write {\"text\": ..., \"ids\": [...]} lines");
    p.flag({"--no-parse-special"}, &no_parse_special,
           "treat control tokens written in the text (<|im_start|> ...) as plain text "
           "(default: parse them)");
    p.flag({"--add-special"}, &add_special,
           "add BOS/EOS if the vocabulary asks for them (add_bos_token; false for Qwen) "
           "(default: off)");
    p.flag({"--show-pieces"}, &show_pieces,
           "print one token per line: id, then its text as a JSON string (default: off)");
    p.flag({"--pretokenize"}, &pretok,
           "print the pre-tokenizer's words as a JSON array instead of ids (debugging; "
           "default: off)");
    p.epilog(
        "Exactly one of -p, -f, --jsonl gives the input. Output: one JSON array of ids on "
        "stdout.\nExample: minfer tokenize -m qwen.gguf -p \"Hello world\"   ->   [9707, 1879]");
    if (!p.parse(argc, argv, first)) return 0;

    const int n_inputs = int(prompt_given) + int(!file.empty()) + int(!jsonl.empty());
    if (n_inputs != 1) throw UsageError("give exactly one of -p TEXT, -f FILE, --jsonl FILE");

    auto print_words = [](const std::string& text) {
        std::string out = "[";
        bool firstw = true;
        for (const auto& w : tokenizer::pretokenize(text)) {
            if (!firstw) out += ", ";
            firstw = false;
            out += json_str(w);
        }
        std::printf("%s]\n", out.c_str());
    };
    if (pretok && jsonl.empty()) {
        print_words(prompt_given ? prompt : read_file(file));
        return 0;
    }

    auto f = gguf::File::open(model);
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(f);
    const bool parse_special = !no_parse_special;

    if (!jsonl.empty()) {
        std::ifstream in(jsonl, std::ios::binary);
        if (!in) throw Error("cannot open '" + jsonl + "'");
        std::string line;
        size_t lineno = 0;
        while (std::getline(in, line)) {
            ++lineno;
            if (line.empty()) continue;
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const std::exception& e) {
                throw Error(jsonl + ":" + std::to_string(lineno) + ": not JSON: " + e.what());
            }
            if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
                throw Error(jsonl + ":" + std::to_string(lineno) +
                            ": expected {\"text\": \"...\"}");
            const std::string text = j["text"];
            if (pretok) {
                print_words(text);
                continue;
            }
            const auto ids = tok.encode(text, parse_special, add_special);
            std::printf("{\"text\": %s, \"ids\": %s}\n", json_str(text).c_str(),
                        ids_json(ids).c_str());
        }
        return 0;
    }

    const std::string text = prompt_given ? prompt : read_file(file);
    const auto ids = tok.encode(text, parse_special, add_special);
    if (show_pieces) {
        for (int32_t id : ids)
            std::printf("%6d %s\n", id, json_str(tok.token_to_piece(id, true)).c_str());
        return 0;
    }
    std::printf("%s\n", ids_json(ids).c_str());
    return 0;
}

}  // namespace minfer::cli
