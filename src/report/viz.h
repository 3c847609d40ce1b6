// The visual page (minfer viz): one self-contained HTML file — inline CSS
// and script, the data embedded as JSON, nothing fetched — that shows the
// graph in build order, the buffer timeline, the arena layout and the memory
// curve of every graph a run built. The page source is web/viz.html,
// compiled in through src/report/viz_page_html.inc.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace minfer::report {

// The page template (web/viz.html as compiled in).
const std::string& viz_page_template();

// The page for a trace document ({"graphs": [...], "report": {...}, "meta":
// {...}}, see trace_document). Throws minfer::Error when the document holds
// no graph records.
std::string render_viz_page(const nlohmann::json& doc);

// One snapshot of the KV cache's pages for the page's "KV pages" panel
// (doc["kv_pages"] is an array of them): {"source", "page_cells", "pages":
// [{"state": "free"|"cached"|"used", "holders": [[request, sample], ...]}],
// "counts": {"free", "cached", "used", "shared"}}. A used page with more than
// one holder is shared.
nlohmann::json kv_pages_json(const std::vector<runtime::KvPageInfo>& pages, int64_t page_cells,
                             const std::string& source);

// A Session's one sequence (request 0, sample 0) holds pages 0..held-1 of
// n_pages (its page table is the identity); the rest are free.
std::vector<runtime::KvPageInfo> session_kv_pages(int64_t n_pages, int64_t held);

}  // namespace minfer::report
