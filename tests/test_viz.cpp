// The visual page and the CLI flags that feed it: the page is one file with
// the data embedded (safely) and nothing fetched; `minfer viz`, --mem-report-json,
// --dump-graph-json and MINFER_TRACE work end to end on a tiny model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "report/viz.h"
#include "tiny_model.h"
#include "util/error.h"

using namespace minfer;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

nlohmann::json minimal_doc(const std::string& name) {
    nlohmann::json node = {{"id", 0},
                           {"name", name},
                           {"op", "Input"},
                           {"type", "i32"},
                           {"shape", {1, 1, 1, 1}},
                           {"backend", 0},
                           {"layer", -1},
                           {"src", nlohmann::json::array()},
                           {"live", {0, 1}},
                           {"aliased", false},
                           {"dead", false},
                           {"fused", false},
                           {"input", true},
                           {"output", true},
                           {"kv", false},
                           {"buffer", nullptr}};
    nlohmann::json g = {{"kind", "prefill"},
                        {"n_tokens", 1},
                        {"planner", "arena"},
                        {"n_nodes", 1},
                        {"backends", {"cpu"}},
                        {"nodes", {node}},
                        {"buffers", nlohmann::json::array()},
                        {"curve", {4}},
                        {"lower_bound_bytes", 4},
                        {"pool_bytes", 64},
                        {"naive_bytes", 4}};
    return {{"graphs", {g}},
            {"report", {{"graphs", nlohmann::json::array()}, {"run", nlohmann::json::object()}}}};
}

// A tiny qwen2 GGUF in a temp folder, for the CLI.
struct TempModel {
    fs::path dir, path;
    TempModel() {
        dir = fs::temp_directory_path() / ("minfer_test_viz_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        path = dir / "tiny.gguf";
        minfer::testing::TinyModelSpec s;
        minfer::testing::make_tiny_model(s).write(path.string());
    }
    ~TempModel() { fs::remove_all(dir); }
};

int run(const std::string& cmd) {
    return std::system((cmd + " 2>/dev/null >/dev/null").c_str());
}

}  // namespace

TEST(Viz, page_embeds_the_data_and_fetches_nothing) {
    const std::string page = report::render_viz_page(minimal_doc("token_ids"));
    EXPECT_EQ(page.find("__MINFER_DATA__"), std::string::npos);
    EXPECT_NE(page.find("\"name\":\"token_ids\""), std::string::npos);
    EXPECT_EQ(page.find("<script src"), std::string::npos);
    EXPECT_EQ(page.find("<link"), std::string::npos);
    EXPECT_EQ(page.find("http://cdn"), std::string::npos);
    EXPECT_EQ(page.find("https://"), std::string::npos);
    EXPECT_NE(page.find("id=\"timeline\""), std::string::npos);
    EXPECT_NE(page.find("id=\"curve\""), std::string::npos);
}

TEST(Viz, a_name_cannot_close_the_data_script) {
    const std::string page = report::render_viz_page(minimal_doc("x</script><b>"));
    // Exactly the template's own two </script> tags remain.
    size_t n = 0;
    for (size_t at = page.find("</script>"); at != std::string::npos;
         at = page.find("</script>", at + 1))
        ++n;
    EXPECT_EQ(n, 2u);
    EXPECT_NE(page.find("x<\\/script><b>"), std::string::npos);
}

TEST(Viz, refuses_a_document_without_graphs) {
    EXPECT_THROW(report::render_viz_page(nlohmann::json::object()), Error);
    nlohmann::json doc = {{"graphs", nlohmann::json::array()}};
    EXPECT_THROW(report::render_viz_page(doc), Error);
    doc = {{"graphs", {{{"kind", "prefill"}}}}};
    EXPECT_THROW(report::render_viz_page(doc), Error);
}

TEST(Viz, cli_flags_end_to_end_on_a_tiny_model) {
    TempModel m;
    const std::string bin = MINFER_BINARY;
    const fs::path mem = m.dir / "mem.json", dump = m.dir / "graphs.json",
                   trace = m.dir / "trace.json", page = m.dir / "page.html",
                   page2 = m.dir / "page2.html", state = m.dir / "state";
    ASSERT_EQ(
        run("MINFER_TRACE=" + trace.string() + " MINFER_GRAPH_DUMP=" + state.string() + " " + bin +
            " -m " + m.path.string() + " -p 'the the' -n 4 --temp 0 -t 1 -c 64 --mem-report" +
            " --mem-report-json " + mem.string() + " --dump-graph-json " + dump.string()),
        0);
    const auto j = nlohmann::json::parse(slurp(mem));
    ASSERT_EQ(j["graphs"].size(), 2u);
    EXPECT_EQ(j["graphs"][0]["kind"], "prefill");
    EXPECT_EQ(j["graphs"][1]["kind"], "decode");
    EXPECT_EQ(j["run"]["allocations_after_first_decode"], 0);
    EXPECT_EQ(j["run"]["rebuilds_after_first_decode"], 0);
    EXPECT_EQ(j["run"]["kv_bytes"], 2 * 2 * 32 * 64 * 4);  // 2 layers, K+V, [32, 64] f32
    const auto d = nlohmann::json::parse(slurp(dump));
    ASSERT_EQ(d["graphs"].size(), 2u);
    EXPECT_EQ(d["graphs"][0]["n_nodes"], j["graphs"][0]["n_nodes"]);
    EXPECT_EQ(d["graphs"][0]["lower_bound_bytes"], j["graphs"][0]["lower_bound_bytes"]);
    const auto t = nlohmann::json::parse(slurp(trace));
    ASSERT_EQ(t["graphs"].size(), 2u);
    EXPECT_TRUE(t["graphs"][1]["nodes"].back().contains("stats"));
    EXPECT_TRUE(fs::exists(state / "index.json"));
    EXPECT_EQ(fs::file_size(state / "logits.f32"), 264u * 4);
    // The page from that trace, and the page from a fresh run.
    ASSERT_EQ(run(bin + " viz --trace " + trace.string() + " -o " + page.string()), 0);
    EXPECT_NE(slurp(page).find("\"kind\":\"decode\""), std::string::npos);
    ASSERT_EQ(run(bin + " viz -m " + m.path.string() + " -p 'the' -n 2 -t 1 -o " + page2.string()),
              0);
    EXPECT_NE(slurp(page2).find("\"stats\""), std::string::npos);
    // -o is required.
    EXPECT_NE(run(bin + " viz -m " + m.path.string()), 0);
}

TEST(Viz, graph_dump_of_an_f16_kv_cache_names_and_sizes_it_as_f16) {
    // The regions are dumped raw in the cache's element type: 2 bytes per
    // element and a file named .f16, [32, 64] (n_embd_kv, n_ctx) — not .f32
    // with n_ctx / 2 rows.
    TempModel m;
    const std::string bin = MINFER_BINARY;
    const fs::path state = m.dir / "state16";
    ASSERT_EQ(run("MINFER_GRAPH_DUMP=" + state.string() + " " + bin + " -m " + m.path.string() +
                  " -p 'the the' -n 2 --temp 0 -t 1 -c 64 -ctk f16"),
              0);
    const auto idx = nlohmann::json::parse(slurp(state / "index.json"));
    ASSERT_EQ(idx["kv"].size(), 4u);  // 2 layers x (K, V)
    for (const auto& kv : idx["kv"]) {
        EXPECT_EQ(kv["dtype"], "f16");
        const std::string file = kv["file"];
        EXPECT_EQ(file, kv["name"].get<std::string>() + ".f16");
        EXPECT_EQ(kv["shape"], nlohmann::json::array({32, 64}));
        EXPECT_EQ(fs::file_size(state / file), 32u * 64 * 2);
    }
}

TEST(Viz, classes_planner_selectable_from_the_environment) {
    TempModel m;
    const std::string bin = MINFER_BINARY;
    const fs::path mem = m.dir / "mem.json";
    ASSERT_EQ(run("MINFER_PLANNER=classes " + bin + " -m " + m.path.string() +
                  " -p 'the' -n 2 -t 1 -c 32 --mem-report-json " + mem.string()),
              0);
    const auto j = nlohmann::json::parse(slurp(mem));
    EXPECT_EQ(j["graphs"][0]["planner"], "classes");
    EXPECT_GT(j["graphs"][0]["n_buffers"], 1);
    EXPECT_NE(run("MINFER_PLANNER=bogus " + bin + " -m " + m.path.string() + " -p 'the' -n 1"), 0);
}
