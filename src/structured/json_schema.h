// JSON Schema -> GBNF (grammar.h), for constrained decoding.
//
// The grammar produces compact JSON: keys in the order the schema lists
// them, no blank anywhere except at most one space after each ':' and ','
// (a model may then neither fill its budget with blanks nor pretty-print).
// Every output it allows validates against the schema; where a schema
// allows more than the grammar produces, the grammar takes a valid subset:
// - optional properties may be left out but never reordered; properties not
//   listed are not produced even when additionalProperties allows them;
// - numbers have at most 16 integer and 16 fraction digits and a 3-digit
//   exponent, strings use the escapes \" \\ \/ \b \f \n \r \t and \uXXXX
//   (no surrogate halves);
// - prefixItems are all produced; date has days up to 28 in February;
// - OpenAPI's `nullable: true` (no JSON Schema keyword) adds no null.
// A keyword it cannot enforce (multipleOf, uniqueItems, not, if/then/else,
// minimum on non-integers other than 0, an unknown keyword, ...) is an error
// naming the keyword and where it is, never ignored. Annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly) are accepted.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace minfer::structured {

// Throws minfer::Error: "JSON schema: <what> at <json pointer>". The text
// form also refuses text that is not JSON.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
std::string json_schema_text_to_gbnf(std::string_view schema_text);

// response_format {"type": "json_object"}: any JSON object.
std::string json_object_gbnf();

}  // namespace minfer::structured
