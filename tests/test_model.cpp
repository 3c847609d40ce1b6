// Model loading: hyper-parameters and weights checked against each other,
// with errors that name the key or tensor at fault.
#include <gtest/gtest.h>

#include "model/build.h"
#include "model/model.h"
#include "tiny_model.h"
#include "util/error.h"

using namespace minfer;
using minfer::testing::make_tiny_model;
using minfer::testing::TinyModelSpec;

namespace {

std::string load_error(const gguf::Writer& w) {
    std::vector<uint8_t> bytes = w.to_bytes();
    try {
        model::Model::from_file(gguf::File::parse(bytes.data(), bytes.size(), "bad.gguf"));
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(Model, LoadsTinyQwen2AndQwen3) {
    for (const char* arch : {"qwen2", "qwen3"}) {
        TinyModelSpec s;
        s.arch = arch;
        s.tied_output = std::string(arch) == "qwen2";
        std::vector<uint8_t> bytes = make_tiny_model(s).to_bytes();
        model::Model m = model::Model::from_file(gguf::File::parse(bytes.data(), bytes.size()));
        EXPECT_EQ(m.hp.n_layer, 2);
        EXPECT_EQ(m.hp.head_dim, 16);
        EXPECT_EQ(m.hp.n_embd_kv(), 32);
        EXPECT_EQ(m.hp.n_vocab, 264);
        EXPECT_EQ(m.tied_output, s.tied_output);
        EXPECT_EQ(m.layers.size(), 2u);
        EXPECT_EQ(m.layers[1].bq != nullptr, std::string(arch) == "qwen2");
        EXPECT_EQ(m.layers[1].q_norm != nullptr, std::string(arch) == "qwen3");
    }
}

TEST(Model, UnknownArchitectureIsRefusedByName) {
    TinyModelSpec s;
    gguf::Writer w = make_tiny_model(s);
    w.set_string("general.architecture", "llama");
    EXPECT_NE(load_error(w).find("unsupported architecture 'llama'"), std::string::npos);
}

TEST(Model, TensorShapeDisagreeingWithHyperParametersNamesTheTensor) {
    TinyModelSpec s;
    gguf::Writer w = make_tiny_model(s);
    w.set_u32("qwen2.feed_forward_length", 128);  // tensors are 96 wide
    std::string e = load_error(w);
    EXPECT_NE(e.find("blk.0.ffn_gate.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("[64, 96]"), std::string::npos) << e;
}

TEST(Model, MissingHyperParameterNamesTheKey) {
    TinyModelSpec s;
    gguf::Writer w = make_tiny_model(s);
    gguf::Writer w2;
    // Rebuild without block_count: copy everything but that key.
    std::vector<uint8_t> bytes = w.to_bytes();
    gguf::File f = gguf::File::parse(bytes.data(), bytes.size());
    for (const auto& kv : f.metadata())
        if (kv.key != "qwen2.block_count") w2.set(kv.key, kv.value);
    EXPECT_NE(load_error(w2).find("'qwen2.block_count'"), std::string::npos);
}

TEST(Model, RopeScalingIsRefusedClearly) {
    TinyModelSpec s;
    gguf::Writer w = make_tiny_model(s);
    w.set_string("qwen2.rope.scaling.type", "yarn");
    EXPECT_NE(load_error(w).find("RoPE scaling 'yarn'"), std::string::npos);
}

TEST(Model, VocabularyShorterThanEmbeddingIsRefused) {
    TinyModelSpec s;
    gguf::Writer w = make_tiny_model(s);
    w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    EXPECT_NE(load_error(w).find("the vocabulary has 2 tokens"), std::string::npos);
}

TEST(Model, GraphHasNamedInputsAndOneOutput) {
    TinyModelSpec s;
    std::vector<uint8_t> bytes = make_tiny_model(s).to_bytes();
    model::Model m = model::Model::from_file(gguf::File::parse(bytes.data(), bytes.size()));
    model::BuildParams bp;
    bp.n_tokens = 5;
    bp.n_out = 1;
    bp.n_ctx = 32;
    graph::Graph g = model::build_graph(m, bp);
    EXPECT_GE(g.find("token_ids"), 0);
    EXPECT_GE(g.find("positions"), 0);
    EXPECT_GE(g.find("tail_ids"), 0);
    ASSERT_EQ(g.outputs.size(), 1u);
    EXPECT_EQ(g.node(g.outputs[0]).ne[0], m.hp.n_vocab);
    EXPECT_EQ(g.node(g.outputs[0]).ne[1], 1);
    EXPECT_EQ(g.topo_order().size(), g.size());
    // Every source precedes its consumer: build order is an execution order.
    for (size_t i = 0; i < g.size(); ++i)
        for (graph::NodeId sid : g.nodes[i].src) EXPECT_LT(static_cast<size_t>(sid), i);
}
