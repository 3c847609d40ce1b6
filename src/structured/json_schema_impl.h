// Internal to structured/json_schema*.cpp: the JSON Schema converter's
// scalar side (json_schema_scalars.cpp: strings with their formats and
// patterns, integers and numbers) as json_schema.cpp's Converter calls it
// for the leaves of a schema; the Converter itself walks objects, arrays,
// combinators and $refs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace minfer::structured {

// Throws minfer::Error "JSON schema: <what> at <where>" (a JSON pointer).
[[noreturn]] void schema_fail(const std::string& where, const std::string& what);

// Keyword k of s as a length or item count (dflt when absent): a
// non-negative integer, bounded because the grammar unrolls it.
int64_t schema_repeat_count(const nlohmann::ordered_json& s, const char* k, int64_t dflt,
                            const std::string& where);

// The GBNF expression of a leaf schema (its type already known) at `where`;
// `uses` collects the primitive rules (json_schema.cpp's) it refers to.
std::string schema_string_gbnf(const nlohmann::ordered_json& s, const std::string& where,
                               std::set<std::string>& uses);
std::string schema_integer_gbnf(const nlohmann::ordered_json& s, const std::string& where,
                                std::set<std::string>& uses);
std::string schema_number_gbnf(const nlohmann::ordered_json& s, const std::string& where,
                               std::set<std::string>& uses);

}  // namespace minfer::structured
