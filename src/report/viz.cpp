#include "report/viz.h"

#include "util/error.h"

namespace minfer::report {

const std::string& viz_page_template() {
    static const std::string page =
#include "report/viz_page_html.inc"
        ;
    return page;
}

std::string render_viz_page(const nlohmann::json& doc) {
    if (!doc.is_object() || !doc.contains("graphs") || !doc["graphs"].is_array() ||
        doc["graphs"].empty())
        throw Error("viz: the document holds no graph records (\"graphs\": [...])");
    for (const auto& g : doc["graphs"])
        if (!g.contains("nodes") || !g.contains("buffers") || !g.contains("curve"))
            throw Error("viz: a graph record lacks nodes/buffers/curve (not a minfer trace?)");
    // Inside <script>, "</" could close the element: JSON allows "<\/"
    // within strings, and "</" cannot occur outside one.
    std::string data = doc.dump();
    std::string safe;
    safe.reserve(data.size() + 16);
    for (size_t i = 0; i < data.size(); ++i) {
        if (data[i] == '<' && i + 1 < data.size() && data[i + 1] == '/') {
            safe += "<\\/";
            ++i;
        } else {
            safe += data[i];
        }
    }
    std::string page = viz_page_template();
    const std::string slot = "\"__MINFER_DATA__\"";
    const size_t at = page.find(slot);
    MINFER_ASSERT_MSG(at != std::string::npos, "the page template lost its data slot");
    page.replace(at, slot.size(), safe);
    return page;
}

nlohmann::json kv_pages_json(const std::vector<runtime::KvPageInfo>& pages, int64_t page_cells,
                             const std::string& source) {
    nlohmann::json list = nlohmann::json::array();
    int64_t n_free = 0, n_cached = 0, n_used = 0, n_shared = 0;
    for (const auto& info : pages) {
        const char* state = "free";
        if (info.state == runtime::KvPageInfo::State::Cached) {
            state = "cached";
            ++n_cached;
        } else if (info.state == runtime::KvPageInfo::State::Used) {
            state = "used";
            ++n_used;
            if (info.holders.size() > 1) ++n_shared;
        } else {
            ++n_free;
        }
        nlohmann::json holders = nlohmann::json::array();
        for (const auto& [req, sample] : info.holders) holders.push_back({req, sample});
        list.push_back({{"state", state}, {"holders", std::move(holders)}});
    }
    return {{"source", source},
            {"page_cells", page_cells},
            {"pages", std::move(list)},
            {"counts",
             {{"free", n_free}, {"cached", n_cached}, {"used", n_used}, {"shared", n_shared}}}};
}

std::vector<runtime::KvPageInfo> session_kv_pages(int64_t n_pages, int64_t held) {
    if (n_pages < 0 || held < 0 || held > n_pages)
        throw Error("viz: a session holds " + std::to_string(held) + " of " +
                    std::to_string(n_pages) + " KV pages (must be 0..n_pages)");
    std::vector<runtime::KvPageInfo> out(static_cast<size_t>(n_pages));
    for (int64_t p = 0; p < held; ++p) {
        out[static_cast<size_t>(p)].state = runtime::KvPageInfo::State::Used;
        out[static_cast<size_t>(p)].holders.emplace_back(0, 0);
    }
    return out;
}

}  // namespace minfer::report
