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

TEST(Viz, kv_pages_json_counts_free_cached_held_and_shared) {
    using runtime::KvPageInfo;
    std::vector<KvPageInfo> pages(5);
    pages[0].state = KvPageInfo::State::Used;  // shared by two requests
    pages[0].holders = {{1, 0}, {2, 0}};
    pages[1].state = KvPageInfo::State::Used;
    pages[1].holders = {{2, 0}};
    pages[2].state = KvPageInfo::State::Cached;
    const auto j = report::kv_pages_json(pages, 32, "test");
    EXPECT_EQ(j["page_cells"], 32);
    ASSERT_EQ(j["pages"].size(), 5u);
    EXPECT_EQ(j["pages"][0]["holders"].size(), 2u);
    EXPECT_EQ(j["pages"][1]["holders"][0][0], 2);
    EXPECT_EQ(j["pages"][2]["state"], "cached");
    EXPECT_EQ(j["pages"][4]["state"], "free");
    EXPECT_EQ(j["counts"]["used"], 2);
    EXPECT_EQ(j["counts"]["shared"], 1);
    EXPECT_EQ(j["counts"]["cached"], 1);
    EXPECT_EQ(j["counts"]["free"], 2);
    // A session holds its first pages; holding more than there are is refused.
    const auto s = report::session_kv_pages(4, 2);
    EXPECT_EQ(s[1].state, KvPageInfo::State::Used);
    EXPECT_EQ(s[2].state, KvPageInfo::State::Free);
    EXPECT_THROW(report::session_kv_pages(2, 3), Error);
    // The page carries the snapshot and the panel that draws it.
    auto doc = minimal_doc("x");
    doc["kv_pages"] = nlohmann::json::array({j});
    const std::string page = report::render_viz_page(doc);
    EXPECT_NE(page.find("\"kv_pages\":[{"), std::string::npos);
    EXPECT_NE(page.find("id=\"kvpages\""), std::string::npos);
    EXPECT_NE(page.find("drawKvPages()"), std::string::npos);
}

// minfer viz --parallel 3: the session's pages and the engine's, where the
// three requests of one 70-token prompt share its two full pages.
TEST(Viz, kv_pages_of_the_session_and_of_the_engine_in_the_page) {
    TempModel m;
    const std::string bin = MINFER_BINARY;
    const fs::path page = m.dir / "kv.html", trace = m.dir / "kv.json";
    std::string prompt;
    for (int i = 0; i < 70; ++i) prompt += "the ";
    ASSERT_EQ(run(bin + " viz -m " + m.path.string() + " -p '" + prompt +
                  "' -n 2 -t 1 --no-values --parallel 3 -o " + page.string() + " --save-trace " +
                  trace.string()),
              0);
    const auto t = nlohmann::json::parse(slurp(trace));
    ASSERT_EQ(t["kv_pages"].size(), 2u);
    const auto& sess = t["kv_pages"][0];
    EXPECT_EQ(sess["page_cells"], 32);
    EXPECT_GE(sess["counts"]["used"], 3);  // >= 70 tokens + 2 decoded
    EXPECT_EQ(sess["counts"]["shared"], 0);
    const auto& eng = t["kv_pages"][1];
    EXPECT_GE(eng["counts"]["shared"], 2);    // the prompt's two full pages, held by all three
    EXPECT_GE(eng["counts"]["used"], 2 + 3);  // plus each request's own tail page
    int shared_by_three = 0;
    for (const auto& p : eng["pages"])
        if (p["holders"].size() == 3u) ++shared_by_three;
    EXPECT_GE(shared_by_three, 2);
    EXPECT_NE(slurp(page).find("\"counts\":{\"cached\""), std::string::npos);
    EXPECT_NE(run(bin + " viz --trace " + trace.string() + " --parallel 2 -o " + page.string()), 0);
}
