#include "ir/pass_options.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "util/error.h"

namespace minfer::graph {

namespace {

bool env_on(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace

FuseOptions fuse_options_from_env() {
    FuseOptions o;
    o.qkv = !env_on("MINFER_NO_FUSE_QKV");
    o.ffn = !env_on("MINFER_NO_FUSE_FFN");
    return o;
}

Planner planner_from_env() {
    const char* v = std::getenv("MINFER_PLANNER");
    if (!v || !*v || std::strcmp(v, "arena") == 0) return Planner::Arena;
    if (std::strcmp(v, "classes") == 0) return Planner::Classes;
    throw Error(std::string("MINFER_PLANNER='") + v + "' is not a planner (arena | classes)");
}

const char* planner_name(Planner p) {
    return p == Planner::Arena ? "arena" : "classes";
}

}  // namespace minfer::graph
