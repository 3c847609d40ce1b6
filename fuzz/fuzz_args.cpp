// Fuzz target: command-line parsing. The input is split at 0x00 bytes into
// argv words and parsed by the very parsers of the real commands:
// generation (cli/generate_flags.h, plus its checks), and a parser holding
// every kind of option ArgParser offers (flag, string, int64, int, double,
// float, repeatable, optional value, positionals) the way `minfer tokenize`
// and `minfer quantize` declare them, plus the engine flags (cli/common.h)
// that logits and perplexity share. A parse must either succeed or throw
// UsageError; nothing else may escape, and nothing may crash (float range,
// integer range, missing values, "--x=" forms, lone "-", ...).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "fuzz_common.h"
#include "generate_flags.h"
#include "util/args.h"

using namespace minfer;

namespace {

void parse_generate(std::vector<char*>& argv) {
    cli::GenFlags f;
    f.model_path = "model.gguf";
    ArgParser p("minfer", "fuzz");
    cli::add_generate_flags(p, f);
    if (!p.parse(static_cast<int>(argv.size()), argv.data(), 1)) return;
    cli::check_generate_flags(f);
}

void parse_other(std::vector<char*>& argv) {
    std::string model, prompt, file, in, out, type;
    bool prompt_given = false, flag = false;
    int threads = 0;
    double d = 0.5;
    float x = 1.0f;
    std::vector<std::string> many;
    cli::EngineFlags eng;
    ArgParser p("minfer tokenize", "fuzz");
    p.option({"-m", "--model"}, &model, "FILE", "model");
    p.optional_value({"-p", "--prompt"}, &prompt_given, &prompt, "TEXT", "text");
    p.option({"-f", "--file"}, &file, "FILE", "file");
    p.flag({"--show-pieces"}, &flag, "pieces");
    p.option({"--ratio"}, &d, "X", "a double");
    p.option({"--scale"}, &x, "X", "a float");
    p.option({"-j", "--jobs"}, &threads, "N", "an int");
    p.multi({"--stop"}, &many, "TEXT", "repeatable");
    eng.add_to(p);
    p.positional("IN", &in, "input", true);
    p.positional("OUT", &out, "output", false);
    p.positional("TYPE", &type, "type", false);
    if (!p.parse(static_cast<int>(argv.size()), argv.data(), 1)) return;
    (void)eng.session_options();
    (void)p.usage();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<std::string> words{"minfer"};
    std::string cur;
    for (size_t i = 0; i < size; ++i) {
        if (data[i] == 0) {
            words.push_back(cur);
            cur.clear();
        } else {
            cur.push_back(static_cast<char>(data[i]));
        }
    }
    if (!cur.empty()) words.push_back(cur);
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);  // argv[argc] == nullptr, as main() receives it

    // --help prints the usage to stdout: keep the fuzzer's output quiet.
    std::FILE* saved = stdout;
    static std::FILE* devnull = std::fopen("/dev/null", "w");
    stdout = devnull;
    for (auto* parse : {parse_generate, parse_other}) {
        std::vector<char*> args(argv.begin(), argv.end() - 1);
        try {
            parse(args);
        } catch (const UsageError&) {
        }
    }
    stdout = saved;
    return 0;
}
