// The structured-output schema corpus (tests/data/schemas/corpus.jsonl,
// written by scripts/gen_schema_corpus.py) and random walks through a
// grammar's token masks, for the tests and the benchmark (no GoogleTest here);
// the validation of outputs by python3-jsonschema (scripts/validate_json.py).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "structured/matcher.h"
#include "util/error.h"

namespace minfer::testing {

struct CorpusSchema {
    std::string name;
    nlohmann::ordered_json schema;     // key order matters: it is the output's
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

struct Walk {
    std::string output;
    bool finished = false;  // ended by end of generation (else it ran out of tokens)
    std::string error;      // a broken invariant: a dead end, EOG allowed while
                            // incomplete, a token of the mask refused
};

// Picks random allowed tokens: fragments holding " ] } or , are favoured two
// times in three so that walks finish, EOG is taken half the time it is
// allowed. check(m, mask) sees every state reached, before its token.
template <typename Check>
Walk random_walk(const structured::TokenMasker& masker,
                 const std::shared_ptr<const structured::CompiledGrammar>& g, std::mt19937_64& rng,
                 int max_tokens, Check&& check) {
    const structured::TokenVocab& v = masker.vocab();
    structured::Matcher m(g);
    structured::TokenBitset mask;
    Walk w;
    std::vector<int32_t> allowed, closing;
    auto is_eog = [&](int32_t id) {
        return std::find(v.eog_ids.begin(), v.eog_ids.end(), id) != v.eog_ids.end();
    };
    for (int step = 0; step < max_tokens; ++step) {
        masker.compute_mask(m, mask);
        check(m, mask);
        allowed.clear();
        closing.clear();
        bool eog_ok = false;
        for (size_t wi = 0; wi < mask.words.size(); ++wi)
            for (uint64_t bits = mask.words[wi]; bits; bits &= bits - 1) {
                int32_t id = int32_t(wi * 64 + size_t(__builtin_ctzll(bits)));
                if (is_eog(id)) {
                    eog_ok = true;
                    continue;
                }
                allowed.push_back(id);
                if (v.bytes[id].find_first_of("\"]},") != std::string::npos) closing.push_back(id);
            }
        if (eog_ok != m.is_complete()) {
            w.error = "EOG allowed != complete after '" + w.output + "'";
            return w;
        }
        if (allowed.empty() && !eog_ok) {
            w.error = "dead end: no token allowed after '" + w.output + "'";
            return w;
        }
        if (eog_ok && (allowed.empty() || rng() % 2 == 0)) {
            if (!masker.accept_token(m, v.eog_ids[0])) w.error = "EOG in the mask refused";
            w.finished = true;
            return w;
        }
        const auto& pool = !closing.empty() && rng() % 3 != 0 ? closing : allowed;
        int32_t id = pool[rng() % pool.size()];
        if (!masker.accept_token(m, id)) {
            w.error =
                "token " + std::to_string(id) + " in the mask refused after '" + w.output + "'";
            return w;
        }
        w.output += v.bytes[id];
    }
    return w;
}

inline bool python_jsonschema_available() {
    return std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") == 0;
}

// Runs scripts/validate_json.py over the outputs; returns its report.
inline std::string validate_outputs(
    const std::vector<std::pair<const CorpusSchema*, std::string>>& outs, int* exit_code) {
    auto dir = std::filesystem::temp_directory_path();
    std::string in = (dir / ("minfer_structured_" + std::to_string(getpid()) + ".jsonl")).string();
    std::string report = in + ".out";
    {
        std::ofstream f(in);
        for (const auto& [c, text] : outs)
            f << nlohmann::ordered_json{{"name", c->name}, {"schema", c->schema}, {"output", text}}
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
