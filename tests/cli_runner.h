// Test support: runs the built minfer binary (MINFER_BINARY) with arguments
// and optional standard input, and captures its exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace minfer::testing {

struct CliResult {
    int code = -1;
    std::string out;
    std::string err;
};

inline std::string read_whole(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

// `args` is pasted into a shell command line: quote what needs quoting.
inline CliResult run_cli(const std::string& args, const std::string& stdin_text = "") {
    namespace fs = std::filesystem;
    static int counter = 0;
    const fs::path dir = fs::temp_directory_path() / ("minfer-cli-" + std::to_string(::getpid()) +
                                                      "-" + std::to_string(counter++));
    fs::create_directories(dir);
    std::ofstream(dir / "in", std::ios::binary) << stdin_text;
    const std::string cmd = std::string(MINFER_BINARY) + " " + args + " < " +
                            (dir / "in").string() + " > " + (dir / "out").string() + " 2> " +
                            (dir / "err").string();
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_whole(dir / "out");
    r.err = read_whole(dir / "err");
    fs::remove_all(dir);
    return r;
}

}  // namespace minfer::testing
