// The flags of `minfer [-m MODEL] -p PROMPT ...` (text generation), apart from
// the command so that a test or a fuzz target can build the very same parser
// without loading a model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "report/observe.h"
#include "runtime/sampler.h"
#include "util/args.h"

namespace minfer::cli {

struct GenFlags {
    std::string model_path;  // default_model_path() unless -m
    std::string prompt;
    std::string prompt_file;
    int64_t n_predict = -1;
    runtime::SamplerParams sp;
    int64_t seed = -1;
    bool ignore_eos = false;
    std::vector<std::string> stops;
    bool no_display_prompt = false;
    bool chat = false;
    std::string system_prompt;
    std::string chat_template;
    bool no_think = false;
    bool no_special_parse = false;
    ConstraintFlags constraint;  // --json-schema, --grammar, ...
    EngineFlags eng;
    report::ObserveFlags observe;  // --mem-report, --dump-graph, ...
};

// Declares every generation flag on `p`, writing into `f` (whose current
// values are the defaults --help shows).
void add_generate_flags(ArgParser& p, GenFlags& f);

// Checks the parsed values against each other and their ranges (before any
// file is read); throws UsageError. A prompt read with -f counts as given.
void check_generate_flags(GenFlags& f);

}  // namespace minfer::cli
