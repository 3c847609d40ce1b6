#!/usr/bin/env python3
"""Writes tests/data/schemas/corpus.jsonl: the JSON schemas the structured-output
tests constrain (tests/test_structured_schema.cpp), each with instances the
grammar must accept ("valid", written compactly with keys in schema order, as
the grammar produces them) and texts it must refuse ("refused": invalid, or
valid but outside what the grammar produces, e.g. keys out of order).

Run from the repository root: python3 scripts/gen_schema_corpus.py
"""
import json
import os

C = []


def add(name, schema, valid, invalid):
    def text(v):
        return v if isinstance(v, str) and v.startswith("RAW:") else json.dumps(
            v, separators=(",", ":"), ensure_ascii=False)

    C.append({
        "name": name,
        "schema": schema,
        "valid": [text(v) for v in valid],
        "refused": [v[4:] if isinstance(v, str) and v.startswith("RAW:") else text(v)
                    for v in invalid],
    })


obj = lambda props, req=None, **kw: dict(
    {"type": "object", "properties": props,
     "required": list(props) if req is None else req, "additionalProperties": False}, **kw)

# --- OpenAI strict-mode examples (structured outputs guide) ---------------
add("openai_calendar_event",
    obj({"name": {"type": "string"}, "date": {"type": "string"},
         "participants": {"type": "array", "items": {"type": "string"}}}),
    [{"name": "Science fair", "date": "Friday", "participants": ["Alice", "Bob"]}],
    [{"date": "Friday", "name": "x", "participants": []}, {"name": "x", "date": "y"}])
add("openai_math_reasoning",
    obj({"steps": {"type": "array", "items": obj({"explanation": {"type": "string"},
                                                   "output": {"type": "string"}})},
         "final_answer": {"type": "string"}}),
    [{"steps": [{"explanation": "Subtract 31", "output": "8x = -30"}], "final_answer": "x = -3.75"}],
    [{"steps": [{"explanation": "a"}], "final_answer": "b"}])
add("openai_research_paper",
    obj({"title": {"type": "string"}, "authors": {"type": "array", "items": {"type": "string"}},
         "abstract": {"type": "string"}, "keywords": {"type": "array", "items": {"type": "string"}}}),
    [{"title": "T", "authors": ["A", "B"], "abstract": "x", "keywords": []}],
    [{"title": "T", "authors": "A", "abstract": "x", "keywords": []}])
add("openai_moderation",
    obj({"is_violating": {"type": "boolean"},
         "category": {"type": ["string", "null"], "enum": ["violence", "sexual", "self_harm", None]},
         "explanation_if_violating": {"type": ["string", "null"]}}),
    [{"is_violating": False, "category": None, "explanation_if_violating": None},
     {"is_violating": True, "category": "violence", "explanation_if_violating": "x"}],
    [{"is_violating": True, "category": "other", "explanation_if_violating": None}])
add("openai_ui_recursive",
    {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["div", "button", "header", "section", "field", "form"]},
        "label": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}},
        "attributes": {"type": "array", "items": obj({"name": {"type": "string"},
                                                        "value": {"type": "string"}})}},
     "required": ["type", "label", "children", "attributes"], "additionalProperties": False},
    [{"type": "form", "label": "User", "children": [
        {"type": "field", "label": "First", "children": [], "attributes": [{"name": "type", "value": "text"}]}],
      "attributes": []}],
    [{"type": "span", "label": "x", "children": [], "attributes": []}])
add("openai_linked_list_defs",
    {"type": "object", "properties": {"linked_list": {"$ref": "#/$defs/linked_list_node"}},
     "$defs": {"linked_list_node": {"type": "object", "properties": {
         "value": {"type": "number"},
         "next": {"anyOf": [{"$ref": "#/$defs/linked_list_node"}, {"type": "null"}]}},
         "additionalProperties": False, "required": ["next", "value"]}},
     "additionalProperties": False, "required": ["linked_list"]},
    [{"linked_list": {"value": 1, "next": {"value": 2.5, "next": None}}}],
    [{"linked_list": {"value": 1}}])
add("openai_weather_tool",
    obj({"location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"},
         "units": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]}}),
    [{"location": "Bogotá, Colombia", "units": "celsius"}, {"location": "Paris", "units": None}],
    [{"location": "Paris", "units": "kelvin"}])
add("openai_entities",
    obj({"attributes": {"type": "array", "items": {"type": "string"}},
         "colors": {"type": "array", "items": {"type": "string"}},
         "animals": {"type": "array", "items": {"type": "string"}}}),
    [{"attributes": ["tall"], "colors": ["red", "blue"], "animals": []}],
    [{"attributes": ["tall"], "colors": [1], "animals": []}])
add("openai_get_order",
    obj({"order_id": {"type": "string"}, "include_items": {"type": "boolean"}}),
    [{"order_id": "A-12", "include_items": True}], [{"order_id": 12, "include_items": True}])
add("openai_query_db_defs",
    {"type": "object", "$defs": {
        "condition": obj({"column": {"type": "string"},
                          "operator": {"type": "string", "enum": ["=", ">", "<", ">=", "<=", "!="]},
                          "value": {"anyOf": [{"type": "string"}, {"type": "number"},
                                              {"type": "object", "properties": {"column_name": {"type": "string"}},
                                               "required": ["column_name"], "additionalProperties": False}]}})},
     "properties": {"table_name": {"type": "string", "enum": ["orders", "customers", "products"]},
                    "columns": {"type": "array", "items": {"type": "string", "enum": ["id", "status", "amount"]}},
                    "conditions": {"type": "array", "items": {"$ref": "#/$defs/condition"}},
                    "order_by": {"type": "string", "enum": ["asc", "desc"]}},
     "required": ["table_name", "columns", "conditions", "order_by"], "additionalProperties": False},
    [{"table_name": "orders", "columns": ["id", "amount"],
      "conditions": [{"column": "amount", "operator": ">=", "value": 100},
                     {"column": "x", "operator": "=", "value": {"column_name": "y"}}], "order_by": "asc"}],
    [{"table_name": "orders", "columns": ["price"], "conditions": [], "order_by": "asc"}])

# --- scalars and nullables -------------------------------------------------
for t, v, bad in [("string", "héllo \"q\" \\ \n\t ü 中", 1), ("number", -12.5e3, "1"),
                  ("integer", -42, 1.5), ("boolean", True, "true"), ("null", None, 0)]:
    add("scalar_" + t, {"type": t}, [v], [bad])
add("nullable_union", {"type": ["integer", "string", "null"]}, [3, "x", None], [True, 1.5])
# OpenAPI's nullable is no JSON Schema keyword: validators ignore it, so the
# grammar never produces null for it (valid under both readings).
add("openapi_nullable", {"type": "string", "nullable": True}, ["a"], [1, None])
add("any_value", {}, [{"a": [1, "x", None, {"b": False}]}, 3, "s"], ["RAW:{a:1}"])
add("json_object_mode", {"type": "object"}, [{"a": 1, "b": {"c": [True, None]}}, {}], [[1], "x"])

# --- enums and const -------------------------------------------------------
countries = ["Country%03d" % i for i in range(150)]
add("enum_150", {"type": "string", "enum": countries}, ["Country000", "Country149"],
    ["Country150", "country000"])
add("enum_mixed", {"enum": ["red", 42, None, True, {"a": 1}, [1, 2]]},
    ["red", 42, None, True, {"a": 1}, [1, 2]], ["blue", 43, False])
add("const_object", obj({"kind": {"const": "circle"}, "r": {"type": "number"}}),
    [{"kind": "circle", "r": 2}], [{"kind": "square", "r": 2}])
add("enum_of_words_in_object",
    obj({"cities": {"type": "array", "maxItems": 3,
                    "items": {"type": "string", "enum": ["city_%d" % i for i in range(120)]}}}),
    [{"cities": ["city_0", "city_119"]}], [{"cities": ["city_1", "city_2", "city_3", "city_4"]}])

# --- anyOf / oneOf / allOf -------------------------------------------------
add("anyof_long", {"anyOf": [obj({"k%d" % i: {"type": "integer"}}) for i in range(30)]},
    [{"k0": 1}, {"k29": -5}], [{"k30": 1}, {"k1": "x"}])
add("anyof_scalars", {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 10}]},
    ["abc", 10, 99999], ["abcd", 9])
add("oneof_discriminated",
    {"oneOf": [obj({"kind": {"const": "cat"}, "lives": {"type": "integer"}}),
               obj({"kind": {"const": "dog"}, "good": {"type": "boolean"}})]},
    [{"kind": "cat", "lives": 9}, {"kind": "dog", "good": True}], [{"kind": "cat", "good": True}])
add("oneof_types", {"oneOf": [{"type": "string"}, {"type": "boolean"}]}, ["x", False], [1])
add("allof_merge",
    {"allOf": [{"$ref": "#/$defs/base"},
               {"type": "object", "properties": {"extra": {"type": "integer"}}, "required": ["extra"]}],
     "$defs": {"base": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}},
    [{"id": "a", "extra": 1}], [{"id": "a"}, {"extra": 1}])

# --- objects: optional keys, nesting, maps ---------------------------------
add("optional_keys_in_order",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                      "c": {"type": "integer"}, "d": {"type": "integer"}},
     "required": ["b", "d"], "additionalProperties": False},
    [{"b": 1, "d": 2}, {"a": 0, "b": 1, "c": 2, "d": 3}, {"b": 1, "c": 2, "d": 3}],
    [{"d": 1, "b": 2}, {"a": 1, "d": 2}, {"b": 1}])
add("all_optional",
    {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "boolean"}},
     "additionalProperties": False},
    [{}, {"x": "a"}, {"y": True}, {"x": "a", "y": False}], ["RAW:{,\"y\":true}", {"y": True, "x": "a"}])
add("map_of_integers", {"type": "object", "additionalProperties": {"type": "integer"}},
    [{"a": 1, "b": 2}, {}], [{"a": "x"}])
add("nested_3_levels",
    obj({"user": obj({"profile": obj({"name": {"type": "string"}, "age": {"type": "integer"}}),
                      "tags": {"type": "array", "items": {"type": "string"}}})}),
    [{"user": {"profile": {"name": "A", "age": 3}, "tags": ["x"]}}],
    [{"user": {"profile": {"name": "A"}, "tags": []}}])
add("key_with_quotes_and_unicode", obj({"we\"ird \\ key": {"type": "integer"}, "ключ": {"type": "string"}}),
    [{"we\"ird \\ key": 1, "ключ": "значение"}], [{"weird": 1, "ключ": "x"}])
add("issue31_reply",
    obj({"name": {"type": "string", "minLength": 1, "maxLength": 40},
         "age": {"type": "integer", "minimum": 0, "maximum": 150},
         "role": {"type": "string", "enum": ["admin", "user", "guest"]},
         "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
         "address": obj({"street": {"type": "string", "maxLength": 60},
                         "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
         "active": {"type": "boolean"}}),
    [{"name": "Ann", "age": 150, "role": "user", "tags": ["a", "b"],
      "address": {"street": "Main St 1", "zip": "01234"}, "active": True}],
    [{"name": "", "age": 1, "role": "user", "tags": [], "address": {"street": "", "zip": "01234"}, "active": True},
     {"name": "A", "age": 151, "role": "user", "tags": [], "address": {"street": "", "zip": "01234"}, "active": True},
     {"name": "A", "age": 1, "role": "user", "tags": [], "address": {"street": "", "zip": "0123"}, "active": True}])

# --- arrays ------------------------------------------------------------------
add("array_min_max", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    [[1, 2], [1, 2, 3, 4]], [[1], [1, 2, 3, 4, 5]])
add("array_exact", {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3},
    [[True, False, True]], [[True, False]])
add("array_empty_only", {"type": "array", "maxItems": 0}, [[]], [[1]])
add("prefix_items", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                     "items": {"type": "boolean"}, "maxItems": 4},
    [["a", 1], ["a", 1, True, False]], [["a", 1, True, False, True], [1, "a"]])
add("prefix_items_closed", {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                            "items": False},
    [[1, 2.5]], [[1, 2, 3], [1]])
add("array_of_arrays", {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}},
    [[[1, 2], [], [3]]], [[[1, 2, 3]]])

# --- strings: lengths, formats, patterns -------------------------------------
add("string_length", {"type": "string", "minLength": 2, "maxLength": 5}, ["ab", "abcde", "é\"\n"],
    ["a", "abcdef"])
add("format_date", {"type": "string", "format": "date"}, ["2024-02-28", "1999-12-31"],
    ["2024-13-01", "2024-02-30", "24-01-01"])
add("format_time", {"type": "string", "format": "time"}, ["23:59:59Z", "08:30:00.123+02:00"],
    ["24:00:00Z", "12:00"])
add("format_date_time", {"type": "string", "format": "date-time"}, ["2024-05-06T07:08:09Z"],
    ["2024-05-06 07:08:09Z"])
add("format_uuid", {"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"],
    ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"])
add("pattern_phone", {"type": "string", "pattern": r"^\+?[0-9]{1,3}[- ][0-9]{3}-[0-9]{4}$"},
    ["+1 555-0100", "44-123-4567"], ["555-0100", "+1 555-01000"])
add("pattern_alternation_groups", {"type": "string", "pattern": r"^(cat|dog)s?(-\d+)?$"},
    ["cat", "dogs-12"], ["cow", "cat-"])
add("pattern_unanchored", {"type": "string", "pattern": "ab+c"}, ["xxabbbcyy", "abc"], ["ac"])
add("pattern_classes", {"type": "string", "pattern": r"^[A-Z][a-z]*\s\w+\.$"},
    ["Hello world.", "A b_1."], ["hello world.", "Hello world"])
add("pattern_escaped_quote", {"type": "string", "pattern": r'^say "[^"]*"$'},
    ['say "hi"', 'say ""'], ['say "a"b"', "say hi"])
add("pattern_dot_star", {"type": "string", "pattern": r"^id-.{2,4}$"}, ["id-ab", "id-中文字"],
    ["id-a", "id-abcde"])

# --- integers: ranges ---------------------------------------------------------
add("int_range_small", {"type": "integer", "minimum": 3, "maximum": 17}, [3, 9, 10, 17], [2, 18, 170, -3])
add("int_range_negative", {"type": "integer", "minimum": -250, "maximum": -7}, [-250, -99, -7],
    [-251, -6, 0, 7])
add("int_range_cross_zero", {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 1000},
    [-9, 0, 999], [-10, 1000, 1001])
add("int_min_only", {"type": "integer", "minimum": 1234}, [1234, 9999, 10000, 123456789], [1233, 0, -5])
add("int_max_only", {"type": "integer", "maximum": 42}, [42, 0, -1000000], [43, 100])
add("number_non_negative", {"type": "number", "minimum": 0}, [0, 3.25, 1e-3], [-1, -0.5])

# --- tools / function calls ---------------------------------------------------
add("tool_call_envelope",
    obj({"name": {"type": "string", "enum": ["get_weather", "search"]},
         "arguments": {"anyOf": [obj({"city": {"type": "string"}}),
                                 obj({"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}})]}}),
    [{"name": "search", "arguments": {"query": "x", "limit": 50}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}],
    [{"name": "search", "arguments": {"query": "x", "limit": 51}}])
add("parallel_tool_calls",
    {"type": "array", "minItems": 1, "maxItems": 3,
     "items": obj({"name": {"const": "lookup"}, "arguments": obj({"id": {"type": "integer"}})})},
    [[{"name": "lookup", "arguments": {"id": 1}}, {"name": "lookup", "arguments": {"id": 2}}]],
    [[]])
add("zod_like_draft7",
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
     "properties": {"title": {"type": "string"}, "rating": {"type": "number"},
                    "genres": {"type": "array", "items": {"type": "string"}}},
     "required": ["title", "rating", "genres"], "additionalProperties": False,
     "definitions": {}},
    [{"title": "Dune", "rating": 8.5, "genres": ["sf"]}], [{"title": "Dune", "rating": "8.5", "genres": []}])
add("recursive_tree_definitions",
    {"$ref": "#/definitions/node",
     "definitions": {"node": obj({"v": {"type": "integer"},
                                  "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 2}})}},
    [{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]}],
    [{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 2, "kids": []}, {"v": 2, "kids": []}]}])
add("mutual_recursion",
    {"$ref": "#/$defs/expr", "$defs": {
        "expr": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/op"}]},
        "op": obj({"op": {"enum": ["+", "*"]}, "args": {"type": "array", "items": {"$ref": "#/$defs/expr"},
                                                         "minItems": 2, "maxItems": 2}})}},
    [{"op": "+", "args": [1, {"op": "*", "args": [2, 3]}]}], [{"op": "+", "args": [1]}])

out = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "schemas", "corpus.jsonl")
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w", encoding="utf-8") as f:
    for c in C:
        f.write(json.dumps(c, ensure_ascii=False) + "\n")
print(len(C), "schemas ->", os.path.normpath(out))
