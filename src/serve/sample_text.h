// The text of one sample as it is generated: token ids become UTF-8 that is
// never split inside a character (tokenizer::StreamDecoder), the caller's
// stop strings end the sample (the stop string itself is not returned, as
// OpenAI does), and text that could still turn out to be the start of a stop
// string is held back from streaming until it is known not to be one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace minfer::serve {

class SampleText {
  public:
    SampleText(const tokenizer::Tokenizer& tok, std::vector<std::string> stops);
    // Adds a token's text. Returns false when a stop string appeared: the
    // text is cut where it starts and the sample must end.
    bool push(int32_t token);
    // Text that is final and not yet taken (for a stream's next delta).
    std::string take_ready();
    // End of the sample: the decoder's incomplete tail (U+FFFD) and any
    // held-back text become final. Returns what was not yet taken.
    std::string finish();
    const std::string& text() const { return text_; }  // everything so far
    bool stopped() const { return stopped_; }

  private:
    tokenizer::StreamDecoder dec_;
    std::vector<std::string> stops_;
    size_t max_stop_ = 0;
    std::string text_;
    size_t taken_ = 0;
    bool stopped_ = false;
    bool finished_ = false;

    size_t held_back() const;  // bytes at the end that may begin a stop string
    bool check_stop(size_t new_bytes);
};

}  // namespace minfer::serve
