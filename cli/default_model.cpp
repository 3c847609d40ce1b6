#include <filesystem>

#include "commands.h"

namespace minfer::cli {
// The built-in model ships in the repository; the build records where the
// source tree is, so the binary finds it wherever it is run from.
const char* default_model_path() {
    return MINFER_SOURCE_DIR "/models/kjv-tiny-q8_0.gguf";
}
}  // namespace minfer::cli
