// Outputs checked against their JSON schemas by a real validator, not by the
// grammar that produced them: Debian's python3-jsonschema, through
// scripts/validate_json.py (Draft 2020-12, formats checked).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace minfer::testing {

struct JsonOutput {
    std::string name;  // names the output in the report
    nlohmann::ordered_json schema;
    std::string output;  // the generated text
};

inline bool python_jsonschema_available() {
    return std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") == 0;
}

// Runs scripts/validate_json.py over the outputs; returns its report (one
// line per failure, then "validated N outputs, M failed") and sets its exit
// code (0: all valid).
inline std::string validate_json_outputs(const std::vector<JsonOutput>& outs, int* exit_code) {
    static int calls = 0;
    auto dir = std::filesystem::temp_directory_path();
    std::string in = (dir / ("minfer_validate_" + std::to_string(getpid()) + "_" +
                             std::to_string(calls++) + ".jsonl"))
                         .string();
    std::string report = in + ".out";
    {
        std::ofstream f(in);
        for (const auto& o : outs)
            f << nlohmann::ordered_json{{"name", o.name},
                                        {"schema", o.schema},
                                        {"output", o.output}}
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    }
    std::string cmd = "python3 " + std::string(MINFER_SOURCE_DIR) + "/scripts/validate_json.py " +
                      in + " > " + report + " 2>&1";
    int rc = std::system(cmd.c_str());
    *exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    std::ifstream r(report);
    std::string text((std::istreambuf_iterator<char>(r)), std::istreambuf_iterator<char>());
    std::filesystem::remove(in);
    std::filesystem::remove(report);
    return text;
}

}  // namespace minfer::testing
