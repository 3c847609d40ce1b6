// The structured-output schema corpus (tests/data/schemas/corpus.jsonl,
// written by scripts/gen_schema_corpus.py), for the tests and the benchmark.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace minfer::testing {

struct CorpusSchema {
    std::string name;
    nlohmann::ordered_json schema;    // key order matters: it is the output's
    std::vector<std::string> valid;    // texts the grammar must accept
    std::vector<std::string> refused;  // texts it must not
};

inline std::vector<CorpusSchema> load_schema_corpus() {
    const std::string path = std::string(MINFER_SOURCE_DIR) + "/tests/data/schemas/corpus.jsonl";
    std::ifstream in(path);
    if (!in) throw Error("cannot open " + path);
    std::vector<CorpusSchema> out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        auto j = nlohmann::ordered_json::parse(line);
        CorpusSchema c;
        c.name = j.at("name").get<std::string>();
        c.schema = j.at("schema");
        for (const auto& v : j.at("valid")) c.valid.push_back(v.get<std::string>());
        for (const auto& v : j.at("refused")) c.refused.push_back(v.get<std::string>());
        out.push_back(std::move(c));
    }
    return out;
}

}  // namespace minfer::testing
