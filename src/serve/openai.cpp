#include "serve/openai.h"

#include <cmath>
#include <limits>
#include <random>

#include "serve/reply_grammar.h"
#include "structured/json_schema.h"

namespace minfer::serve {

using json = RequestJson;

json parse_json_object(const std::string& body) {
    json j;
    try {
        j = json::parse(body);
    } catch (const json::parse_error& e) {
        throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
}

namespace {

const char* type_name(const json& v) {
    return v.type_name();
}

// Optional fields: absent or null means the default.
bool has(const json& b, const char* key) {
    return b.contains(key) && !b[key].is_null();
}

double get_number(const json& b, const char* key, double lo, double hi) {
    const json& v = b[key];
    if (!v.is_number())
        throw ApiError(400, std::string("'") + key + "' must be a number, got " + type_name(v),
                       key);
    double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
        throw ApiError(400,
                       std::string("'") + key + "' must be between " + std::to_string(lo) +
                           " and " + std::to_string(hi) + ", got " + v.dump(),
                       key);
    return x;
}

int64_t get_int(const json& b, const char* key, int64_t lo, int64_t hi) {
    const json& v = b[key];
    if (!v.is_number_integer())
        throw ApiError(400, std::string("'") + key + "' must be an integer, got " + v.dump(), key);
    int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                    ? INT64_MAX
                    : v.get<int64_t>();
    if (x < lo || x > hi)
        throw ApiError(400,
                       std::string("'") + key + "' must be between " + std::to_string(lo) +
                           " and " + std::to_string(hi) + ", got " + v.dump(),
                       key);
    return x;
}

bool get_bool(const json& b, const char* key) {
    const json& v = b[key];
    if (!v.is_boolean())
        throw ApiError(400, std::string("'") + key + "' must be true or false, got " + v.dump(),
                       key);
    return v.get<bool>();
}

// "content": a string, or a list of parts of which only text is supported.
// Absent or null only where OpenAI allows it: an assistant message that
// carries tool_calls (a user turn of nothing would generate from nothing).
std::string message_content(const json& m, size_t i) {
    const std::string where = "messages[" + std::to_string(i) + "].content";
    if (!m.contains("content") || m["content"].is_null()) {
        if (m["role"] == "assistant" && has(m, "tool_calls")) return {};
        throw ApiError(400,
                       "'" + where + "' is " + (m.contains("content") ? "null" : "missing") +
                           ": a " + m["role"].get<std::string>() +
                           " message needs content (a string or a list of text parts)",
                       where);
    }
    const json& c = m["content"];
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array())
        throw ApiError(400, "'" + where + "' must be a string or a list of parts", where);
    std::string out;
    for (const json& part : c) {
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            throw ApiError(400, "each part of '" + where + "' must be an object with a 'type'",
                           where);
        const std::string type = part["type"].get<std::string>();
        if (type != "text")
            throw ApiError(400,
                           "content parts of type '" + type +
                               "' are not supported (only 'text'): this model reads text only",
                           where);
        if (!part.contains("text") || !part["text"].is_string())
            throw ApiError(400, "a text part of '" + where + "' needs a string 'text'", where);
        out += part["text"].get<std::string>();
    }
    return out;
}

std::vector<ChatMsg> parse_messages(const json& b) {
    if (!b.contains("messages")) throw ApiError(400, "'messages' is required", "messages");
    const json& ms = b["messages"];
    if (!ms.is_array() || ms.empty())
        throw ApiError(400, "'messages' must be a non-empty list", "messages");
    std::vector<ChatMsg> out;
    for (size_t i = 0; i < ms.size(); ++i) {
        const json& m = ms[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) throw ApiError(400, "'" + where + "' must be an object", where);
        if (!m.contains("role") || !m["role"].is_string())
            throw ApiError(400, "'" + where + ".role' must be a string", where + ".role");
        const std::string role = m["role"].get<std::string>();
        if (role != "system" && role != "user" && role != "assistant" && role != "developer" &&
            role != "tool")
            throw ApiError(400,
                           "'" + where +
                               ".role' must be system, user, assistant, developer or tool, got '" +
                               role + "'",
                           where + ".role");
        ChatMsg msg{role == "developer" ? "system" : role, message_content(m, i), {}};
        // A reply's reasoning, as a client that keeps it sends it back.
        if (role == "assistant" && has(m, "reasoning_content")) {
            if (!m["reasoning_content"].is_string())
                throw ApiError(400, "'" + where + ".reasoning_content' must be a string",
                               where + ".reasoning_content");
            msg.reasoning = m["reasoning_content"].get<std::string>();
        }
        if (has(m, "tool_calls")) {
            const json& tc = m["tool_calls"];
            if (role != "assistant" || !tc.is_array())
                throw ApiError(400,
                               "'" + where + ".tool_calls' must be a list, on an assistant message",
                               where + ".tool_calls");
            for (const json& c : tc) {
                const json* f = c.is_object() && c.contains("function") ? &c["function"] : nullptr;
                if (!f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
                    throw ApiError(
                        400, "each of '" + where + ".tool_calls' needs a function with a name",
                        where + ".tool_calls");
                ToolCallMsg call;
                call.name = (*f)["name"].get<std::string>();
                call.arguments = json::object();
                if (f->contains("arguments")) {
                    const json& a = (*f)["arguments"];
                    // OpenAI sends the arguments as JSON text; the template
                    // writes them as an object.
                    call.arguments =
                        a.is_string() ? json::parse(a.get<std::string>(), nullptr, false) : a;
                    if (call.arguments.is_discarded())
                        throw ApiError(
                            400, "the arguments of '" + where + ".tool_calls' are not valid JSON",
                            where + ".tool_calls");
                }
                msg.tool_calls.push_back(std::move(call));
            }
        }
        out.push_back(std::move(msg));
    }
    return out;
}

// "tools" and what the reply may or must do with them.
struct ChatTools {
    std::vector<json> tools;  // as sent; empty: none offered (or tool_choice "none")
    enum class Choice { Auto, Required, Named } choice = Choice::Auto;
    std::string name;  // Named: the function the reply calls
    bool parallel = true;
};

ChatTools parse_tools(const json& b) {
    ChatTools out;
    if (has(b, "tools")) {
        const json& t = b["tools"];
        if (!t.is_array()) throw ApiError(400, "'tools' must be a list", "tools");
        for (const json& x : t) {
            if (!x.is_object() || x.value("type", "") != "function" || !x.contains("function") ||
                !x["function"].is_object() || !x["function"].contains("name") ||
                !x["function"]["name"].is_string())
                throw ApiError(
                    400,
                    "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    "tools");
            out.tools.push_back(x);
        }
    }
    if (has(b, "parallel_tool_calls")) out.parallel = get_bool(b, "parallel_tool_calls");
    if (!has(b, "tool_choice")) return out;
    const json& c = b["tool_choice"];
    const std::string mode = c.is_string() ? c.get<std::string>() : std::string();
    if (mode == "none") {
        out.tools.clear();  // not offered: the prompt does not list them
        return out;
    }
    if (mode == "auto") return out;
    if (mode == "required") {
        out.choice = ChatTools::Choice::Required;
    } else if (c.is_object() && c.value("type", "") == "function" && c.contains("function") &&
               c["function"].is_object() && c["function"].contains("name") &&
               c["function"]["name"].is_string()) {
        out.choice = ChatTools::Choice::Named;
        out.name = c["function"]["name"].get<std::string>();
        bool offered = false;
        for (const json& x : out.tools) offered = offered || x["function"]["name"] == out.name;
        if (!offered)
            throw ApiError(
                400,
                "'tool_choice' names the function '" + out.name + "', which is not one of 'tools'",
                "tool_choice");
    } else {
        throw ApiError(400,
                       "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}, got " +
                           c.dump(),
                       "tool_choice");
    }
    if (out.tools.empty())
        throw ApiError(400, "'tool_choice' forces a tool call but no 'tools' are given",
                       "tool_choice");
    return out;
}

// A JSON schema as a grammar; a schema that cannot be enforced is a 400
// naming the field and, inside it, the keyword and where it is.
std::string schema_gbnf(const json& schema, const std::string& param) {
    try {
        return structured::json_schema_to_gbnf(schema);
    } catch (const Error& e) {
        throw ApiError(400, "'" + param + "' cannot be enforced: " + e.what(), param);
    }
}

// The reply's own constraint: response_format (OpenAI), json_schema or
// grammar (llama-server). At most one of them.
struct ContentConstraint {
    std::string gbnf, param, kind;
    bool raw = false;  // grammar: the whole reply as given, nothing around it
};

ContentConstraint parse_content_constraint(const json& b) {
    std::vector<ContentConstraint> found;
    if (has(b, "response_format")) {
        const json& f = b["response_format"];
        if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
            throw ApiError(400, "'response_format' must be an object with a string 'type'",
                           "response_format");
        const std::string type = f["type"].get<std::string>();
        if (type == "json_object") {
            // llama-server's extension: a schema beside the type.
            if (has(f, "schema"))
                found.push_back({schema_gbnf(f["schema"], "response_format.schema"),
                                 "response_format.schema", "json_schema"});
            else
                found.push_back({structured::json_object_gbnf(), "response_format", "json_object"});
        } else if (type == "json_schema") {
            const std::string where = "response_format.json_schema";
            if (!has(f, "json_schema") || !f["json_schema"].is_object())
                throw ApiError(
                    400, "'" + where + "' must be an object {\"name\", \"schema\", \"strict\"}",
                    where);
            const json& js = f["json_schema"];
            if (has(js, "name") && !js["name"].is_string())
                throw ApiError(400, "'" + where + ".name' must be a string", where + ".name");
            // strict false asks for best effort; the schema is enforced either way.
            if (has(js, "strict") && !js["strict"].is_boolean())
                throw ApiError(400, "'" + where + ".strict' must be true or false",
                               where + ".strict");
            // No schema: any JSON value.
            const json schema = has(js, "schema") ? js["schema"] : json::object();
            found.push_back(
                {schema_gbnf(schema, where + ".schema"), where + ".schema", "json_schema"});
        } else if (type != "text") {
            throw ApiError(400,
                           "'response_format.type' must be \"text\", \"json_object\" or "
                           "\"json_schema\", got \"" +
                               type + "\"",
                           "response_format");
        }
    }
    if (has(b, "json_schema"))
        found.push_back(
            {schema_gbnf(b["json_schema"], "json_schema"), "json_schema", "json_schema"});
    if (has(b, "grammar")) {
        if (!b["grammar"].is_string())
            throw ApiError(400, "'grammar' must be a string (GBNF)", "grammar");
        // An empty grammar is none (as llama-server takes it).
        if (!b["grammar"].get<std::string>().empty())
            found.push_back({b["grammar"].get<std::string>(), "grammar", "grammar", true});
    }
    if (found.size() > 1)
        throw ApiError(400,
                       "'" + found[0].param + "' and '" + found[1].param +
                           "' both constrain the reply: give one",
                       found[1].param);
    return found.empty() ? ContentConstraint{} : found[0];
}

// The grammar of a chat reply (CompletionRequest::grammar): a forced tool
// call, or the content constraint — with the tools offered as the other
// choice when tool_choice is auto — in Qwen's format, after Qwen3's think
// block when thinking is on.
void chat_grammar(CompletionRequest& r, const ChatTools& t, const ContentConstraint& content) {
    const bool forced = t.choice != ChatTools::Choice::Auto;
    if (forced && !content.gbnf.empty())
        throw ApiError(400,
                       "'" + content.param +
                           "' cannot be combined with a forced tool call ('tool_choice'): the "
                           "reply is the call",
                       content.param);
    if (content.raw) {
        r.grammar = content.gbnf;
        r.grammar_param = content.param;
        r.grammar_kind = content.kind;
        return;
    }
    if (!forced && content.gbnf.empty()) return;
    std::vector<ToolGrammar> tools;
    for (size_t i = 0; i < t.tools.size(); ++i) {
        const json& f = t.tools[i]["function"];
        const std::string name = f["name"].get<std::string>();
        if (t.choice == ChatTools::Choice::Named && name != t.name) continue;
        const std::string where = "tools[" + std::to_string(i) + "].function.parameters";
        // No parameters: OpenAI's empty parameter list.
        const json params = has(f, "parameters")
                                ? f["parameters"]
                                : json::parse(R"({"type": "object", "properties": {},
                                                      "additionalProperties": false})");
        tools.push_back({name, schema_gbnf(params, where)});
    }
    r.grammar = chat_reply_gbnf(r.think, tools, t.parallel, content.gbnf);
    r.grammar_param = forced ? "tool_choice" : content.param;
    r.grammar_kind = forced ? "tool_call" : content.kind;
}

// One prompt: text, or a list of token ids. `where` names it in errors.
std::vector<int32_t> one_prompt(const json& p, const tokenizer::Tokenizer& tok,
                                const std::string& where) {
    if (p.is_string()) return tok.encode(p.get<std::string>(), true, true);
    if (p.is_array() && !p.empty() && p[0].is_number()) {
        std::vector<int32_t> ids;
        for (const json& t : p) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
                throw ApiError(400,
                               "'" + where + "' token ids must be integers in [0, " +
                                   std::to_string(tok.n_vocab()) + "), got " + t.dump(),
                               "prompt");
            ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
        return ids;
    }
    throw ApiError(400, "'" + where + "' must be a string or a list of token ids", "prompt");
}

// "prompt": a string, a list of token ids, or a list of either (OpenAI's
// batch: one choice per prompt).
std::vector<std::vector<int32_t>> parse_prompts(const json& b, const tokenizer::Tokenizer& tok) {
    if (!b.contains("prompt")) throw ApiError(400, "'prompt' is required", "prompt");
    const json& p = b["prompt"];
    const bool list = p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
    if (!list) return {one_prompt(p, tok, "prompt")};
    std::vector<std::vector<int32_t>> out;
    for (size_t i = 0; i < p.size(); ++i) {
        const std::string where = "prompt[" + std::to_string(i) + "]";
        if (!p[i].is_string() && !p[i].is_array())
            throw ApiError(400, "'" + where + "' must be a string or a list of token ids",
                           "prompt");
        out.push_back(one_prompt(p[i], tok, where));
    }
    return out;
}

}  // namespace

CompletionRequest parse_completion_request(const json& b, bool chat,
                                           const tokenizer::Tokenizer& tok, int64_t n_ctx,
                                           int32_t n_parallel, const ChatFlavor& flavor) {
    CompletionRequest r;
    r.chat = chat;
    // Features not supported are refused by name rather than silently ignored.
    for (const char* k : {"functions", "function_call", "logit_bias"})
        if (has(b, k)) throw ApiError(400, std::string("'") + k + "' is not supported yet", k);
    if (has(b, "model")) {
        if (!b["model"].is_string()) throw ApiError(400, "'model' must be a string", "model");
        r.model = b["model"].get<std::string>();
    }

    // llama-server's sampling defaults.
    auto& sp = r.gen.sampling;
    sp.temp = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.min_p = 0.05f;
    sp.repeat_penalty = 1.0f;
    if (has(b, "temperature")) sp.temp = static_cast<float>(get_number(b, "temperature", 0, 2));
    if (has(b, "top_p")) sp.top_p = static_cast<float>(get_number(b, "top_p", 0, 1));
    if (has(b, "top_k")) sp.top_k = static_cast<int32_t>(get_int(b, "top_k", 0, 1 << 30));
    if (has(b, "min_p")) sp.min_p = static_cast<float>(get_number(b, "min_p", 0, 1));
    if (has(b, "seed"))
        sp.seed = static_cast<uint64_t>(get_int(b, "seed", INT64_MIN, INT64_MAX));
    else
        sp.seed = std::random_device{}();
    if (has(b, "presence_penalty"))
        r.gen.presence_penalty = static_cast<float>(get_number(b, "presence_penalty", -2, 2));
    if (has(b, "frequency_penalty"))
        r.gen.frequency_penalty = static_cast<float>(get_number(b, "frequency_penalty", -2, 2));
    const char* max_key = has(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (has(b, max_key)) r.gen.n_predict = get_int(b, max_key, 0, INT32_MAX);
    if (has(b, "n")) r.gen.n_samples = static_cast<int32_t>(get_int(b, "n", 1, n_parallel));
    if (has(b, "ignore_eos")) r.gen.ignore_eos = get_bool(b, "ignore_eos");
    if (has(b, "stream")) r.stream = get_bool(b, "stream");
    if (has(b, "stream_options")) {
        const json& so = b["stream_options"];
        if (!so.is_object())
            throw ApiError(400, "'stream_options' must be an object", "stream_options");
        if (has(so, "include_usage")) r.include_usage = get_bool(so, "include_usage");
    }
    if (has(b, "stop")) {
        const json& s = b["stop"];
        if (s.is_string()) {
            r.stops.push_back(s.get<std::string>());
        } else if (s.is_array() && s.size() <= 16) {
            for (const json& x : s) {
                if (!x.is_string())
                    throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
                r.stops.push_back(x.get<std::string>());
            }
        } else {
            throw ApiError(400, "'stop' must be a string or a list of at most 16 strings", "stop");
        }
    }
    if (chat) {
        if (has(b, "logprobs")) r.logprobs = get_bool(b, "logprobs");
        if (has(b, "top_logprobs")) {
            r.gen.top_logprobs = static_cast<int32_t>(get_int(b, "top_logprobs", 0, 20));
            if (!r.logprobs)
                throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
        } else if (r.logprobs) {
            r.gen.top_logprobs = 0;
        }
    } else if (has(b, "logprobs")) {
        r.gen.top_logprobs = static_cast<int32_t>(get_int(b, "logprobs", 0, 5));
        r.logprobs = true;
    }
    if (!chat && has(b, "echo") && get_bool(b, "echo"))
        throw ApiError(400, "'echo' is not supported", "echo");
    if (!chat && has(b, "suffix")) throw ApiError(400, "'suffix' is not supported", "suffix");

    if (chat) {
        auto messages = parse_messages(b);
        bool no_think = false;
        if (has(b, "chat_template_kwargs")) {
            const json& k = b["chat_template_kwargs"];
            if (!k.is_object())
                throw ApiError(400, "'chat_template_kwargs' must be an object",
                               "chat_template_kwargs");
            if (has(k, "enable_thinking")) no_think = !get_bool(k, "enable_thinking");
        }
        const ChatTools tools = parse_tools(b);
        r.tools = !tools.tools.empty();
        r.think = flavor.qwen3 && !no_think;
        chat_grammar(r, tools, parse_content_constraint(b));
        const std::string text = render_chat(messages, tools.tools, flavor, no_think);
        r.prompts.push_back(tok.encode(text, true, true));
    } else {
        const ContentConstraint content = parse_content_constraint(b);
        r.grammar = content.gbnf;
        r.grammar_param = content.param;
        r.grammar_kind = content.kind;
        r.prompts = parse_prompts(b, tok);
    }
    for (size_t i = 0; i < r.prompts.size(); ++i) {
        const std::string where = chat                   ? "messages"
                                  : r.prompts.size() > 1 ? "prompt[" + std::to_string(i) + "]"
                                                         : "prompt";
        const int64_t n_prompt = static_cast<int64_t>(r.prompts[i].size());
        if (n_prompt == 0)
            throw ApiError(400, "'" + where + "' is empty", chat ? "messages" : "prompt");
        if (n_prompt + 1 > n_ctx)
            throw ApiError(400,
                           "the prompt" + (r.prompts.size() > 1 ? " " + where : std::string()) +
                               " has " + std::to_string(n_prompt) +
                               " tokens but the context holds " + std::to_string(n_ctx) +
                               " (the prompt and at least one generated token must fit)",
                           chat ? "messages" : "prompt", "context_length_exceeded");
    }
    r.gen.prompt = r.prompts[0];
    return r;
}

}  // namespace minfer::serve
