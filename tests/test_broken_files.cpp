// A corpus of broken model files, each made from a valid tiny model
// (tests/tiny_model.h, gguf::Writer::to_bytes) by changing bytes in place
// (or, for a few semantic cases, one value through the writer), and run
// through the real binary: `minfer info FILE` and `minfer -m FILE -p hi -n 1`.
// Each must exit 1 with one readable error on stderr that names what is wrong
// (the key, the tensor, the byte offset), never crash or print anything on
// stdout. A file that is valid GGUF but not a usable model (a shape that
// disagrees with the hyper-parameters, a missing tensor, a bad vocabulary) is
// still described by `info` (exit 0) and refused by generation.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "cli_runner.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tiny_model.h"
#include "util/error.h"

using minfer::testing::run_cli;
namespace gguf = minfer::gguf;
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

minfer::testing::TinyModelSpec tiny_spec() {
    minfer::testing::TinyModelSpec s;  // qwen2, n_embd 64, 4 heads (2 KV) of 16, n_ff 96, 2 layers
    return s;
}

const Bytes& good_bytes() {
    static const Bytes b = minfer::testing::make_tiny_model(tiny_spec()).to_bytes();
    return b;
}

// Where things are in the writer's layout, found by their length-prefixed
// names (each name occurs once, as a u64 length then the bytes).
size_t find_named(const Bytes& b, const std::string& name) {
    Bytes pat(8);
    const uint64_t n = name.size();
    std::memcpy(pat.data(), &n, 8);
    pat.insert(pat.end(), name.begin(), name.end());
    auto it = std::search(b.begin(), b.end(), pat.begin(), pat.end());
    if (it == b.end()) throw std::runtime_error("test: '" + name + "' not found");
    return static_cast<size_t>(it - b.begin());
}
// Offset of the u32 value type of a key, and of its value.
size_t key_type_at(const Bytes& b, const std::string& key) {
    return find_named(b, key) + 8 + key.size();
}
size_t key_value_at(const Bytes& b, const std::string& key) {
    return key_type_at(b, key) + 4;
}
// Tensor info fields.
size_t tensor_ndims_at(const Bytes& b, const std::string& t) {
    return find_named(b, t) + 8 + t.size();
}
uint32_t tensor_ndims(const Bytes& b, const std::string& t) {
    uint32_t n;
    std::memcpy(&n, b.data() + tensor_ndims_at(b, t), 4);
    return n;
}
size_t tensor_ne_at(const Bytes& b, const std::string& t, int d) {
    return tensor_ndims_at(b, t) + 4 + 8 * size_t(d);
}
size_t tensor_type_at(const Bytes& b, const std::string& t) {
    return tensor_ne_at(b, t, int(tensor_ndims(b, t)));
}
size_t tensor_offset_at(const Bytes& b, const std::string& t) {
    return tensor_type_at(b, t) + 4;
}

template <typename T>
void poke(Bytes& b, size_t at, T v) {
    std::memcpy(b.data() + at, &v, sizeof(T));
}
template <typename T>
T peek(const Bytes& b, size_t at) {
    T v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    return v;
}
void rename(Bytes& b, const std::string& from, const std::string& to) {
    ASSERT_EQ(from.size(), to.size());
    const size_t at = find_named(b, from) + 8;
    std::memcpy(b.data() + at, to.data(), to.size());
}

const std::vector<std::string>& tensor_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        const gguf::File f = gguf::File::parse(good_bytes().data(), good_bytes().size());
        for (const auto& t : f.tensors()) v.push_back(t.name);
        return v;
    }();
    return names;
}
size_t infos_begin(const Bytes& b) {
    return find_named(b, tensor_names().front());
}
size_t infos_end(const Bytes& b) {
    return tensor_offset_at(b, tensor_names().back()) + 8;
}
size_t data_begin(const Bytes& b) {
    return gguf::File::parse(b.data(), b.size()).data_offset();
}

struct Case {
    std::string name;
    std::function<void(Bytes&)> mutate;     // from the good bytes
    std::vector<std::string> expect;        // substrings of the error
    bool info_fails = true;                 // a GGUF-level fault; false: only the model is bad
    std::function<Bytes()> make = nullptr;  // instead of mutate: bytes from the writer
};

fs::path write_case(const std::string& name, const Bytes& b) {
    const fs::path p = fs::temp_directory_path() /
                       ("minfer-broken-" + std::to_string(::getpid()) + "-" + name + ".gguf");
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    return p;
}

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

void expect_clean_error(const std::string& what, const minfer::testing::CliResult& r,
                        const std::vector<std::string>& expect) {
    EXPECT_EQ(r.code, 1) << what << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("minfer: error: ", 0), 0u) << what << "\n" << r.err;
    // One line: a message, not a dump.
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << "\n" << r.err;
    EXPECT_FALSE(has(r.err, "internal error")) << what;
    for (const auto& e : expect)
        EXPECT_TRUE(has(r.err, e)) << what << ": expected '" << e << "' in\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << what << "\n" << r.out;
}

void run_cases(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
        Bytes b;
        if (c.make) {
            b = c.make();
        } else {
            b = good_bytes();
            c.mutate(b);
        }
        const fs::path p = write_case(c.name, b);
        auto info = run_cli("info " + p.string());
        if (c.info_fails) {
            expect_clean_error(c.name + " (info)", info, c.expect);
        } else {
            EXPECT_EQ(info.code, 0) << c.name << " (info)\n" << info.err;
        }
        auto gen = run_cli("-m " + p.string() + " -p hi -n 1");
        expect_clean_error(c.name + " (generate)", gen, c.expect);
        // The error names the file.
        EXPECT_TRUE(has(gen.err, p.string())) << c.name << "\n" << gen.err;
        fs::remove(p);
    }
}

std::string str(uint64_t v) {
    return std::to_string(v);
}

}  // namespace

// The cases of each test below, as data: the corpus count needs them without
// running them (CTest runs every test in a process of its own).
namespace {

std::vector<Case> truncation_cases() {
    const Bytes& g = good_bytes();
    const size_t tmpl = key_value_at(g, "tokenizer.chat_template");
    const size_t tokens = key_value_at(g, "tokenizer.ggml.tokens");
    const std::string last = tensor_names().back();
    const size_t last_ne1 = tensor_ne_at(g, last, 1);
    const size_t pad = infos_end(g) + 1;
    return {
        {"trunc-header",
         [](Bytes& b) { b.resize(20); },
         {"metadata count at offset 16 needs 8 bytes, but the file ends at 20 bytes"}},
        {"trunc-kv-array",
         [=](Bytes& b) { b.resize(tokens + 12 + 2200); },
         {"key 'tokenizer.ggml.tokens'[", "bytes"}},
        {"trunc-kv-string",
         [=](Bytes& b) { b.resize(tmpl + 20); },
         {"key 'tokenizer.chat_template' at offset " + str(tmpl), "has length",
          "bytes left in the file"}},
        {"trunc-tensor-info",
         [=](Bytes& b) { b.resize(last_ne1 + 3); },
         {"tensor '" + last + "' ne[1] at offset " + str(last_ne1) + " needs 8 bytes",
          "file ends at " + str(last_ne1 + 3) + " bytes"}},
        {"trunc-padding",
         [=](Bytes& b) { b.resize(pad); },
         {"tensor 'token_embd.weight': data [offset " + str(data_begin(g)),
          "runs past the end of the file (" + str(pad) + " bytes)"}},
        {"trunc-data",
         [=](Bytes& b) { b.resize(g.size() - 100); },
         {"tensor '" + last + "'",
          "runs past the end of the file (" + str(g.size() - 100) + " bytes)"}},
    };
}

std::vector<Case> huge_count_cases() {
    const Bytes& g = good_bytes();
    const size_t name_at = find_named(g, "general.name");
    const size_t tokens = key_value_at(g, "tokenizer.ggml.tokens");
    const size_t t0 = infos_begin(g);
    return {
        {"tensor-count-max",
         [](Bytes& b) { poke<uint64_t>(b, 8, kU64Max); },
         {"header claims " + str(kU64Max) + " tensors", "truncated"}},
        {"kv-count-max",
         [](Bytes& b) { poke<uint64_t>(b, 16, kU64Max); },
         {"header claims " + str(kU64Max) + " metadata entries"}},
        {"key-length-max",
         [=](Bytes& b) { poke<uint64_t>(b, name_at, kU64Max); },
         {"key of metadata entry 1 at offset " + str(name_at), "has length " + str(kU64Max)}},
        {"string-value-length-2pow63",
         [=](Bytes& b) { poke<uint64_t>(b, key_value_at(b, "general.name"), uint64_t(1) << 63); },
         {"key 'general.name' at offset", "has length " + str(uint64_t(1) << 63)}},
        {"array-count-max",
         [=](Bytes& b) { poke<uint64_t>(b, tokens + 4, kU64Max); },
         {"key 'tokenizer.ggml.tokens' at offset " + str(tokens),
          "claims " + str(kU64Max) + " elements of type str"}},
        {"tensor-name-length-max",
         [=](Bytes& b) { poke<uint64_t>(b, t0, kU64Max - 7); },
         {"name of tensor 0 at offset " + str(t0), "has length " + str(kU64Max - 7)}},
        {"tensor-dim-2pow63",
         [](Bytes& b) {
             poke<uint64_t>(b, tensor_ne_at(b, "token_embd.weight", 1), uint64_t(1) << 63);
         },
         {"tensor 'token_embd.weight' ne[1] = " + str(uint64_t(1) << 63) + " is out of range"}},
        {"tensor-elements-overflow",
         [](Bytes& b) {
             poke<uint64_t>(b, tensor_ne_at(b, "token_embd.weight", 1), uint64_t(1) << 62);
         },
         {"tensor 'token_embd.weight' has too many elements"}},
        {"tensor-bytes-overflow",
         [](Bytes& b) {
             // 2^32 x 2^30 f32 elements = 2^62 elements (fits) but 2^64 bytes.
             poke<uint64_t>(b, tensor_ne_at(b, "token_embd.weight", 0), uint64_t(1) << 32);
             poke<uint64_t>(b, tensor_ne_at(b, "token_embd.weight", 1), uint64_t(1) << 30);
         },
         {"tensor 'token_embd.weight' byte size overflows"}},
        {"tensor-offset-near-2pow64",
         [](Bytes& b) {
             poke<uint64_t>(b, tensor_offset_at(b, "output_norm.weight"), kU64Max - 31);
         },
         {"tensor 'output_norm.weight': data [data offset " + str(kU64Max - 31),
          "runs past the end"}},
    };
}

std::vector<Case> placement_cases() {
    const Bytes& g = good_bytes();
    const uint64_t embd_off = peek<uint64_t>(g, tensor_offset_at(g, "token_embd.weight"));
    return {
        {"data-past-the-end",
         [](Bytes& b) {
             const size_t at = tensor_offset_at(b, "blk.1.ffn_down.weight");
             poke<uint64_t>(b, at, peek<uint64_t>(b, at) + 4096);
         },
         {"tensor 'blk.1.ffn_down.weight': data [offset",
          "runs past the end of the file (" + str(g.size()) + " bytes)"}},
        {"overlapping-tensors",
         [=](Bytes& b) {
             poke<uint64_t>(b, tensor_offset_at(b, "output_norm.weight"), embd_off + 64);
         },
         {"overlaps tensor 'token_embd.weight' [data offset " + str(embd_off)}},
        {"misaligned-offset",
         [](Bytes& b) {
             const size_t at = tensor_offset_at(b, "blk.0.attn_q.weight");
             poke<uint64_t>(b, at, peek<uint64_t>(b, at) + 4);
         },
         {"tensor 'blk.0.attn_q.weight' data offset", "is not a multiple of the alignment 32"}},
        {"unknown-tensor-type",
         [](Bytes& b) { poke<uint32_t>(b, tensor_type_at(b, "blk.0.ffn_up.weight"), 99); },
         {"tensor 'blk.0.ffn_up.weight' has unknown or unsupported tensor type id 99 at offset " +
          str(tensor_type_at(g, "blk.0.ffn_up.weight"))}},
        {"tensor-type-max",
         [](Bytes& b) { poke<uint32_t>(b, tensor_type_at(b, "output_norm.weight"), 0xFFFFFFFFu); },
         {"tensor 'output_norm.weight' has unknown or unsupported tensor type id 4294967295"}},
        {"row-not-multiple-of-block",
         // q4_K (id 12) has blocks of 256; the row has 64 elements.
         [](Bytes& b) { poke<uint32_t>(b, tensor_type_at(b, "blk.0.ffn_up.weight"), 12); },
         {"tensor 'blk.0.ffn_up.weight' of type q4_K has rows of 64 elements, not a multiple of "
          "the block size 256"}},
        {"zero-dims",
         [](Bytes& b) { poke<uint32_t>(b, tensor_ndims_at(b, "output_norm.weight"), 0); },
         {"tensor 'output_norm.weight' has 0 dimensions (must be 1 to 4)"}},
        {"alignment-not-power-of-two",
         nullptr,
         {"key 'general.alignment' is 48, not a nonzero power of two"},
         true,
         [] {
             gguf::Writer w = minfer::testing::make_tiny_model(tiny_spec());
             w.set_alignment(64);
             Bytes b = w.to_bytes();
             poke<uint32_t>(b, key_value_at(b, "general.alignment"), 48);
             return b;
         }},
    };
}

std::vector<Case> metadata_cases() {
    const Bytes& g = good_bytes();
    return {
        {"duplicate-key",
         [](Bytes& b) { rename(b, "tokenizer.ggml.model", "qwen2.rope.freq_base"); },
         {"duplicate metadata key 'qwen2.rope.freq_base' at offset " +
          str(find_named(g, "tokenizer.ggml.model"))}},
        {"invalid-value-type",
         [](Bytes& b) { poke<uint32_t>(b, key_type_at(b, "general.name"), 13); },
         {"key 'general.name' has invalid value type 13 at offset " +
          str(key_type_at(g, "general.name"))}},
        {"bool-of-value-2",
         [](Bytes& b) { b[key_value_at(b, "tokenizer.ggml.add_bos_token")] = 2; },
         {"key 'tokenizer.ggml.add_bos_token' at offset", "is a bool of value 2"}},
        {"bad-magic", [](Bytes& b) { b[0] = 'X'; }, {"bad magic 'XGUF'", "not a GGUF file"}},
        {"version-1",
         [](Bytes& b) { poke<uint32_t>(b, 4, 1); },
         {"GGUF version 1 is not supported"}},
        {"version-99", [](Bytes& b) { poke<uint32_t>(b, 4, 99); }, {"unsupported GGUF version 99"}},
    };
}

std::vector<Case> model_fault_cases() {
    return {
        {"shape-disagrees-with-hparams",
         [](Bytes& b) {  // [64, 32] written as [32, 64]: same bytes, wrong shape
             poke<uint64_t>(b, tensor_ne_at(b, "blk.0.attn_k.weight", 0), 32);
             poke<uint64_t>(b, tensor_ne_at(b, "blk.0.attn_k.weight", 1), 64);
         },
         {"tensor 'blk.0.attn_k.weight' has shape [32, 64], the hyper-parameters ask for [64, 32]"},
         false},
        {"hparam-disagrees-with-shapes",
         [](Bytes& b) { poke<uint32_t>(b, key_value_at(b, "qwen2.feed_forward_length"), 128); },
         {"tensor 'blk.0.ffn_gate.weight' has shape [64, 96], the hyper-parameters ask for [64, "
          "128]"},
         false},
        {"missing-tensor",
         [](Bytes& b) { rename(b, "output_norm.weight", "output_norm.weighx"); },
         {"missing tensor 'output_norm.weight'"},
         false},
        {"missing-layer",
         [](Bytes& b) { poke<uint32_t>(b, key_value_at(b, "qwen2.block_count"), 3); },
         {"missing tensor 'blk.2.attn_norm.weight'"},
         false},
        {"duplicate-tensor-name",
         [](Bytes& b) { rename(b, "blk.1.ffn_up.weight", "blk.0.ffn_up.weight"); },
         {"duplicate tensor name 'blk.0.ffn_up.weight' at offset " +
          str(find_named(good_bytes(), "blk.1.ffn_up.weight"))}},
        {"missing-hparam",
         [](Bytes& b) { rename(b, "qwen2.block_count", "qwen2.block_cnunt"); },
         {"missing hyper-parameter 'qwen2.block_count'"},
         false},
        {"hparam-out-of-range",
         [](Bytes& b) { poke<uint32_t>(b, key_value_at(b, "qwen2.context_length"), 0); },
         {"hyper-parameter 'qwen2.context_length' = 0 is out of range"},
         false},
        {"heads-not-multiple-of-kv-heads",
         [](Bytes& b) { poke<uint32_t>(b, key_value_at(b, "qwen2.attention.head_count_kv"), 3); },
         {"attention.head_count (4) is not a multiple of attention.head_count_kv (3)"},
         false},
        {"unsupported-architecture",
         [](Bytes& b) { rename(b, "qwen2", "qwen9"); },
         {"unsupported architecture 'qwen9'"},
         false},
        {"norm-not-f32",  // f16 is half the bytes: still inside the file
         [](Bytes& b) { poke<uint32_t>(b, tensor_type_at(b, "output_norm.weight"), 1); },
         {"tensor 'output_norm.weight' is f16; minfer expects f32 here"},
         false},
        {"i32-weight",  // i32 (26) has the size of f32
         [](Bytes& b) { poke<uint32_t>(b, tensor_type_at(b, "blk.1.ffn_up.weight"), 26); },
         {"tensor 'blk.1.ffn_up.weight' has type i32, which is not a weight type"},
         false},
        {"vocabulary-shorter-than-embedding",
         nullptr,
         {"the vocabulary has 200 tokens but token_embd.weight has 264 rows"},
         false,
         [] {
             gguf::Writer w = minfer::testing::make_tiny_model(tiny_spec());
             std::vector<std::string> tokens;
             for (int i = 0; i < 200; ++i) tokens.push_back(std::to_string(i) + "t");
             w.set_string_array("tokenizer.ggml.tokens", tokens);
             return w.to_bytes();
         }},
        {"unsupported-tokenizer-model",
         [](Bytes& b) { rename(b, "gpt2", "gpt9"); },
         {"unsupported tokenizer.ggml.model 'gpt9'"},
         false},
        {"duplicate-token",  // the byte token "b" becomes a second "a"
         [](Bytes& b) {
             const size_t arr = key_value_at(b, "tokenizer.ggml.tokens") + 12;
             Bytes pat = {1, 0, 0, 0, 0, 0, 0, 0, 'b'};
             auto it = std::search(b.begin() + long(arr), b.end(), pat.begin(), pat.end());
             ASSERT_NE(it, b.end());
             *(it + 8) = 'a';
         },
         {"duplicate token 'a' (ids 97 and 98)"},
         false},
    };
}

}  // namespace

TEST(BrokenFiles, TheUnbrokenModelWorks) {
    const fs::path p = write_case("good", good_bytes());
    auto r = run_cli("-m " + p.string() + " -p hi -n 1");
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(run_cli("info " + p.string()).code, 0);
    fs::remove(p);
    // The layout the cases below rely on: padding exists between the tensor
    // infos and the data.
    const Bytes& b = good_bytes();
    EXPECT_LT(infos_end(b), data_begin(b));
}

TEST(BrokenFiles, TruncatedInsideEverySection) {
    run_cases(truncation_cases());
}

TEST(BrokenFiles, EveryTruncationIsAnErrorInProcess) {
    // The binary runs one cut per section above; here every cut of the header
    // region and every 61st of the data go through the parser and the model
    // (a crash or a sanitizer report fails the test).
    const Bytes& g = good_bytes();
    const size_t header_end = data_begin(g);
    int n = 0;
    for (size_t cut = 0; cut < g.size(); cut += cut < header_end ? 1 : 61) {
        EXPECT_THROW(
            {
                auto f = gguf::File::parse(g.data(), cut, "cut");
                auto m = minfer::model::Model::from_file(std::move(f));
            },
            minfer::Error)
            << "cut at " << cut;
        ++n;
    }
    EXPECT_GT(n, 1000);
}

TEST(BrokenFiles, CountsAndLengthsNear2Pow64) {
    run_cases(huge_count_cases());
}

TEST(BrokenFiles, TensorDataPlacement) {
    run_cases(placement_cases());
}

TEST(BrokenFiles, MetadataFaults) {
    run_cases(metadata_cases());
}

TEST(BrokenFiles, ModelFaults) {
    run_cases(model_fault_cases());
}

constexpr size_t kNotAModelCases = 4;

TEST(BrokenFiles, NotAModelAtAll) {
    const fs::path empty = write_case("empty", {});
    const std::string text = "This is a README, not a model.\n";
    const fs::path readme = write_case("text", Bytes(text.begin(), text.end()));
    const fs::path dir =
        fs::temp_directory_path() / ("minfer-broken-dir-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    struct C {
        fs::path p;
        std::vector<std::string> expect;
    };
    const std::vector<C> cases = {
        C{empty, {"empty file (0 bytes), not a GGUF model"}},
        C{readme, {"bad magic 'This'", "not a GGUF file"}},
        C{dir, {"is a directory, not a model file"}},
        C{fs::path("/nonexistent/model.gguf"), {"cannot open '/nonexistent/model.gguf'"}}};
    ASSERT_EQ(cases.size(), kNotAModelCases);
    for (const C& c : cases) {
        expect_clean_error(c.p.string() + " (info)", run_cli("info " + c.p.string()), c.expect);
        auto gen = run_cli("-m " + c.p.string() + " -p hi -n 1");
        expect_clean_error(c.p.string() + " (generate)", gen, c.expect);
        EXPECT_TRUE(has(gen.err, c.p.string())) << gen.err;
    }
    fs::remove(empty);
    fs::remove(readme);
    fs::remove(dir);
}

TEST(BrokenFiles, CorpusHasAtLeast40Cases) {
    // Counted from the case lists themselves, not from a counter that the
    // other tests bump: under CTest each test runs in its own process.
    const size_t n = truncation_cases().size() + huge_count_cases().size() +
                     placement_cases().size() + metadata_cases().size() +
                     model_fault_cases().size() + kNotAModelCases;
    std::printf("broken-file cases run through the binary: %zu\n", n);
    EXPECT_GE(n, 40u);
}
