// The text of one sample as it is generated, and the one stop-string matcher
// (the server's requests and the CLI's generation and chat both use it):
// token ids become UTF-8 that is never split inside a character
// (tokenizer::StreamDecoder), and the caller's stop strings end the sample
// wherever they appear in the text, inside a token's piece or across
// pieces. With StopText::Cut (OpenAI's) the stop string is not returned and
// text that could still turn out to be the start of one is held back from
// streaming until it is known not to be; with StopText::Keep (the CLI's
// "stop when the output ends with TEXT") the text ends with the stop string
// and nothing is held back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace minfer::runtime {

enum class StopText { Cut, Keep };

class SampleText {
  public:
    SampleText(const tokenizer::Tokenizer& tok, std::vector<std::string> stops,
               StopText mode = StopText::Cut);
    // Adds a token's text. Returns false when a stop string appeared: the
    // text is cut where it starts (Cut) or ends (Keep) and the sample must end.
    bool push(int32_t token);
    // Text that is final and not yet taken (for a stream's next delta).
    std::string take_ready();
    // End of the sample: the decoder's incomplete tail (U+FFFD) and any
    // held-back text become final. Returns what was not yet taken.
    std::string finish();
    const std::string& text() const { return text_; }  // everything so far
    // Every token's text, past the cut too: what the sampled tokens say (a
    // chat's KV cache holds them all).
    std::string decoded() const { return text_ + cut_; }
    bool stopped() const { return stopped_; }

  private:
    tokenizer::StreamDecoder dec_;
    std::vector<std::string> stops_;
    StopText mode_;
    size_t max_stop_ = 0;
    std::string text_;
    std::string cut_;  // decoded text past the cut
    size_t taken_ = 0;
    bool stopped_ = false;
    bool finished_ = false;

    size_t held_back() const;  // bytes at the end that may begin a stop string
    bool check_stop(size_t new_bytes);
};

}  // namespace minfer::runtime
