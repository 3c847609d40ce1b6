#include "generate_flags.h"

namespace minfer::cli {

void add_generate_flags(ArgParser& p, GenFlags& f) {
    p.option({"-m", "--model"}, &f.model_path, "FILE", "GGUF model");
    p.option({"-p", "--prompt"}, &f.prompt, "TEXT", "prompt");
    p.option({"-f", "--file"}, &f.prompt_file, "FILE", "read the prompt from a file");
    p.option({"-n", "--n-predict"}, &f.n_predict, "N",
             "tokens to generate (-1 = until end of text or context)");
    f.eng.add_to(p);
    f.observe.add_to(p);
    p.option({"--temp"}, &f.sp.temp, "T", "temperature (0 = greedy)");
    p.option({"--top-k"}, &f.sp.top_k, "N", "top-k sampling (0 = off)");
    p.option({"--top-p"}, &f.sp.top_p, "P", "top-p sampling (1.0 = off)");
    p.option({"--min-p"}, &f.sp.min_p, "P", "min-p sampling (0.0 = off)");
    p.option({"--repeat-penalty"}, &f.sp.repeat_penalty, "X",
             "penalty for repeated tokens (1.0 = off)");
    p.option({"--repeat-last-n"}, &f.sp.repeat_last_n, "N",
             "window of the repeat penalty (0 = off, -1 = context)");
    p.option({"-s", "--seed"}, &f.seed, "N", "random seed (-1 = random, printed)");
    p.flag({"--ignore-eos"}, &f.ignore_eos, "do not stop at end-of-generation tokens");
    p.multi({"--stop"}, &f.stops, "TEXT", "stop when the output ends with TEXT (repeatable)");
    p.flag({"--no-display-prompt"}, &f.no_display_prompt, "do not print the prompt");
    p.flag({"-cnv", "--chat", "--conversation"}, &f.chat,
           "chat: read user turns from the terminal");
    p.option({"-sys", "--system-prompt"}, &f.system_prompt, "TEXT", "system prompt for --chat");
    p.option({"--chat-template"}, &f.chat_template, "NAME",
             "chat template: chatml (default: from the model)");
    p.flag({"--no-think"}, &f.no_think,
           "Qwen3: write the empty <think></think> block (thinking off)");
    p.flag({"--no-parse-special"}, &f.no_special_parse,
           "treat special-token text in the prompt as plain text");
    f.constraint.add_to(p);
}

void check_generate_flags(GenFlags& f) {
    if (f.sp.temp < 0) f.sp.temp = 0;
    if (f.sp.top_k < 0) throw UsageError("--top-k must be >= 0");
    if (!(f.sp.top_p > 0 && f.sp.top_p <= 1)) throw UsageError("--top-p must be in (0, 1]");
    if (!(f.sp.min_p >= 0 && f.sp.min_p <= 1)) throw UsageError("--min-p must be in [0, 1]");
    if (!(f.sp.repeat_penalty > 0)) throw UsageError("--repeat-penalty must be > 0");
    if (f.sp.repeat_last_n < -1) throw UsageError("--repeat-last-n must be -1 or >= 0");
    if (f.n_predict < -1) throw UsageError("-n must be -1 or >= 0");
    if (!f.chat_template.empty() && f.chat_template != "chatml")
        throw UsageError("unknown chat template '" + f.chat_template + "' (supported: chatml)");
    f.constraint.check();
    if (!f.chat && f.prompt.empty() && f.prompt_file.empty())
        throw UsageError("give a prompt with -p or -f (or chat with -cnv)");
    // The engine knobs (-t, -b, -ctk, --queue-layers) are checked here too, so
    // that a bad flag is a usage error before the model is loaded.
    (void)f.eng.session_options();
}

}  // namespace minfer::cli
