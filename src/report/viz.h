// The visual page (minfer viz): one self-contained HTML file — inline CSS
// and script, the data embedded as JSON, nothing fetched — that shows the
// graph in build order, the buffer timeline, the arena layout and the memory
// curve of every graph a run built. The page source is web/viz.html,
// compiled in through src/report/viz_page_html.inc.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace minfer::report {

// The page template (web/viz.html as compiled in).
const std::string& viz_page_template();

// The page for a trace document ({"graphs": [...], "report": {...}, "meta":
// {...}}, see trace_document). Throws minfer::Error when the document holds
// no graph records.
std::string render_viz_page(const nlohmann::json& doc);

}  // namespace minfer::report
