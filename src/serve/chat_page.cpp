#include "serve/chat_page.h"

namespace minfer::serve {

const std::string& chat_page_html() {
    static const std::string page =
#include "serve/chat_page_html.inc"
        ;
    return page;
}

}  // namespace minfer::serve
