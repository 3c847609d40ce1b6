#include "runtime/sample_text.h"

#include <algorithm>

namespace minfer::runtime {

SampleText::SampleText(const tokenizer::Tokenizer& tok, std::vector<std::string> stops,
                       StopText mode)
    : dec_(tok), mode_(mode) {
    for (auto& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
    for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

bool SampleText::check_stop(size_t new_bytes) {
    if (stops_.empty() || new_bytes == 0) return false;
    // A stop string can only end inside the new bytes: search from where one
    // ending there could start.
    const size_t from =
        text_.size() > new_bytes + max_stop_ ? text_.size() - new_bytes - max_stop_ : 0;
    size_t best = std::string::npos, best_end = 0;
    for (const auto& s : stops_) {
        size_t pos = text_.find(s, from);
        if (pos != std::string::npos && pos < best) {
            best = pos;
            best_end = pos + s.size();
        }
    }
    if (best == std::string::npos) return false;
    const size_t end = std::max(mode_ == StopText::Keep ? best_end : best, taken_);
    cut_ = text_.substr(end);
    text_.resize(end);
    stopped_ = true;
    return true;
}

bool SampleText::push(int32_t token) {
    if (stopped_ || finished_) return !stopped_;
    std::string piece = dec_.push(token);
    text_ += piece;
    return !check_stop(piece.size());
}

size_t SampleText::held_back() const {
    // The longest suffix of the untaken text that is a proper prefix of a
    // stop string; none when the stop string is kept (printed either way).
    size_t best = 0;
    if (mode_ == StopText::Keep) return 0;
    const size_t avail = text_.size() - taken_;
    for (const auto& s : stops_) {
        for (size_t n = std::min(avail, s.size() - 1); n > best; --n) {
            if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
                best = n;
                break;
            }
        }
    }
    return best;
}

std::string SampleText::take_ready() {
    const size_t end = finished_ || stopped_ ? text_.size() : text_.size() - held_back();
    if (end <= taken_) return {};
    std::string out = text_.substr(taken_, end - taken_);
    taken_ = end;
    return out;
}

std::string SampleText::finish() {
    if (!finished_ && !stopped_) {
        std::string rest = dec_.flush();
        text_ += rest;
        check_stop(rest.size());
    }
    finished_ = true;
    return take_ready();
}

}  // namespace minfer::runtime
