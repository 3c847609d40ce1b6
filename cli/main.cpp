// minfer: the command. Dispatches to a subcommand; with none, generates text
// like llama.cpp's llama-cli.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "backend/cpu/isa.h"
#include "commands.h"
#include "util/args.h"
#include "util/error.h"

namespace {

struct Subcommand {
    const char* name;
    int (*run)(int, char**, int);
    const char* summary;
};

const Subcommand kSubcommands[] = {
    {"info", minfer::cli::cmd_info, "describe a GGUF model: hyper-parameters, tokenizer, tensors"},
    {"tokenize", minfer::cli::cmd_tokenize, "print the token ids of a text"},
    {"quantize", minfer::cli::cmd_quantize,
     "convert a model to another file type (Q4_K_M, Q8_0, ...)"},
    {"logits", minfer::cli::cmd_logits, "run a token list and write its logits (parity checks)"},
    {"perplexity", minfer::cli::cmd_perplexity, "perplexity of a model over a text"},
    {"bench", minfer::cli::cmd_bench, "prompt-processing and generation speed, llama-bench style"},
    {"batched-bench", minfer::cli::cmd_batched_bench,
     "throughput of many sequences in one engine, llama-batched-bench style"},
    {"viz", minfer::cli::cmd_viz, "write an HTML page of the graph and its buffers"},
#ifdef MINFER_WITH_SERVER
    {"serve", minfer::cli::cmd_serve, "an OpenAI-compatible HTTP server with a chat page"},
#endif
};

void print_top_help() {
    std::printf(
        "minfer %s — run Qwen-family GGUF language models on the CPU\n\n"
        "usage: minfer [options]                generate text (see minfer --help-generate)\n"
        "       minfer SUBCOMMAND [options]     (minfer SUBCOMMAND --help for its options)\n\n"
        "subcommands:\n",
        MINFER_VERSION);
    for (const auto& s : kSubcommands) std::printf("  %-12s %s\n", s.name, s.summary);
    std::printf(
        "\nWith no -m, minfer uses its built-in model (%s),\n"
        "a 4.2M-parameter model trained on the King James Bible.\n"
        "Example: minfer -p \"And God said\" -n 64\n",
        minfer::cli::default_model_path());
}

}  // namespace

int main(int argc, char** argv) {
    int (*run)(int, char**, int) = minfer::cli::cmd_generate;
    int first = 1;
    if (argc >= 2) {
        std::string a = argv[1];
        if (a == "--version") {
            std::printf("minfer %s\n", MINFER_VERSION);
            return 0;
        }
        if (a == "help" || a == "-h" || a == "--help") {
            print_top_help();
            return 0;
        }
        if (a == "--help-generate") {
            static char help[] = "--help";
            char* args[] = {argv[0], help};
            return minfer::cli::cmd_generate(2, args, 1);
        }
        for (const auto& s : kSubcommands) {
            if (a == s.name) {
                run = s.run;
                first = 2;
            }
        }
        if (first == 1 && !a.empty() && a[0] != '-') {
            std::fprintf(stderr, "minfer: error: unknown subcommand '%s' (try 'minfer --help')\n",
                         a.c_str());
            return 2;
        }
    }
    try {
        // MINFER_CPU caps the kernels' instruction-set level; a value that is
        // not a level, or one this CPU lacks, stops here (exit 1).
        minfer::cpu::apply_isa_env();
        return run(argc, argv, first);
    } catch (const minfer::UsageError& e) {
        // One line naming what is wrong, then the usage line and where the
        // full option list is.
        if (first == 2)
            std::fprintf(
                stderr,
                "minfer: error: %s\nusage: minfer %s [options]  (minfer %s --help lists them)\n",
                e.what(), argv[1], argv[1]);
        else
            std::fprintf(stderr,
                         "minfer: error: %s\nusage: minfer [-m MODEL] -p PROMPT [options]  (minfer "
                         "--help-generate lists them)\n",
                         e.what());
        return 2;
    } catch (const minfer::Error& e) {
        std::fprintf(stderr, "minfer: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "minfer: error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "minfer: error: %s\n", e.what());
        return 1;
    }
}
