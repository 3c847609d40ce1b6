// A small command-line parser that speaks llama.cpp's flag vocabulary:
// several spellings per option ("-c", "--ctx-size"), single-dash long
// options ("-cnv", "-ctk"), "--name=value", repeatable options, and
// positionals. It writes straight into the caller's variables, whose
// initial values are the defaults shown by --help.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/error.h"

namespace minfer {

// A bad flag or value: the CLI prints the message and the usage, exits 2.
class UsageError : public Error {
  public:
    explicit UsageError(const std::string& what) : Error(what) {}
};

class ArgParser {
  public:
    ArgParser(std::string prog, std::string summary);

    void flag(std::vector<std::string> names, bool* out, std::string help);
    void option(std::vector<std::string> names, std::string* out, std::string metavar,
                std::string help);
    void option(std::vector<std::string> names, int64_t* out, std::string metavar,
                std::string help);
    void option(std::vector<std::string> names, int* out, std::string metavar, std::string help);
    void option(std::vector<std::string> names, double* out, std::string metavar, std::string help);
    void option(std::vector<std::string> names, float* out, std::string metavar, std::string help);
    // Repeatable: every occurrence is appended.
    void multi(std::vector<std::string> names, std::vector<std::string>* out, std::string metavar,
               std::string help);
    // An option whose value may be omitted ("--mem-report [FILE]"): *given is
    // set, and *out gets the value if the next word is not another option.
    void optional_value(std::vector<std::string> names, bool* given, std::string* out,
                        std::string metavar, std::string help);
    void positional(std::string name, std::string* out, std::string help, bool required);
    // A closing paragraph of --help (examples).
    void epilog(std::string text) { epilog_ = std::move(text); }

    // Parses argv[first..argc). Returns false when --help was asked for (the
    // usage is printed to stdout; the caller exits 0). Throws UsageError.
    bool parse(int argc, char** argv, int first = 1);
    std::string usage() const;
    // Which options the user actually gave (by first name), e.g. to warn
    // only when the user asked for something.
    bool was_set(const std::string& first_name) const;

  private:
    struct Opt {
        std::vector<std::string> names;
        std::string metavar;  // empty for flags
        std::string help;
        std::string default_text;
        bool optional_value = false;
        std::function<void(const std::string&)> set;  // value (or "" for flags)
        bool seen = false;
    };
    struct Pos {
        std::string name;
        std::string* out;
        std::string help;
        bool required;
        bool seen = false;
    };
    std::string prog_, summary_, epilog_;
    std::vector<Opt> opts_;
    std::vector<Pos> pos_;

    Opt* find(const std::string& name);
};

}  // namespace minfer
