// One function per subcommand; each parses its own flags (util/args.h) and
// calls into the library. Return value = process exit code. They may throw
// minfer::Error (printed by main, exit 1) or minfer::UsageError (printed with
// the usage, exit 2).
#pragma once

namespace minfer::cli {

int cmd_generate(int argc, char** argv, int first);       // the default: minfer -m M -p P
int cmd_info(int argc, char** argv, int first);           // minfer info MODEL
int cmd_tokenize(int argc, char** argv, int first);       // minfer tokenize -m M -p TEXT
int cmd_quantize(int argc, char** argv, int first);       // minfer quantize IN OUT TYPE
int cmd_logits(int argc, char** argv, int first);         // minfer logits -m M --tokens F --out D
int cmd_perplexity(int argc, char** argv, int first);     // minfer perplexity -m M -f TEXT
int cmd_bench(int argc, char** argv, int first);          // minfer bench -m M -p 512 -n 128
int cmd_batched_bench(int argc, char** argv, int first);  // minfer batched-bench -npl 1,4,8
int cmd_viz(int argc, char** argv, int first);            // minfer viz -m M -p P -o page.html
int cmd_serve(int argc, char** argv, int first);          // minfer serve -m M --port 8080

// The model used when -m is not given: the tiny KJV model shipped in models/.
const char* default_model_path();

}  // namespace minfer::cli
