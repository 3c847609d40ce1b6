// minfer info MODEL: what a GGUF file holds, for people (text) or machines
// (--json). Both outputs are rendered from one JSON object of facts, so they
// can never disagree.
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "commands.h"
#include "gguf/file_type.h"
#include "gguf/gguf.h"
#include "util/args.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

using gguf::Value;
using gguf::ValueType;
using nlohmann::json;

// llama.cpp's llama_token_type (tokenizer.ggml.token_type values).
const char* token_type_name(int64_t t) {
    switch (t) {
        case 0:
            return "UNDEFINED";
        case 1:
            return "NORMAL";
        case 2:
            return "UNKNOWN";
        case 3:
            return "CONTROL";
        case 4:
            return "USER_DEFINED";
        case 5:
            return "UNUSED";
        case 6:
            return "BYTE";
    }
    return nullptr;
}

// A float as the shortest text that reads back to the same value in its own
// precision (1e-06 for an f32 epsilon, not 9.99999997e-07).
double tidy_float(double v, ValueType t) {
    if (t != ValueType::FLOAT32 || !std::isfinite(v)) return v;
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
    return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

bool is_int_type(ValueType t) {
    return t != ValueType::FLOAT32 && t != ValueType::FLOAT64 && t != ValueType::BOOL &&
           t != ValueType::STRING && t != ValueType::ARRAY;
}
bool is_signed_type(ValueType t) {
    return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 ||
           t == ValueType::INT64;
}

json scalar_json(const Value& v) {
    switch (v.type) {
        case ValueType::STRING:
            return v.str;
        case ValueType::BOOL:
            return v.u64 != 0;
        case ValueType::FLOAT32:
        case ValueType::FLOAT64:
            return tidy_float(v.f64, v.type);
        default:
            break;
    }
    if (is_signed_type(v.type)) return v.i64;
    return v.u64;
}

std::string array_summary(const Value& v) {
    std::string s = "[";
    s.append(std::to_string(v.array_size())).append(" × ");
    s.append(gguf::value_type_name(v.elem_type)).append("]");
    return s;
}

json value_json(const Value& v) {
    if (v.type != ValueType::ARRAY) return scalar_json(v);
    return json{{"array_of", gguf::value_type_name(v.elem_type)}, {"count", v.array_size()}};
}

// Printable, one line, at most `max` characters of the original.
std::string escape(const std::string& s, size_t max = 60) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < max; ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    if (s.size() > max) out += "…";
    return out;
}

std::string number_text(const json& j) {
    if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
    if (j.is_number_float()) {
        const double d = j.get<double>();
        // Integral values read better in full (1000000, not 1e+06).
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.1f", d);
            return buf;
        }
    }
    if (j.is_string()) {
        std::string s = "'";
        s.append(escape(j.get<std::string>())).append("'");
        return s;
    }
    return j.dump();
}

std::string shape_text(const json& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i].get<int64_t>());
    }
    return s + "]";
}

std::string mib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

json collect(const gguf::File& f, bool with_tensors) {
    json j;
    j["file"] = {{"path", f.path()},
                 {"gguf_version", f.version()},
                 {"size_bytes", f.file_size()},
                 {"size_mib", static_cast<double>(f.file_size()) / (1024.0 * 1024.0)},
                 {"alignment", f.alignment()},
                 {"data_offset", f.data_offset()}};

    std::set<std::string> shown;  // keys already reported in a section
    auto take = [&](const std::string& key) -> const Value* {
        const Value* v = f.find(key);
        if (v) shown.insert(key);
        return v;
    };

    take("general.alignment");  // shown on the file line
    const std::string arch = f.get_string("general.architecture").value_or("");
    take("general.architecture");
    j["architecture"] = arch.empty() ? json(nullptr) : json(arch);
    const Value* name = take("general.name");
    j["name"] = name && name->type == ValueType::STRING ? json(name->str) : json(nullptr);

    json hp = json::object();
    if (!arch.empty()) {
        for (const auto& kv : f.metadata()) {
            if (kv.key.rfind(arch + ".", 0) == 0 && kv.value.type != ValueType::ARRAY) {
                hp[kv.key] = scalar_json(kv.value);
                shown.insert(kv.key);
            }
        }
    }
    j["hparams"] = hp;

    if (const Value* ft = take("general.file_type"); ft && is_int_type(ft->type)) {
        const uint32_t id = static_cast<uint32_t>(is_signed_type(ft->type) ? ft->i64 : ft->u64);
        auto n = gguf::file_type_name(id & ~1024u);
        j["file_type"] = {{"id", id}, {"name", n ? json(std::string(*n)) : json(nullptr)}};
    } else {
        j["file_type"] = nullptr;
    }

    // Tokenizer summary.
    json tok = json::object();
    const std::vector<std::string>* tokens = nullptr;
    if (const Value* v = take("tokenizer.ggml.tokens");
        v && v->type == ValueType::ARRAY && v->elem_type == ValueType::STRING)
        tokens = &v->arr_str;
    if (const Value* v = take("tokenizer.ggml.model"); v && v->type == ValueType::STRING)
        tok["model"] = v->str;
    if (const Value* v = take("tokenizer.ggml.pre"); v && v->type == ValueType::STRING)
        tok["pre"] = v->str;
    tok["n_tokens"] = tokens ? tokens->size() : 0;
    if (const Value* v = take("tokenizer.ggml.merges"); v && v->type == ValueType::ARRAY)
        tok["n_merges"] = v->array_size();
    for (const char* which : {"bos", "eos", "padding", "unknown", "eot", "sep", "mask"}) {
        const std::string key = std::string("tokenizer.ggml.") + which + "_token_id";
        const Value* v = take(key);
        if (!v || !is_int_type(v->type)) continue;
        const int64_t id = is_signed_type(v->type) ? v->i64 : static_cast<int64_t>(v->u64);
        json t = {{"id", id}};
        if (tokens && id >= 0 && static_cast<uint64_t>(id) < tokens->size())
            t["text"] = (*tokens)[static_cast<size_t>(id)];
        tok[which] = t;
    }
    if (const Value* v = take("tokenizer.ggml.token_type");
        v && v->type == ValueType::ARRAY && !v->arr_int.empty()) {
        std::map<int64_t, size_t> counts;
        for (int64_t t : v->arr_int) ++counts[t];
        json c = json::object();
        for (auto [t, n] : counts) {
            const char* nm = token_type_name(t);
            c[nm ? nm : std::to_string(t)] = n;
        }
        tok["token_types"] = c;
    }
    const Value* tmpl = take("tokenizer.chat_template");
    tok["chat_template"] = tmpl != nullptr;
    if (tmpl && tmpl->type == ValueType::STRING) tok["chat_template_bytes"] = tmpl->str.size();
    j["tokenizer"] = tok;

    // Sizes and tensors.
    uint64_t n_params = 0, n_bytes = 0;
    // MoE: a token reads expert_used_count of the expert_count experts'
    // slices of every *_exps tensor (and everything else)
    const std::string arch_name = f.get_string("general.architecture").value_or("");
    const int64_t n_expert = f.get_int(arch_name + ".expert_count").value_or(0);
    const int64_t n_expert_used = f.get_int(arch_name + ".expert_used_count").value_or(0);
    double n_active = 0;
    std::map<std::string, size_t> per_type;
    json tensors = json::array();
    for (const auto& t : f.tensors()) {
        const int64_t n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];  // validated to fit
        n_params += static_cast<uint64_t>(n);
        const bool experts = n_expert > 0 && t.name.find("_exps.") != std::string::npos;
        n_active += experts ? static_cast<double>(n) * static_cast<double>(n_expert_used) /
                                  static_cast<double>(n_expert)
                            : static_cast<double>(n);
        n_bytes += t.nbytes;
        ++per_type[std::string(tensor::dtype_name(t.type))];
        if (with_tensors) {
            json shape = json::array();
            for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
            tensors.push_back({{"name", t.name},
                               {"type", tensor::dtype_name(t.type)},
                               {"shape", shape},
                               {"bytes", t.nbytes},
                               {"offset", t.offset}});
        }
    }
    j["sizes"] = {
        {"n_params", n_params},
        {"tensor_bytes", n_bytes},
        {"bits_per_weight",
         n_params ? 8.0 * static_cast<double>(n_bytes) / static_cast<double>(n_params) : 0.0}};
    if (n_expert > 0) {
        j["sizes"]["n_expert"] = n_expert;
        j["sizes"]["n_expert_used"] = n_expert_used;
        j["sizes"]["n_params_active"] = static_cast<uint64_t>(n_active);
    }
    j["n_tensors"] = f.tensors().size();
    j["tensor_types"] = per_type;

    json other = json::object();
    for (const auto& kv : f.metadata())
        if (!shown.count(kv.key)) other[kv.key] = value_json(kv.value);
    j["metadata"] = other;
    if (with_tensors) j["tensors"] = tensors;
    return j;
}

void print_text(const gguf::File& f, const json& j, bool with_tensors) {
    std::printf("file:           %s\n", f.path().c_str());
    std::printf("format:         GGUF v%u, %s (%" PRIu64 " bytes), alignment %zu, data at %zu\n",
                f.version(), mib(f.file_size()).c_str(), static_cast<uint64_t>(f.file_size()),
                f.alignment(), f.data_offset());
    std::printf("architecture:   %s\n", j["architecture"].is_null()
                                            ? "(none)"
                                            : j["architecture"].get<std::string>().c_str());
    if (!j["name"].is_null())
        std::printf("name:           %s\n", escape(j["name"].get<std::string>()).c_str());
    if (j["file_type"].is_null()) {
        std::printf("file type:      (not given)\n");
    } else {
        std::printf("file type:      %s\n",
                    gguf::describe_file_type(j["file_type"]["id"].get<uint32_t>()).c_str());
    }

    std::printf("\nhyper-parameters:\n");
    size_t w = 0;
    for (auto& [k, v] : j["hparams"].items()) w = std::max(w, k.size());
    // Print in file order (json objects are sorted by key).
    for (const auto& kv : f.metadata())
        if (j["hparams"].contains(kv.key))
            std::printf("  %-*s  %s\n", static_cast<int>(w), kv.key.c_str(),
                        number_text(j["hparams"][kv.key]).c_str());
    if (j["hparams"].empty()) std::printf("  (none)\n");

    const json& tok = j["tokenizer"];
    std::printf("\ntokenizer:\n");
    if (tok.contains("model"))
        std::printf("  model          %s\n", tok["model"].get<std::string>().c_str());
    if (tok.contains("pre"))
        std::printf("  pre            %s\n", tok["pre"].get<std::string>().c_str());
    std::printf("  tokens         %zu\n", tok["n_tokens"].get<size_t>());
    if (tok.contains("n_merges"))
        std::printf("  merges         %zu\n", tok["n_merges"].get<size_t>());
    for (const char* which : {"bos", "eos", "padding", "unknown", "eot", "sep", "mask"}) {
        if (!tok.contains(which)) continue;
        const json& t = tok[which];
        std::string label = std::string(which) + " id";
        std::printf("  %-14s %" PRId64 "%s\n", label.c_str(), t["id"].get<int64_t>(),
                    t.contains("text") ? (" '" + escape(t["text"].get<std::string>()) + "'").c_str()
                                       : " (out of range)");
    }
    if (tok.contains("token_types")) {
        std::string s;
        for (auto& [k, v] : tok["token_types"].items())
            s += (s.empty() ? "" : ", ") + k + " " + std::to_string(v.get<size_t>());
        std::printf("  token types    %s\n", s.c_str());
    }
    if (tok["chat_template"].get<bool>()) {
        std::printf("  chat template  yes (%zu bytes)\n",
                    tok.value("chat_template_bytes", static_cast<size_t>(0)));
    } else {
        std::printf("  chat template  no\n");
    }

    const json& sz = j["sizes"];
    const uint64_t n_params = sz["n_params"].get<uint64_t>();
    std::printf("\nsizes:\n");
    std::printf("  parameters     %" PRIu64 " (%.2f M)\n", n_params,
                static_cast<double>(n_params) / 1e6);
    if (sz.contains("n_params_active")) {
        const auto active = sz["n_params_active"].get<uint64_t>();
        std::printf("  experts        %" PRId64 ", %" PRId64 " used per token\n",
                    sz["n_expert"].get<int64_t>(), sz["n_expert_used"].get<int64_t>());
        std::printf("  active/token   %" PRIu64 " (%.2f M)\n", active,
                    static_cast<double>(active) / 1e6);
    }
    std::printf("  tensor bytes   %" PRIu64 " (%s)\n", sz["tensor_bytes"].get<uint64_t>(),
                mib(sz["tensor_bytes"].get<uint64_t>()).c_str());
    std::printf("  bits/weight    %.2f\n", sz["bits_per_weight"].get<double>());

    std::printf("\nother metadata:\n");
    size_t wk = 0;
    for (auto& [k, v] : j["metadata"].items()) wk = std::max(wk, k.size());
    for (const auto& kv : f.metadata()) {
        if (!j["metadata"].contains(kv.key)) continue;
        const std::string text = kv.value.type == ValueType::ARRAY
                                     ? array_summary(kv.value)
                                     : number_text(scalar_json(kv.value));
        std::printf("  %-*s  %s\n", static_cast<int>(wk), kv.key.c_str(), text.c_str());
    }
    if (j["metadata"].empty()) std::printf("  (none)\n");

    std::printf("\ntensors: %zu", f.tensors().size());
    std::string types;
    for (auto& [k, v] : j["tensor_types"].items())
        types += (types.empty() ? "" : ", ") + k + " " + std::to_string(v.get<size_t>());
    std::printf("%s%s%s\n", types.empty() ? "" : " (", types.c_str(), types.empty() ? "" : ")");
    if (!with_tensors) return;
    size_t wn = 4;
    for (const auto& t : f.tensors()) wn = std::max(wn, t.name.size());
    std::printf("  %-*s  %-7s %-24s %12s\n", static_cast<int>(wn), "name", "type", "shape",
                "bytes");
    for (const auto& t : j["tensors"])
        std::printf("  %-*s  %-7s %-24s %12" PRIu64 "\n", static_cast<int>(wn),
                    t["name"].get<std::string>().c_str(), t["type"].get<std::string>().c_str(),
                    shape_text(t["shape"]).c_str(), t["bytes"].get<uint64_t>());
}

}  // namespace

int cmd_info(int argc, char** argv, int first) {
    std::string model_pos, model_opt;
    bool as_json = false, no_tensors = false;
    ArgParser p("minfer info", "describe a GGUF model: file, hyper-parameters, tokenizer, tensors");
    p.positional("MODEL", &model_pos, "the GGUF file to describe", false);
    p.option({"-m", "--model"}, &model_opt, "FILE", "the GGUF file (instead of MODEL)");
    p.flag({"--json"}, &as_json, "print one JSON object instead of text (default: text)");
    p.flag({"--no-tensors"}, &no_tensors, "leave out the per-tensor table (default: shown)");
    p.epilog(
        "examples:\n  minfer info model.gguf\n  minfer info -m model.gguf --json --no-tensors");
    if (!p.parse(argc, argv, first)) return 0;
    if (!model_pos.empty() && !model_opt.empty() && model_pos != model_opt)
        throw UsageError("give the model once: either MODEL or -m, not both");
    const std::string path = model_pos.empty() ? model_opt : model_pos;
    if (path.empty()) throw UsageError("no model given (minfer info MODEL)");

    const gguf::File f = gguf::File::open(path);
    const json j = collect(f, !no_tensors);
    if (as_json) {
        // Replace invalid UTF-8 (token text can hold byte fragments) instead of throwing.
        std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    } else {
        print_text(f, j, !no_tensors);
    }
    return 0;
}

}  // namespace minfer::cli
