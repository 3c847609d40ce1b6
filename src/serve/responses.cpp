#include "serve/responses.h"

#include <cstdio>
#include <mutex>
#include <random>

#include "serve/job_impl.h"

namespace minfer::serve {

using nlohmann::json;

const char* error_type(int status) {
    switch (status) {
        case 400:
            return "invalid_request_error";
        case 401:
        case 404:
        case 413:
            return "invalid_request_error";
        case 503:
            return "unavailable_error";
        default:
            return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

json error_body(int status, const std::string& message, const std::string& param,
                const std::string& code) {
    json e = {{"message", message}, {"type", error_type(status)}};
    e["code"] = code.empty() ? json(nullptr) : json(code);
    e["param"] = param.empty() ? json(nullptr) : json(param);
    return json{{"error", e}};
}

std::string dump_json(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& j) {
    return "data: " + dump_json(j) + "\n\n";
}

std::string random_id(const char* prefix) {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard<std::mutex> lk(mu);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
    return std::string(prefix) + buf;
}

int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

const char* finish_reason_openai(runtime::FinishReason r) {
    switch (r) {
        case runtime::FinishReason::Length:
        case runtime::FinishReason::ContextFull:
            return "length";
        default:
            return "stop";
    }
}

json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

json logprob_entry(const tokenizer::Tokenizer& tok, const runtime::TokenEvent& ev) {
    const std::string piece = tok.token_to_piece(ev.token);
    json tops = json::array();
    for (const auto& [t, lp] : ev.top) {
        const std::string p = tok.token_to_piece(t);
        tops.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes_of(p)}});
    }
    return {{"token", piece},
            {"logprob", ev.logprob},
            {"bytes", bytes_of(piece)},
            {"top_logprobs", tops}};
}

json completion_logprobs(const std::vector<json>& entries, bool with_offsets) {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(),
         offsets = json::array();
    size_t off = 0;
    for (const auto& e : entries) {
        tokens.push_back(e["token"]);
        token_lps.push_back(e["logprob"]);
        json t = json::object();
        for (const auto& x : e["top_logprobs"]) t[x["token"].get<std::string>()] = x["logprob"];
        tops.push_back(t);
        offsets.push_back(off);
        off += e["token"].get<std::string>().size();
    }
    json lp = {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}};
    if (with_offsets) lp["text_offset"] = offsets;
    return lp;
}

json tool_call_json(const ReplyPart& p) {
    return {{"id", p.id},
            {"type", "function"},
            {"function", {{"name", p.name}, {"arguments", p.arguments}}}};
}

namespace {

// Takes the sample's text that is final and not yet taken (all of it once
// the sample finished) and splits it into reply parts — with the parser for
// chat with tools or thinking, else all content. The parts are added to the
// sample's reply and returned (a stream's next deltas). The one path from
// tokens to reply text, for streams and whole answers alike.
std::vector<ReplyPart> advance_reply(Job::Sample& s) {
    if (s.drained) return {};
    std::string text = s.finished ? s.text->finish() : s.text->take_ready();
    std::vector<ReplyPart> parts;
    if (s.parser) {
        parts = s.parser->feed(text);
        if (s.finished)
            for (auto& p : s.parser->finish()) parts.push_back(std::move(p));
    } else if (!text.empty()) {
        ReplyPart p;
        p.text = std::move(text);
        parts.push_back(std::move(p));
    }
    s.drained = s.finished;
    for (auto& p : parts) {
        if (p.kind == ReplyPart::Content) s.content += p.text;
        if (p.kind == ReplyPart::Reasoning) s.reasoning += p.text;
        if (p.kind == ReplyPart::ToolCall) {
            p.id = random_id("call_");
            s.tool_calls.push_back(tool_call_json(p));
        }
    }
    return parts;
}

const char* finish_reason_of(const Job::Sample& s) {
    if (!s.tool_calls.empty() && s.result.reason == runtime::FinishReason::Stop)
        return "tool_calls";
    return finish_reason_openai(s.result.reason);
}

const std::string& model_of(const Job& job, const std::string& default_model) {
    return job.req.model.empty() ? default_model : job.req.model;
}

// A stream chunk's envelope around its choices.
json chunk_of(const Job& job, const std::string& default_model, json choices) {
    return {{"id", job.oai_id},
            {"object", job.req.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", job.created},
            {"model", model_of(job, default_model)},
            {"choices", std::move(choices)}};
}

// A choice's message (chat) or text (completions) in a whole answer.
void put_reply(json& c, const Job::Sample& s, bool chat) {
    if (!chat) {
        c["text"] = s.content;
        return;
    }
    json msg = {{"role", "assistant"}};
    msg["content"] = s.content.empty() && !s.tool_calls.empty() ? json(nullptr) : json(s.content);
    if (!s.reasoning.empty()) msg["reasoning_content"] = s.reasoning;
    if (!s.tool_calls.empty()) msg["tool_calls"] = s.tool_calls;
    c["message"] = msg;
}

// The usage object: every prompt's counts (from its first sample) and
// every sample's generated tokens.
json usage_of(const Job& job, int64_t completion_tokens) {
    int64_t prompt_tokens = 0, cached_tokens = 0;
    for (size_t p = 0; p < job.req.prompts.size(); ++p) {
        prompt_tokens += job.prompt_result(p).prompt_tokens;
        cached_tokens += job.prompt_result(p).cached_tokens;
    }
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

// A stream's deltas for the reply parts just split from sample s.
std::vector<json> deltas_of(const std::vector<ReplyPart>& parts, const Job::Sample& s, bool chat) {
    std::vector<json> deltas;
    for (const auto& p : parts) {
        if (p.kind == ReplyPart::Content)
            deltas.push_back(chat ? json{{"content", p.text}} : json{{"text", p.text}});
        if (p.kind == ReplyPart::Reasoning) deltas.push_back({{"reasoning_content", p.text}});
        if (p.kind == ReplyPart::ToolCall) {
            json call = tool_call_json(p);
            call["index"] = s.tool_calls.size() - 1;
            deltas.push_back({{"tool_calls", json::array({call})}});
        }
    }
    // Logprobs of tokens whose text is held back still go out now.
    if (deltas.empty() && !s.pending_logprobs.empty())
        deltas.push_back(chat ? json{{"content", ""}} : json{{"text", ""}});
    return deltas;
}

// Sample i's chunks not yet sent: its new deltas, then its finish_reason
// once it finished (none for a sample cut short: the error event ends the
// stream).
void sample_chunks(Job& job, size_t i, const std::string& default_model, std::string& out) {
    const auto& r = job.req;
    auto& s = job.samples[i];
    if (s.finish_sent) return;
    auto chunk = [&](json choice) {
        json c = chunk_of(job, default_model, json::array({std::move(choice)}));
        if (r.include_usage) c["usage"] = nullptr;
        out += sse_event(c);
    };
    for (const auto& d : deltas_of(advance_reply(s), s, r.chat)) {
        json choice = {{"index", i}, {"finish_reason", nullptr}};
        json lp = nullptr;
        if (r.logprobs && !s.pending_logprobs.empty())
            lp = r.chat ? json{{"content", s.pending_logprobs}}
                        : completion_logprobs(s.pending_logprobs, false);
        s.pending_logprobs.clear();
        choice["logprobs"] = lp;
        if (r.chat)
            choice["delta"] = d;
        else
            choice["text"] = d["text"];
        chunk(choice);
    }
    if (!s.finished) return;
    s.finish_sent = true;
    const auto reason = s.result.reason;
    if (reason == runtime::FinishReason::Cancelled || reason == runtime::FinishReason::Error)
        return;
    json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", finish_reason_of(s)}};
    if (r.chat)
        choice["delta"] = json::object();
    else
        choice["text"] = "";
    chunk(choice);
}

}  // namespace

json final_body(Job& job, const std::string& default_model) {
    const auto& r = job.req;
    json choices = json::array();
    int64_t completion_tokens = 0;
    for (size_t i = 0; i < job.samples.size(); ++i) {
        auto& s = job.samples[i];
        advance_reply(s);
        completion_tokens += s.result.generated;
        json c = {{"index", i}, {"finish_reason", finish_reason_of(s)}};
        put_reply(c, s, r.chat);
        json lp = nullptr;
        if (r.logprobs)
            lp = r.chat ? json{{"content", s.logprobs}}
                        : completion_logprobs(s.logprobs.get<std::vector<json>>(), true);
        c["logprobs"] = lp;
        choices.push_back(c);
    }
    return json{
        {"id", job.oai_id},       {"object", r.chat ? "chat.completion" : "text_completion"},
        {"created", job.created}, {"model", model_of(job, default_model)},
        {"choices", choices},     {"usage", usage_of(job, completion_tokens)}};
}

std::string role_chunks(const Job& job, const std::string& default_model) {
    std::string out;
    for (size_t i = 0; i < job.samples.size(); ++i) {
        json c = chunk_of(job, default_model,
                          json::array({{{"index", i},
                                        {"delta", {{"role", "assistant"}, {"content", ""}}},
                                        {"logprobs", nullptr},
                                        {"finish_reason", nullptr}}}));
        if (job.req.include_usage) c["usage"] = nullptr;
        out += sse_event(c);
    }
    return out;
}

std::string stream_chunks(Job& job, bool final_pass, const std::string& default_model) {
    std::string out;
    for (size_t i = 0; i < job.samples.size(); ++i) sample_chunks(job, i, default_model, out);
    if (!final_pass) return out;
    if (job.failed()) {
        std::string why = "the reply was cut short: the server is shutting down";
        for (const auto& s : job.samples)
            if (s.result.reason == runtime::FinishReason::Error)
                why = "generation failed: " + s.result.error;
        return out + sse_event(error_body(500, why));
    }
    if (job.req.include_usage) {
        json body = final_body(job, default_model);
        json c = chunk_of(job, default_model, json::array());
        c["usage"] = body["usage"];
        out += sse_event(c);
    }
    return out + "data: [DONE]\n\n";
}

json model_object(const std::string& id, const model::Model& model, int64_t n_ctx) {
    return json{{"id", id},
                {"object", "model"},
                {"created", unix_time()},
                {"owned_by", "minfer"},
                {"meta",
                 {{"n_ctx_train", model.hp.n_ctx_train},
                  {"n_ctx", n_ctx},
                  {"n_vocab", model.hp.n_vocab},
                  {"arch", model.hp.arch_name}}}};
}

}  // namespace minfer::serve
