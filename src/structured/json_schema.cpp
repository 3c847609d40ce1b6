#include "structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "structured/grammar.h"
#include "structured/json_schema_impl.h"
#include "util/error.h"

namespace minfer::structured {

namespace {

using json = nlohmann::ordered_json;

// The rules every converted grammar may use. `sp` is the only blank: at most
// one space, after ':' and ','.
const std::map<std::string, std::string>& primitive_rules() {
    static const std::map<std::string, std::string> rules = {
        {"sp", R"(" "?)"},
        {"hex", R"([0-9a-fA-F])"},
        // \u escapes skip the surrogate halves D800-DFFF (a decoder would pair
        // or reject them, changing the string's length).
        {"char",
         R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CeEfF] hex hex hex | [dD] [0-7] hex hex)))"},
        {"string", R"("\"" char* "\"")"},
        {"uint", R"("0" | [1-9] [0-9]{0,15})"},
        {"integer", R"("-"? uint)"},
        {"fraction", R"("." [0-9]{1,16})"},
        {"exponent", R"([eE] [-+]? [0-9]{1,3})"},
        {"number", R"("-"? uint fraction? exponent?)"},
        {"boolean", R"("true" | "false")"},
        {"null", R"("null")"},
        {"value", R"(object | array | string | number | boolean | null)"},
        {"object", R"("{" (string ":" sp value ("," sp string ":" sp value)*)? "}")"},
        {"array", R"("[" (value ("," sp value)*)? "]")"},
        {"date",
         R"([0-9]{4} "-" (("01" | "03" | "05" | "07" | "08" | "10" | "12") "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("04" | "06" | "09" | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])))"},
        {"time",
         R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
        {"uuid", R"(hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12})"},
    };
    return rules;
}

// What each primitive uses, so the emitted grammar holds only what is needed.
const std::map<std::string, std::vector<std::string>>& primitive_deps() {
    static const std::map<std::string, std::vector<std::string>> deps = {
        {"char", {"hex"}},
        {"string", {"char"}},
        {"integer", {"uint"}},
        {"number", {"uint", "fraction", "exponent"}},
        {"value", {"object", "array", "string", "number", "boolean", "null"}},
        {"object", {"string", "sp", "value"}},
        {"array", {"value", "sp"}},
        {"uuid", {"hex"}},
    };
    return deps;
}

const std::set<std::string>& annotation_keywords() {
    static const std::set<std::string> k = {
        "title", "description", "default",    "examples", "$schema",
        "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
        "$defs", "definitions", "strict",     "name",     "contentMediaType"};
    return k;
}

// Keywords the converter reads; everything else is refused.
const std::set<std::string>& handled_keywords() {
    static const std::set<std::string> k = {"type",
                                            "properties",
                                            "required",
                                            "additionalProperties",
                                            "enum",
                                            "const",
                                            "anyOf",
                                            "oneOf",
                                            "allOf",
                                            "$ref",
                                            "items",
                                            "prefixItems",
                                            "minItems",
                                            "maxItems",
                                            "minLength",
                                            "maxLength",
                                            "minimum",
                                            "maximum",
                                            "exclusiveMinimum",
                                            "exclusiveMaximum",
                                            "pattern",
                                            "format",
                                            "nullable",
                                            "uniqueItems"};
    return k;
}

// The type each type-specific keyword applies to.
const std::map<std::string, std::string>& keyword_type() {
    static const std::map<std::string, std::string> owner = {{"properties", "object"},
                                                             {"required", "object"},
                                                             {"additionalProperties", "object"},
                                                             {"items", "array"},
                                                             {"prefixItems", "array"},
                                                             {"minItems", "array"},
                                                             {"maxItems", "array"},
                                                             {"uniqueItems", "array"},
                                                             {"minLength", "string"},
                                                             {"maxLength", "string"},
                                                             {"pattern", "string"},
                                                             {"format", "string"},
                                                             {"minimum", "number"},
                                                             {"maximum", "number"},
                                                             {"exclusiveMinimum", "number"},
                                                             {"exclusiveMaximum", "number"}};
    return owner;
}

std::string sanitize(const std::string& s) {
    std::string out;
    for (char c : s)
        out +=
            ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) ? c : '-';
    return out.empty() ? "x" : out;
}

std::string json_escape_pointer(const std::string& key) {
    std::string out;
    for (char c : key) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}

// ---------------------------------------------------------------------------

class Converter {
  public:
    explicit Converter(const json& root) : root_(root) {}

    std::string run() {
        std::string root = visit(root_, "#", "root");
        std::string out = "root ::= " + root + "\n";
        for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
        // Primitives and what they use, transitively.
        std::vector<std::string> todo(uses_.begin(), uses_.end());
        std::set<std::string> all;
        while (!todo.empty()) {
            std::string p = todo.back();
            todo.pop_back();
            if (!all.insert(p).second) continue;
            auto d = primitive_deps().find(p);
            if (d != primitive_deps().end())
                for (const auto& x : d->second) todo.push_back(x);
        }
        for (const auto& p : all) out += p + " ::= " + primitive_rules().at(p) + "\n";
        return out;
    }

  private:
    [[noreturn]] static void fail(const std::string& where, const std::string& what) {
        schema_fail(where, what);
    }

    std::string use(const std::string& primitive) {
        uses_.insert(primitive);
        return primitive;
    }

    std::string new_rule(const std::string& hint, std::string body) {
        std::string base = sanitize(hint);
        std::string name = base;
        for (int i = 2; taken_.count(name) || primitive_rules().count(name) || name == "root"; ++i)
            name = base + "-" + std::to_string(i);
        taken_.insert(name);
        rules_.push_back({name, std::move(body)});
        return name;
    }

    const json& resolve_ref(const std::string& ref, const std::string& where) {
        if (ref == "#") return root_;
        if (ref.rfind("#/", 0) != 0)
            fail(where, "$ref \"" + ref + "\" is not a reference inside this schema (#/...)");
        const json* cur = &root_;
        size_t pos = 2;
        while (pos <= ref.size()) {
            size_t slash = ref.find('/', pos);
            std::string part =
                ref.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
            std::string key;
            for (size_t i = 0; i < part.size(); ++i) {
                if (part[i] == '~' && i + 1 < part.size()) {
                    key += part[i + 1] == '1' ? '/' : '~';
                    ++i;
                } else {
                    key += part[i];
                }
            }
            if (cur->is_object() && cur->contains(key)) {
                cur = &(*cur)[key];
            } else if (cur->is_array() && !key.empty() &&
                       std::all_of(key.begin(), key.end(), ::isdigit) &&
                       std::stoul(key) < cur->size()) {
                cur = &(*cur)[std::stoul(key)];
            } else {
                fail(where, "$ref \"" + ref + "\" points to nothing");
            }
            if (slash == std::string::npos) break;
            pos = slash + 1;
        }
        return *cur;
    }

    std::string ref_rule(const std::string& ref, const std::string& where) {
        auto it = ref_rules_.find(ref);
        if (it != ref_rules_.end()) return it->second;
        const json& target = resolve_ref(ref, where);
        std::string hint = ref == "#" ? "root-ref" : ref.substr(ref.rfind('/') + 1);
        // Reserve the name before visiting so that recursion refers to it.
        std::string name = new_rule(hint, "");
        ref_rules_[ref] = name;
        std::string body = visit(target, ref, hint);
        for (auto& r : rules_)
            if (r.first == name) r.second = body;
        return name;
    }

    void check_keywords(const json& s, const std::string& where) {
        for (auto it = s.begin(); it != s.end(); ++it) {
            const std::string& k = it.key();
            if (annotation_keywords().count(k) || handled_keywords().count(k)) continue;
            if (k.rfind("x-", 0) == 0) continue;  // vendor annotations
            fail(where + "/" + json_escape_pointer(k),
                 "keyword '" + k + "' is not supported (it cannot be enforced)");
        }
    }

    static std::string alternatives(const std::vector<std::string>& alts) {
        if (alts.size() == 1) return alts[0];
        std::string out = "(";
        for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
        return out + ")";
    }

    static std::string literal_of(const json& v) { return gbnf_literal(v.dump()); }

    // Returns a GBNF expression for values of schema `s`.
    std::string visit(const json& s, const std::string& where, const std::string& hint) {
        if (s.is_boolean()) {
            if (!s.get<bool>()) fail(where, "schema 'false' matches nothing");
            return use("value");
        }
        if (!s.is_object()) fail(where, "a schema must be an object or a boolean");
        check_keywords(s, where);
        auto has = [&](const char* k) { return s.contains(k); };
        auto only_annotations_besides = [&](std::initializer_list<const char*> keep) {
            for (auto it = s.begin(); it != s.end(); ++it) {
                if (annotation_keywords().count(it.key())) continue;
                if (std::any_of(keep.begin(), keep.end(),
                                [&](const char* k) { return it.key() == k; }))
                    continue;
                return it.key();
            }
            return std::string();
        };
        if (has("$ref")) {
            std::string other = only_annotations_besides({"$ref"});
            if (!other.empty())
                fail(where + "/" + other, "'" + other + "' beside $ref is not supported");
            if (!s["$ref"].is_string()) fail(where + "/$ref", "$ref must be a string");
            return ref_rule(s["$ref"].get<std::string>(), where + "/$ref");
        }
        if (has("allOf")) return visit(merge_all_of(s, where), where, hint);
        if (has("const")) {
            std::string other = only_annotations_besides({"const", "type", "enum"});
            if (!other.empty())
                fail(where + "/" + other, "'" + other + "' beside const is not supported");
            if (has("enum") &&
                std::find(s["enum"].begin(), s["enum"].end(), s["const"]) == s["enum"].end())
                fail(where, "const is not one of enum");
            return literal_of(s["const"]);
        }
        if (has("enum")) {
            std::string other = only_annotations_besides({"enum", "type"});
            if (!other.empty())
                fail(where + "/" + other, "'" + other + "' beside enum is not supported");
            if (!s["enum"].is_array() || s["enum"].empty())
                fail(where + "/enum", "enum must be a non-empty array");
            std::vector<std::string> alts;
            for (const auto& v : s["enum"]) {
                if (has("type") && !value_has_type(v, s["type"])) continue;
                alts.push_back(literal_of(v));
            }
            if (alts.empty()) fail(where + "/enum", "no enum value has the schema's type");
            return alternatives(alts);
        }
        if (has("anyOf") || has("oneOf")) {
            const char* key = has("anyOf") ? "anyOf" : "oneOf";
            if (has("anyOf") && has("oneOf"))
                fail(where, "anyOf together with oneOf is not supported");
            std::string other = only_annotations_besides({key});
            if (!other.empty())
                fail(where + "/" + other, "'" + other + "' beside " + key + " is not supported");
            const json& branches = s[key];
            if (!branches.is_array() || branches.empty())
                fail(where + "/" + key, std::string(key) + " must be a non-empty array");
            if (std::string(key) == "oneOf") check_one_of_disjoint(branches, where + "/oneOf");
            std::vector<std::string> alts;
            for (size_t i = 0; i < branches.size(); ++i)
                alts.push_back(visit(branches[i], where + "/" + key + "/" + std::to_string(i),
                                     hint + "-" + std::to_string(i)));
            return alternatives(alts);
        }
        if (has("type") && s["type"].is_array()) {
            std::vector<std::string> alts;
            if (s["type"].empty()) fail(where + "/type", "type array is empty");
            for (const auto& t : s["type"]) {
                if (!t.is_string()) fail(where + "/type", "type array holds a non-string");
                // Each type keeps only the keywords that apply to it.
                json copy = s;
                copy["type"] = t;
                for (auto it = s.begin(); it != s.end(); ++it) {
                    auto o = keyword_type().find(it.key());
                    if (o != keyword_type().end() && o->second != t.get<std::string>() &&
                        !(o->second == "number" && t == "integer"))
                        copy.erase(it.key());
                }
                alts.push_back(visit(copy, where, hint));
            }
            return alternatives(alts);
        }
        std::string type;
        if (has("type")) {
            if (!s["type"].is_string()) fail(where + "/type", "type must be a string or an array");
            type = s["type"].get<std::string>();
        } else if (has("properties") || has("additionalProperties") || has("required")) {
            type = "object";
        } else if (has("items") || has("prefixItems") || has("minItems") || has("maxItems")) {
            type = "array";
        } else if (has("minLength") || has("maxLength") || has("pattern") || has("format")) {
            type = "string";
        } else if (has("minimum") || has("maximum") || has("exclusiveMinimum") ||
                   has("exclusiveMaximum")) {
            type = "number";
        } else {
            return use("value");
        }
        check_type_keywords(s, type, where);
        if (type == "object") return visit_object(s, where, hint);
        if (type == "array") return visit_array(s, where, hint);
        if (type == "string") return schema_string_gbnf(s, where, uses_);
        if (type == "integer") return schema_integer_gbnf(s, where, uses_);
        if (type == "number") return schema_number_gbnf(s, where, uses_);
        if (type == "boolean") return use("boolean");
        if (type == "null") return use("null");
        fail(where + "/type", "unknown type '" + type + "'");
    }

    static bool value_has_type(const json& v, const json& type) {
        auto one = [&](const std::string& t) {
            if (t == "string") return v.is_string();
            if (t == "integer")
                return v.is_number_integer() ||
                       (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
            if (t == "number") return v.is_number();
            if (t == "boolean") return v.is_boolean();
            if (t == "null") return v.is_null();
            if (t == "object") return v.is_object();
            if (t == "array") return v.is_array();
            return false;
        };
        if (type.is_string()) return one(type.get<std::string>());
        for (const auto& t : type)
            if (t.is_string() && one(t.get<std::string>())) return true;
        return false;
    }

    // A keyword of another type beside `type` would be ignored by a validator
    // too, but it is more likely a mistake: refuse it.
    void check_type_keywords(const json& s, const std::string& type, const std::string& where) {
        const auto& owner = keyword_type();
        for (auto it = s.begin(); it != s.end(); ++it) {
            auto o = owner.find(it.key());
            if (o == owner.end()) continue;
            bool ok = o->second == type || (o->second == "number" && type == "integer");
            if (!ok)
                fail(where + "/" + it.key(),
                     "'" + it.key() + "' does not apply to type '" + type + "'");
        }
    }

    json merge_all_of(const json& s, const std::string& where) {
        const json& parts = s["allOf"];
        if (!parts.is_array() || parts.empty())
            fail(where + "/allOf", "allOf must be a non-empty array");
        json merged = s;
        merged.erase("allOf");
        for (size_t i = 0; i < parts.size(); ++i) {
            std::string w = where + "/allOf/" + std::to_string(i);
            json part = parts[i];
            for (int depth = 0; part.is_object() && part.contains("$ref"); ++depth) {
                if (depth > 32) fail(w, "$ref chain too long");
                part = resolve_ref(part["$ref"].get<std::string>(), w);
            }
            if (!part.is_object()) fail(w, "allOf part must be a schema object");
            if (part.contains("allOf")) part = merge_all_of(part, w);
            for (auto it = part.begin(); it != part.end(); ++it) {
                const std::string& k = it.key();
                if (annotation_keywords().count(k)) continue;
                if (k == "properties") {
                    for (auto p = it->begin(); p != it->end(); ++p) {
                        if (merged["properties"].contains(p.key()) &&
                            merged["properties"][p.key()] != p.value())
                            fail(w + "/properties/" + json_escape_pointer(p.key()),
                                 "allOf parts give property '" + p.key() +
                                     "' different schemas (cannot be merged)");
                        merged["properties"][p.key()] = p.value();
                    }
                } else if (k == "required") {
                    for (const auto& r : *it)
                        if (!merged.contains("required") ||
                            std::find(merged["required"].begin(), merged["required"].end(), r) ==
                                merged["required"].end())
                            merged["required"].push_back(r);
                } else if (!merged.contains(k)) {
                    merged[k] = it.value();
                } else if (merged[k] != it.value()) {
                    fail(w + "/" + k, "allOf parts disagree on '" + k + "' (cannot be merged)");
                }
            }
        }
        // A part closed by additionalProperties: false refuses the properties
        // the other parts add: merging would produce values allOf rejects.
        for (size_t i = 0; i < parts.size(); ++i) {
            json part = parts[i];
            for (int depth = 0; part.is_object() && part.contains("$ref") && depth < 32; ++depth)
                part = resolve_ref(part["$ref"].get<std::string>(), where);
            if (!part.is_object() || !part.contains("additionalProperties") ||
                part["additionalProperties"] != false || !merged.contains("properties"))
                continue;
            for (auto p = merged["properties"].begin(); p != merged["properties"].end(); ++p)
                if (!part.contains("properties") || !part["properties"].contains(p.key()))
                    fail(where + "/allOf/" + std::to_string(i),
                         "allOf part with additionalProperties: false does not list property '" +
                             p.key() + "' another part adds (no value satisfies both)");
        }
        return merged;
    }

    // oneOf equals anyOf only when no value matches two branches: accepted when
    // the branches have different types, or are objects told apart by one
    // required property with different const / enum values.
    void check_one_of_disjoint(const json& branches, const std::string& where) {
        auto resolved = [&](json b) {
            for (int d = 0; b.is_object() && b.contains("$ref") && d < 32; ++d)
                b = resolve_ref(b["$ref"].get<std::string>(), where);
            return b;
        };
        std::vector<json> bs;
        for (const auto& b : branches) bs.push_back(resolved(b));
        auto types_of = [](const json& b) {
            std::set<std::string> t;
            if (b.is_object() && b.contains("type")) {
                if (b["type"].is_string())
                    t.insert(b["type"].get<std::string>());
                else
                    for (const auto& x : b["type"]) t.insert(x.get<std::string>());
            } else if (b.is_object() && b.contains("const")) {
                t.insert("const:" + b["const"].dump());
            }
            if (t.count("number")) t.insert("integer");
            if (t.count("integer")) t.insert("number");
            return t;
        };
        auto discriminator_values = [](const json& b, const std::string& key) {
            std::set<std::string> v;
            if (!b.is_object() || !b.contains("properties") || !b["properties"].contains(key))
                return v;
            bool required =
                b.contains("required") &&
                std::find(b["required"].begin(), b["required"].end(), key) != b["required"].end();
            if (!required) return v;
            const json& p = b["properties"][key];
            if (p.contains("const")) v.insert(p["const"].dump());
            if (p.contains("enum"))
                for (const auto& e : p["enum"]) v.insert(e.dump());
            return v;
        };
        for (size_t i = 0; i < bs.size(); ++i)
            for (size_t j = i + 1; j < bs.size(); ++j) {
                auto ti = types_of(bs[i]), tj = types_of(bs[j]);
                bool disjoint_types = !ti.empty() && !tj.empty();
                for (const auto& t : ti)
                    if (tj.count(t)) disjoint_types = false;
                if (disjoint_types) continue;
                bool told_apart = false;
                if (bs[i].is_object() && bs[i].contains("properties"))
                    for (auto p = bs[i]["properties"].begin(); p != bs[i]["properties"].end();
                         ++p) {
                        auto vi = discriminator_values(bs[i], p.key());
                        auto vj = discriminator_values(bs[j], p.key());
                        if (vi.empty() || vj.empty()) continue;
                        bool overlap = false;
                        for (const auto& x : vi)
                            if (vj.count(x)) overlap = true;
                        if (!overlap) told_apart = true;
                    }
                if (!told_apart)
                    fail(where, "oneOf branches " + std::to_string(i) + " and " +
                                    std::to_string(j) +
                                    " may both match a value (only oneOf with different types or a "
                                    "const discriminator property is supported)");
            }
    }

    std::string visit_object(const json& s, const std::string& where, const std::string& hint) {
        for (const char* k : {"minProperties", "maxProperties", "patternProperties"})
            if (s.contains(k))
                fail(where + "/" + k, std::string("keyword '") + k + "' is not supported");
        std::vector<std::pair<std::string, bool>> props;  // name, required
        std::set<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) fail(where + "/required", "required must be an array");
            for (const auto& r : s["required"]) required.insert(r.get<std::string>());
        }
        const json empty = json::object();
        const json& properties = s.contains("properties") ? s["properties"] : empty;
        if (!properties.is_object()) fail(where + "/properties", "properties must be an object");
        for (const auto& r : required)
            if (!properties.contains(r))
                fail(where + "/required", "required property '" + r + "' is not in properties");
        if (properties.empty()) {
            // A map: any keys, values of additionalProperties (any value if absent).
            std::string v = use("value");
            if (s.contains("additionalProperties")) {
                const json& ap = s["additionalProperties"];
                if (ap.is_boolean() && !ap.get<bool>()) return gbnf_literal("{}");
                v = visit(ap, where + "/additionalProperties", hint + "-value");
            }
            std::string kv = use("string") + " \":\" " + use("sp") + " " + v;
            return new_rule(hint, "\"{\" (" + kv + " (\",\" sp " + kv + ")*)? \"}\"");
        }
        std::vector<std::string> kv;
        std::vector<bool> req;
        for (auto it = properties.begin(); it != properties.end(); ++it) {
            std::string w = where + "/properties/" + json_escape_pointer(it.key());
            std::string value = visit(it.value(), w, hint + "-" + it.key());
            kv.push_back(gbnf_literal(json(it.key()).dump() + ":") + " " + use("sp") + " " + value);
            req.push_back(required.count(it.key()) > 0);
        }
        size_t n = kv.size();
        // after[i]: a property was written, properties i.. may follow (each
        // after a comma); first[i]: none written yet.
        std::vector<std::string> after(n + 1), first(n + 1);
        after[n] = first[n] = "";
        for (size_t i = n; i-- > 0;) {
            std::string item = "\",\" sp " + kv[i];
            std::string tail = after[i + 1].empty() ? "" : " " + after[i + 1];
            after[i] = req[i] ? item + tail : "(" + item + ")?" + tail;
            if (!req[i] && i + 1 < n)
                after[i] = new_rule(hint + "-after-" + std::to_string(i), after[i]);
            std::string with = kv[i] + tail;
            if (req[i]) {
                first[i] = with;
            } else {
                first[i] = first[i + 1].empty() ? "(" + with + ")?"
                                                : "(" + with + " | " + first[i + 1] + ")";
            }
        }
        return new_rule(hint, "\"{\" " + first[0] + " \"}\"");
    }

    std::string visit_array(const json& s, const std::string& where, const std::string& hint) {
        if (s.contains("uniqueItems") && s["uniqueItems"] != false)
            fail(where + "/uniqueItems", "keyword 'uniqueItems' is not supported");
        for (const char* k : {"contains", "minContains", "maxContains"})
            if (s.contains(k))
                fail(where + "/" + k, std::string("keyword '") + k + "' is not supported");
        int64_t min_items = schema_repeat_count(s, "minItems", 0, where),
                max_items = schema_repeat_count(s, "maxItems", -1, where);
        if (max_items >= 0 && max_items < min_items) fail(where, "maxItems is below minItems");
        std::vector<std::string> prefix;
        if (s.contains("prefixItems")) {
            if (!s["prefixItems"].is_array())
                fail(where + "/prefixItems", "prefixItems must be an array");
            for (size_t i = 0; i < s["prefixItems"].size(); ++i)
                prefix.push_back(visit(s["prefixItems"][i],
                                       where + "/prefixItems/" + std::to_string(i),
                                       hint + "-" + std::to_string(i)));
        }
        std::string item;
        bool more = true;
        if (s.contains("items")) {
            if (s["items"].is_boolean() && !s["items"].get<bool>())
                more = false;
            else
                item = visit(s["items"], where + "/items", hint + "-item");
        } else if (!prefix.empty()) {
            more = false;  // only the prefix is produced
        } else {
            item = use("value");
        }
        int64_t k = int64_t(prefix.size());
        if (max_items >= 0 && max_items < k)
            fail(where + "/maxItems", "maxItems below the number of prefixItems is not supported");
        if (!more && min_items > k)
            fail(where + "/minItems",
                 "minItems above the number of prefixItems with no more items allowed");
        use("sp");
        auto bound = [](int64_t lo, int64_t hi) {
            return "{" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "}";
        };
        std::string body;
        if (k > 0) {
            for (int64_t i = 0; i < k; ++i) body += (i ? " \",\" sp " : "") + prefix[size_t(i)];
            if (more) {
                int64_t lo = std::max<int64_t>(0, min_items - k);
                int64_t hi = max_items < 0 ? -1 : max_items - k;
                if (hi != 0) body += " (\",\" sp " + item + ")" + bound(lo, hi);
            }
        } else if (max_items == 0) {
            body = "";
        } else if (min_items == 0) {
            body = "(" + item + " (\",\" sp " + item + ")" +
                   bound(0, max_items < 0 ? -1 : max_items - 1) + ")?";
        } else {
            body = item + " (\",\" sp " + item + ")" +
                   bound(min_items - 1, max_items < 0 ? -1 : max_items - 1);
        }
        return new_rule(hint, "\"[\" " + body + " \"]\"");
    }

    const json& root_;
    std::vector<std::pair<std::string, std::string>> rules_;
    std::set<std::string> taken_;
    std::set<std::string> uses_;
    std::map<std::string, std::string> ref_rules_;
};

}  // namespace

std::string json_schema_to_gbnf(const json& schema) {
    return Converter(schema).run();
}

std::string json_schema_text_to_gbnf(std::string_view schema_text) {
    json schema;
    try {
        schema = json::parse(schema_text);
    } catch (const json::parse_error& e) {
        throw Error(std::string("JSON schema: not valid JSON: ") + e.what());
    }
    return json_schema_to_gbnf(schema);
}

std::string json_object_gbnf() {
    return json_schema_to_gbnf(json::parse(R"({"type": "object"})"));
}

}  // namespace minfer::structured
