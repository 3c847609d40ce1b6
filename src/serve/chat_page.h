// The chat page served at / (web/chat.html, compiled in by scripts/embed_web.py).
#pragma once

#include <string>

namespace minfer::serve {

const std::string& chat_page_html();

}  // namespace minfer::serve
