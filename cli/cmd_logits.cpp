// Placeholder until this subcommand is built (see the open issues).
#include "commands.h"
#include "util/error.h"

namespace minfer::cli {
int cmd_logits(int, char**, int) { throw Error("'logits' is not implemented yet"); }
}  // namespace minfer::cli
