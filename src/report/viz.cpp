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

}  // namespace minfer::report
