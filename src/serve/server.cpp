#include "serve/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "runtime/sample_text.h"
#include "serve/chat_page.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/reply_parser.h"
#include "structured/constraint.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace minfer::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Generated text may hold invalid UTF-8 only in logprob pieces (a token can
// end inside a character); replace rather than throw.
std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
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

// ---- noticing a client that hung up on a non-streaming request ----
// cpp-httplib 0.11 (Debian 12's) neither hands a handler its socket nor
// tells a handler that has not begun writing that the client left, so a
// non-streaming request whose client gave up would run to its end. Its
// connection is the one socket of this process with the request's peer
// address and port and local port; the handler's thread owns it (httplib
// closes it only after the handler returns), so the descriptor is stable.

bool endpoint_is(int fd, bool peer, const std::string& addr, int port) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    auto* sa = reinterpret_cast<sockaddr*>(&ss);
    if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
    char text[INET6_ADDRSTRLEN] = {};
    int p = -1;
    if (ss.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
        p = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
        inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
        p = ntohs(in6->sin6_port);
    } else {
        return false;
    }
    return p == port && (addr.empty() || addr == text);
}

// The connection's descriptor, or -1 when it cannot be found (no /proc).
int connection_socket(const httplib::Request& req) {
    DIR* dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int found = -1;
    while (const dirent* e = readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
        if (endpoint_is(static_cast<int>(fd), true, req.remote_addr, req.remote_port) &&
            endpoint_is(static_cast<int>(fd), false, {}, req.local_port)) {
            found = static_cast<int>(fd);
            break;
        }
    }
    closedir(dir);
    return found;
}

// True once the peer has closed or reset the connection (a FIN, an RST).
bool peer_hung_up(int fd) {
    pollfd p{fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = {}, const std::string& code = {}) {
    res.status = status;
    res.set_content(dump(error_body(status, message, param, code)), "application/json");
}

// Per worker thread: what the request log line says beyond method, path and
// status (generation requests fill it in), and when the request came in.
thread_local std::string t_log_detail;
thread_local Clock::time_point t_request_start;
// Set when the request reached routing: httplib answers a request whose
// line or headers do not parse (400) without it, and t_request_start then
// holds an earlier request's time.
thread_local bool t_routed = false;

const char* finish_reason_openai(runtime::FinishReason r) {
    switch (r) {
        case runtime::FinishReason::Length:
        case runtime::FinishReason::ContextFull:
            return "length";
        default:
            return "stop";
    }
}

// Bytes of a piece as a JSON list (OpenAI's logprobs "bytes").
json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

}  // namespace

// One generation request: the engine's callbacks (engine thread) fill it,
// the HTTP worker reads it. A completions request with a list of prompts is
// one engine request per prompt; its choices are prompt-major (prompt p's
// sample k is choice p * n + k, as OpenAI and llama-server order them).
struct Job {
    struct Sample {
        std::unique_ptr<runtime::SampleText> text;
        std::unique_ptr<ReplyParser> parser;  // chat with tools or thinking
        // The reply as split so far: the stream's deltas and the whole
        // answer are both made of these (advance()), so they are equal.
        std::string content, reasoning;
        json tool_calls = json::array();     // [{id, type, function}]
        bool drained = false;                // finished, and all its text split
        json logprobs = json::array();       // chat: content entries
        std::vector<json> pending_logprobs;  // not yet streamed
        bool finished = false;
        bool finish_sent = false;
        runtime::RequestResult result;
        Clock::time_point last_token;
        bool any_token = false;
        int64_t n_tokens = 0;  // seen so far (the result's count arrives last)
    };
    std::mutex mu;
    std::condition_variable cv;
    CompletionRequest req;
    std::vector<Sample> samples;
    int n_finished = 0;
    bool first_event = false;
    bool role_sent = false;               // chat streams: the assistant role chunk went out
    uint64_t events = 0;                  // callbacks so far (the stream wakes on a change)
    std::vector<runtime::RequestId> ids;  // one per prompt
    std::string oai_id;
    int64_t created = 0;
    Clock::time_point t_start;
    Clock::time_point t_first_token;  // the first token of any sample
    bool any_token = false;

    bool done() const { return n_finished == static_cast<int>(samples.size()); }
    // A sample cut short: cancelled (shutdown) or failed.
    bool failed() const {
        for (const auto& s : samples)
            if (s.finished && (s.result.reason == runtime::FinishReason::Cancelled ||
                               s.result.reason == runtime::FinishReason::Error))
                return true;
        return false;
    }
    // Prompt p's first sample: its result carries the prompt's counts.
    const runtime::RequestResult& prompt_result(size_t p) const {
        return samples[p * static_cast<size_t>(req.gen.n_samples)].result;
    }
};

namespace {

json tool_call_json(const ReplyPart& p) {
    return {{"id", p.id},
            {"type", "function"},
            {"function", {{"name", p.name}, {"arguments", p.arguments}}}};
}

// Takes the sample's text that is final and not yet taken (all of it once
// the sample finished) and splits it into reply parts — with the parser for
// chat with tools or thinking, else all content. The parts are added to the
// sample's reply and returned (a stream's next deltas). The one path from
// tokens to reply text, for streams and whole answers alike.
std::vector<ReplyPart> advance(Job::Sample& s) {
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

// Logprob entries (chat's shape) in the legacy completions shape.
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

const char* finish_reason_of(const Job::Sample& s) {
    if (!s.tool_calls.empty() && s.result.reason == runtime::FinishReason::Stop)
        return "tool_calls";
    return finish_reason_openai(s.result.reason);
}

}  // namespace

struct Server::Impl {
    ServerOptions opt;
    httplib::Server http;
    std::thread listen_thread;
    std::atomic<bool> listen_ended{false};  // listen_after_bind returned
    Metrics metrics;

    std::atomic<bool> ready{false}, stopping{false}, stop_requested{false}, down{false};
    const model::Model* model = nullptr;
    std::unique_ptr<tokenizer::Tokenizer> tok;
    ChatFlavor flavor;
    std::unique_ptr<runtime::Engine> engine;
    // Structured output: grammars compiled for the model's vocabulary, kept
    // by their text across requests (one schema sent again is not compiled
    // again); and the last grammars that failed to compile, with their
    // error, so that a client retrying one is answered from a lookup.
    std::unique_ptr<structured::ConstraintCache> constraints;
    std::mutex refused_mu;
    std::deque<std::pair<std::string, std::string>> refused;  // (grammar, error), newest first
    std::thread engine_thread;
    std::atomic<bool> engine_stop{false};
    int bound_port = 0;

    std::mutex jobs_mu;
    std::set<runtime::RequestId> live;  // submitted, not finished
    std::atomic<int> active{0};         // generation requests admitted, not answered

    explicit Impl(ServerOptions o) : opt(std::move(o)) {}

    int n_parallel() const { return engine ? engine->options().n_parallel : 1; }

    void log_line(const httplib::Request& req, const httplib::Response& res) {
        metrics.request_done(res.status);
        if (!opt.log_requests || !opt.log) return;
        if (!t_routed) {
            // Its method and path are whatever bytes came (TLS, garbage): not logged.
            std::fprintf(opt.log, "minfer: - - %d (request not parsed)\n", res.status);
        } else {
            const double ms = ms_between(t_request_start, Clock::now());
            std::fprintf(opt.log, "minfer: %s %s %d %.1f ms%s%s\n", req.method.c_str(),
                         req.path.c_str(), res.status, ms, t_log_detail.empty() ? "" : " ",
                         t_log_detail.c_str());
        }
        std::fflush(opt.log);
        t_log_detail.clear();
        t_routed = false;
    }

    bool authorized(const httplib::Request& req) const {
        if (opt.api_key.empty()) return true;
        std::string auth = req.get_header_value("Authorization");
        const std::string bearer = "Bearer ";
        if (auth.compare(0, bearer.size(), bearer) == 0 &&
            auth.substr(bearer.size()) == opt.api_key)
            return true;
        return req.get_header_value("x-api-key") == opt.api_key;
    }

    std::shared_ptr<const structured::Constraint> constraint_for(const CompletionRequest& r,
                                                                 std::string& log_detail);
    void install_routes();
    void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat);
    json final_body(Job& job);
    std::string stream_chunks(Job& job, bool final_pass);
};

// ---------------------------------------------------------------------------
// Structured output

// The request's grammar, compiled (or taken from the cache). A grammar that
// does not compile is a 400 naming the request field it came from.
std::shared_ptr<const structured::Constraint> Server::Impl::constraint_for(
    const CompletionRequest& r, std::string& log_detail) {
    // Failures are kept only for texts this short: the list's memory stays
    // small, and longer texts are the ones worth a client's fixing anyway.
    constexpr size_t kRefusedTextMax = 64 * 1024, kRefusedKept = 32;
    auto refuse = [&](const std::string& error) -> ApiError {
        metrics.constraint_refused();
        return ApiError(400, "'" + r.grammar_param + "' cannot be enforced: " + error,
                        r.grammar_param);
    };
    {
        std::lock_guard<std::mutex> lk(refused_mu);
        for (const auto& [text, error] : refused)
            if (text == r.grammar) throw refuse(error);
    }
    bool hit = false;
    std::shared_ptr<const structured::Constraint> c;
    try {
        c = constraints->get(r.grammar, &hit);
    } catch (const Error& e) {
        if (r.grammar.size() <= kRefusedTextMax) {
            std::lock_guard<std::mutex> lk(refused_mu);
            refused.emplace_front(r.grammar, e.what());
            if (refused.size() > kRefusedKept) refused.pop_back();
        }
        throw refuse(e.what());
    }
    metrics.constrained_request(r.grammar_kind, hit, c->compile_ms);
    char buf[96];
    if (hit)
        std::snprintf(buf, sizeof buf, "constraint=%s (cached)", r.grammar_kind.c_str());
    else
        std::snprintf(buf, sizeof buf, "constraint=%s (compiled %.1f ms)", r.grammar_kind.c_str(),
                      c->compile_ms);
    log_detail = buf;
    return c;
}

// ---------------------------------------------------------------------------
// Response bodies

json Server::Impl::final_body(Job& job) {
    const auto& r = job.req;
    json choices = json::array();
    int64_t completion_tokens = 0;
    for (size_t i = 0; i < job.samples.size(); ++i) {
        auto& s = job.samples[i];
        advance(s);
        completion_tokens += s.result.generated;
        json c = {{"index", i}, {"finish_reason", finish_reason_of(s)}};
        if (r.chat) {
            json msg = {{"role", "assistant"}};
            msg["content"] =
                s.content.empty() && !s.tool_calls.empty() ? json(nullptr) : json(s.content);
            if (!s.reasoning.empty()) msg["reasoning_content"] = s.reasoning;
            if (!s.tool_calls.empty()) msg["tool_calls"] = s.tool_calls;
            c["message"] = msg;
        } else {
            c["text"] = s.content;
        }
        json lp = nullptr;
        if (r.logprobs)
            lp = r.chat ? json{{"content", s.logprobs}}
                        : completion_logprobs(s.logprobs.get<std::vector<json>>(), true);
        c["logprobs"] = lp;
        choices.push_back(c);
    }
    int64_t prompt_tokens = 0, cached_tokens = 0;
    for (size_t p = 0; p < r.prompts.size(); ++p) {
        prompt_tokens += job.prompt_result(p).prompt_tokens;
        cached_tokens += job.prompt_result(p).cached_tokens;
    }
    json usage = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens},
                  {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
    return json{
        {"id", job.oai_id},       {"object", r.chat ? "chat.completion" : "text_completion"},
        {"created", job.created}, {"model", r.model.empty() ? opt.model_name : r.model},
        {"choices", choices},     {"usage", usage}};
}

// The SSE events for whatever the job holds that is not yet sent (caller
// holds job.mu). With final_pass, also the usage chunk and [DONE] — or, for
// a reply cut short (shutdown, a failure), an error event and no [DONE], as
// OpenAI ends a failed stream: a client must not take it for a whole answer.
std::string Server::Impl::stream_chunks(Job& job, bool final_pass) {
    const auto& r = job.req;
    std::string out;
    auto chunk = [&](json choice) {
        json c = {{"id", job.oai_id},
                  {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", job.created},
                  {"model", r.model.empty() ? opt.model_name : r.model},
                  {"choices", json::array({choice})}};
        if (r.include_usage) c["usage"] = nullptr;
        out += "data: " + dump(c) + "\n\n";
    };
    for (size_t i = 0; i < job.samples.size(); ++i) {
        auto& s = job.samples[i];
        if (s.finish_sent) continue;
        std::vector<json> deltas;
        for (const auto& p : advance(s)) {
            if (p.kind == ReplyPart::Content)
                deltas.push_back(r.chat ? json{{"content", p.text}} : json{{"text", p.text}});
            if (p.kind == ReplyPart::Reasoning) deltas.push_back({{"reasoning_content", p.text}});
            if (p.kind == ReplyPart::ToolCall) {
                json call = tool_call_json(p);
                call["index"] = s.tool_calls.size() - 1;
                deltas.push_back({{"tool_calls", json::array({call})}});
            }
        }
        // Logprobs of tokens whose text is held back still go out now.
        if (deltas.empty() && !s.pending_logprobs.empty())
            deltas.push_back(r.chat ? json{{"content", ""}} : json{{"text", ""}});
        for (const auto& d : deltas) {
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
        if (s.finished) {
            s.finish_sent = true;
            const auto reason = s.result.reason;
            if (reason == runtime::FinishReason::Cancelled ||
                reason == runtime::FinishReason::Error)
                continue;  // no finish_reason: the error event ends the stream
            json choice = {
                {"index", i}, {"logprobs", nullptr}, {"finish_reason", finish_reason_of(s)}};
            if (r.chat)
                choice["delta"] = json::object();
            else
                choice["text"] = "";
            chunk(choice);
        }
    }
    if (final_pass) {
        if (job.failed()) {
            std::string why = "the reply was cut short: the server is shutting down";
            for (const auto& s : job.samples)
                if (s.result.reason == runtime::FinishReason::Error)
                    why = "generation failed: " + s.result.error;
            out += "data: " + dump(error_body(500, why)) + "\n\n";
            return out;
        }
        if (r.include_usage) {
            json body = final_body(job);
            json c = {{"id", job.oai_id},
                      {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", job.created},
                      {"model", body["model"]},
                      {"choices", json::array()},
                      {"usage", body["usage"]}};
            out += "data: " + dump(c) + "\n\n";
        }
        out += "data: [DONE]\n\n";
    }
    return out;
}

// ---------------------------------------------------------------------------
// Generation

void Server::Impl::handle_completion(const httplib::Request& req, httplib::Response& res,
                                     bool chat) {
    if (stopping) {
        res.set_header("Connection", "close");  // a proxy's kept-alive connection ends here
        return send_error(res, 503, "the server is shutting down");
    }
    if (!ready) {
        res.set_header("Retry-After", "5");
        return send_error(res, 503, "the model is still loading");
    }
    const auto body = parse_json_object(req.body);
    auto job = std::make_shared<Job>();
    job->req =
        parse_completion_request(body, chat, *tok, engine->options().n_ctx, n_parallel(), flavor);
    std::string constraint_detail;
    if (!job->req.grammar.empty())
        job->req.gen.constraint = constraint_for(job->req, constraint_detail);
    job->t_start = Clock::now();
    job->created = unix_time();
    job->oai_id = random_id(chat ? "chatcmpl-" : "cmpl-");
    const size_t n_choices = job->req.prompts.size() * static_cast<size_t>(job->req.gen.n_samples);
    for (size_t i = 0; i < n_choices; ++i) {
        Job::Sample s;
        s.text = std::make_unique<runtime::SampleText>(*tok, job->req.stops);
        if (chat && (job->req.tools || job->req.think))
            s.parser = std::make_unique<ReplyParser>(job->req.think, job->req.tools);
        job->samples.push_back(std::move(s));
    }

    // Admission: at most -np running plus queue_limit waiting.
    const int limit = n_parallel() + opt.queue_limit;
    if (active.fetch_add(1) >= limit) {
        active.fetch_sub(1);
        res.set_header("Retry-After", "1");
        return send_error(res, 503,
                          "the server is busy: " + std::to_string(limit) +
                              " requests are running or waiting; retry later");
    }
    // The admission slot, held until the answer is written (the stream's
    // provider keeps it).
    struct Release {
        std::atomic<int>* a;
        explicit Release(std::atomic<int>* a) : a(a) {}
        Release(const Release&) = delete;
        Release& operator=(const Release&) = delete;
        ~Release() { a->fetch_sub(1); }
    };
    auto slot = std::make_shared<Release>(&active);

    const bool want_lp = job->req.logprobs;
    // Prompt p's callbacks: its samples are the job's choices from `first` on.
    auto callbacks = [this, job, want_lp](size_t first) {
        runtime::RequestCallbacks cb;
        cb.on_token = [this, job, want_lp, first](const runtime::TokenEvent& ev) {
            std::lock_guard<std::mutex> lk(job->mu);
            auto& s = job->samples[first + static_cast<size_t>(ev.sample)];
            const auto now = Clock::now();
            if (s.any_token) metrics.inter_token(ms_between(s.last_token, now) / 1e3);
            if (!job->any_token) job->t_first_token = now;
            job->any_token = s.any_token = true;
            s.last_token = now;
            ++s.n_tokens;
            const bool go_on = s.text->push(ev.token);
            if (want_lp) {
                const std::string piece = tok->token_to_piece(ev.token);
                json tops = json::array();
                for (const auto& [t, lp] : ev.top) {
                    const std::string p = tok->token_to_piece(t);
                    tops.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes_of(p)}});
                }
                json e = {{"token", piece},
                          {"logprob", ev.logprob},
                          {"bytes", bytes_of(piece)},
                          {"top_logprobs", tops}};
                s.logprobs.push_back(e);
                s.pending_logprobs.push_back(e);
            }
            job->first_event = true;
            ++job->events;
            job->cv.notify_all();
            return go_on;
        };
        cb.on_finish = [this, job, first](const runtime::RequestResult& r) {
            {
                std::lock_guard<std::mutex> lk(job->mu);
                auto& s = job->samples[first + static_cast<size_t>(r.sample)];
                s.result = r;
                s.finished = true;
                ++job->n_finished;
                job->first_event = true;
                ++job->events;
                if (first == 0 && r.sample == 0 && r.reason != runtime::FinishReason::Cancelled &&
                    r.reason != runtime::FinishReason::Error)
                    metrics.first_token(r.t_first_token_ms / 1e3);
                metrics.mask_times(r.mask_us);
                if (job->done()) {
                    std::lock_guard<std::mutex> lk2(jobs_mu);
                    for (auto id : job->ids) live.erase(id);
                }
            }
            job->cv.notify_all();
        };
        return cb;
    };
    // Every prompt is submitted before any is waited for: the engine runs
    // them as sequences of one batch.
    std::vector<runtime::RequestId> ids;
    try {
        // Not under job->mu: the engine may call back on its thread meanwhile.
        for (size_t p = 0; p < job->req.prompts.size(); ++p) {
            runtime::GenParams gen = job->req.gen;
            gen.prompt = job->req.prompts[p];
            ids.push_back(engine->submit(
                std::move(gen), callbacks(p * static_cast<size_t>(job->req.gen.n_samples))));
        }
    } catch (const Error& e) {
        for (auto id : ids) engine->cancel(id);
        throw ApiError(400, e.what());
    }
    {
        // Registered for shutdown() unless it already finished.
        std::lock_guard<std::mutex> lk(job->mu);
        job->ids = ids;
        std::lock_guard<std::mutex> lk2(jobs_mu);
        if (!job->done()) live.insert(ids.begin(), ids.end());
    }
    auto cancel_job = [this, ids] {
        for (auto id : ids) engine->cancel(id);
    };

    auto log_detail = [job, constraint_detail]() {
        // job->mu held by the caller
        int64_t gen = 0, n_prompt = 0, cached = 0;
        bool cancelled = false;
        for (const auto& s : job->samples) {
            gen += std::max(s.result.generated, s.n_tokens);
            cancelled = cancelled || s.result.reason == runtime::FinishReason::Cancelled;
        }
        for (size_t p = 0; p < job->req.prompts.size(); ++p) {
            n_prompt += static_cast<int64_t>(job->req.prompts[p].size());
            cached += job->prompt_result(p).cached_tokens;
        }
        // Time to first token as this server saw it: a request that ended
        // early (client gone, cancelled) has no engine result that says.
        char ttft[32] = "-";
        if (job->any_token)
            std::snprintf(ttft, sizeof ttft, "%.1f ms",
                          ms_between(job->t_start, job->t_first_token));
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "prompt=%lld cached=%lld generated=%lld ttft=%s total=%.1f ms%s",
                      static_cast<long long>(n_prompt), static_cast<long long>(cached),
                      static_cast<long long>(gen), ttft, ms_between(job->t_start, Clock::now()),
                      cancelled ? " cancelled" : "");
        if (constraint_detail.empty()) return std::string(buf);
        // The mask time per token of every sample (the engine's, for this request).
        std::vector<float> mask_us;
        for (const auto& s : job->samples)
            mask_us.insert(mask_us.end(), s.result.mask_us.begin(), s.result.mask_us.end());
        char mask[96];
        std::snprintf(mask, sizeof mask, " mask p50=%.1f us p99=%.1f us", quantile(mask_us, 0.5),
                      quantile(mask_us, 0.99));
        return std::string(buf) + " " + constraint_detail + mask;
    };

    if (!job->req.stream) {
        // Watch the connection while the answer is computed: a client that
        // hangs up cancels the request and frees its pages at once.
        const int conn = connection_socket(req);
        bool gone = false;
        std::unique_lock<std::mutex> lk(job->mu);
        while (!job->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return job->done(); })) {
            if (gone || conn < 0 || !peer_hung_up(conn)) continue;
            gone = true;
            lk.unlock();  // the engine may finish the job on this thread
            cancel_job();
            lk.lock();
        }
        t_log_detail = log_detail();
        if (gone) {
            t_log_detail += " client gone";
            res.status = 499;  // nginx's "client closed request": nobody reads it
            return;
        }
        for (const auto& s : job->samples)
            if (s.result.reason == runtime::FinishReason::Error)
                return send_error(res, 500, "generation failed: " + s.result.error);
            else if (s.result.reason == runtime::FinishReason::Cancelled)
                return send_error(res, 503, "the request was cancelled (server shutting down)");
        res.set_content(dump(final_body(*job)), "application/json");
        return;
    }

    // Streaming: the first event decides between an error status and a 200 stream.
    {
        std::unique_lock<std::mutex> lk(job->mu);
        job->cv.wait(lk, [&] { return job->first_event; });
        const auto& s0 = job->samples[0];
        if (s0.finished && s0.result.reason == runtime::FinishReason::Error) {
            job->cv.wait(lk, [&] { return job->done(); });
            t_log_detail = log_detail();
            return send_error(res, 500, "generation failed: " + s0.result.error);
        }
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // nginx: pass events through at once
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, slot, log_detail, cancel_job](size_t, httplib::DataSink& sink) {
            std::unique_lock<std::mutex> lk(job->mu);
            if (job->req.chat && !job->role_sent) {
                // The role comes first, once per choice (as OpenAI streams it).
                std::string first;
                for (size_t i = 0; i < job->samples.size(); ++i) {
                    json c = {{"id", job->oai_id},
                              {"object", "chat.completion.chunk"},
                              {"created", job->created},
                              {"model", job->req.model.empty() ? opt.model_name : job->req.model},
                              {"choices",
                               json::array({{{"index", i},
                                             {"delta", {{"role", "assistant"}, {"content", ""}}},
                                             {"logprobs", nullptr},
                                             {"finish_reason", nullptr}}})}};
                    if (job->req.include_usage) c["usage"] = nullptr;
                    first += "data: " + dump(c) + "\n\n";
                }
                job->role_sent = true;
                lk.unlock();
                if (!sink.write(first.data(), first.size())) {
                    cancel_job();
                    return false;
                }
                lk.lock();
            }
            uint64_t seen = 0;
            while (true) {
                // Wake on new tokens or the end; the timeout only bounds the wait.
                job->cv.wait_for(lk, std::chrono::milliseconds(500),
                                 [&] { return job->events != seen || job->done(); });
                seen = job->events;
                const bool all_done = job->done();
                std::string out = stream_chunks(*job, all_done);
                if (!out.empty()) {
                    lk.unlock();
                    const bool ok = sink.write(out.data(), out.size());
                    lk.lock();
                    if (!ok) {
                        cancel_job();
                        t_log_detail = log_detail() + " client gone";
                        return false;
                    }
                }
                if (all_done) {
                    t_log_detail = log_detail();
                    lk.unlock();
                    sink.done();
                    return true;
                }
            }
        },
        [cancel_job](bool success) {
            if (!success) cancel_job();
        });
}

// ---------------------------------------------------------------------------
// Routes

void Server::Impl::install_routes() {
    http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        t_request_start = Clock::now();
        t_routed = true;
        t_log_detail.clear();
        if (req.method == "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;
        const bool open = req.path == "/" || req.path == "/health" || req.path == "/metrics" ||
                          req.path == "/favicon.ico";
        if (!open && !authorized(req)) {
            send_error(res, 401, "a valid API key is required (Authorization: Bearer KEY)", {},
                       "invalid_api_key");
            return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 413)
            send_error(
                res, 413,
                "the request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes");
        else if (res.status == 404)
            send_error(res, 404, "no route " + req.method + " " + req.path);
        else
            send_error(res, res.status, "HTTP error " + std::to_string(res.status));
        return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            try {
                std::rethrow_exception(ep);
            } catch (const ApiError& e) {
                send_error(res, e.status, e.what(), e.param, e.code);
            } catch (const std::exception& e) {
                send_error(res, 500, std::string("internal error: ") + e.what());
            } catch (...) {
                send_error(res, 500, "internal error");
            }
        });
    http.set_logger(
        [this](const httplib::Request& req, const httplib::Response& res) { log_line(req, res); });

    http.Options(".*", [](const httplib::Request&, httplib::Response& res) {
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key");
        res.set_header("Access-Control-Max-Age", "86400");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        if (!ready) {
            res.status = 503;
            res.set_header("Retry-After", "1");
            res.set_content(
                dump(json{{"status", "loading"},
                          {"error", error_body(503, "the model is still loading")["error"]}}),
                "application/json");
            return;
        }
        res.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        runtime::EngineStats s;
        if (ready) s = engine->stats();  // ready is set after the engine exists
        res.set_content(metrics.render(s, ready), "text/plain; version=0.0.4");
    });
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(chat_page_html(), "text/html; charset=utf-8");
    });
    // OpenAI's model object: what /v1/models lists and /v1/models/{id} retrieves.
    auto model_object = [this] {
        return json{{"id", opt.model_name},
                    {"object", "model"},
                    {"created", unix_time()},
                    {"owned_by", "minfer"},
                    {"meta",
                     {{"n_ctx_train", model->hp.n_ctx_train},
                      {"n_ctx", engine->options().n_ctx},
                      {"n_vocab", model->hp.n_vocab},
                      {"arch", model->hp.arch_name}}}};
    };
    http.Get("/v1/models", [this, model_object](const httplib::Request&, httplib::Response& res) {
        if (!ready) return send_error(res, 503, "the model is still loading");
        res.set_content(dump(json{{"object", "list"}, {"data", json::array({model_object()})}}),
                        "application/json");
    });
    http.Get(R"(/v1/models/(.+))",
             [this, model_object](const httplib::Request& req, httplib::Response& res) {
                 if (!ready) return send_error(res, 503, "the model is still loading");
                 const std::string id = req.matches[1];
                 if (id != opt.model_name)
                     return send_error(res, 404,
                                       "the model '" + id + "' does not exist (this server has '" +
                                           opt.model_name + "')",
                                       "model", "model_not_found");
                 res.set_content(dump(model_object()), "application/json");
             });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
        handle_completion(req, res, true);
    });
    http.Post("/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
        handle_completion(req, res, true);
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
        handle_completion(req, res, false);
    });
    http.Post("/completions", [this](const httplib::Request& req, httplib::Response& res) {
        handle_completion(req, res, false);
    });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
        if (!ready) return send_error(res, 503, "the model is still loading");
        const auto b = parse_json_object(req.body);
        if (!b.contains("content") || !b["content"].is_string())
            throw ApiError(400, "'content' must be a string", "content");
        bool add_special = false, with_pieces = false;
        if (b.contains("add_special")) {
            if (!b["add_special"].is_boolean())
                throw ApiError(400, "'add_special' must be true or false", "add_special");
            add_special = b["add_special"].get<bool>();
        }
        if (b.contains("with_pieces")) {
            if (!b["with_pieces"].is_boolean())
                throw ApiError(400, "'with_pieces' must be true or false", "with_pieces");
            with_pieces = b["with_pieces"].get<bool>();
        }
        const auto ids = tok->encode(b["content"].get<std::string>(), true, add_special);
        json tokens = json::array();
        for (int32_t id : ids) {
            if (with_pieces)
                tokens.push_back({{"id", id}, {"piece", tok->token_to_piece(id, true)}});
            else
                tokens.push_back(id);
        }
        res.set_content(dump(json{{"tokens", tokens}}), "application/json");
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
        if (!ready) return send_error(res, 503, "the model is still loading");
        const auto b = parse_json_object(req.body);
        if (!b.contains("tokens") || !b["tokens"].is_array())
            throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
        std::vector<int32_t> ids;
        for (const auto& t : b["tokens"]) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
                t.get<int64_t>() >= tok->n_vocab())
                throw ApiError(400,
                               "'tokens' must hold token ids in [0, " +
                                   std::to_string(tok->n_vocab()) + "), got " + t.dump(),
                               "tokens");
            ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
        res.set_content(dump(json{{"content", tok->decode(ids, true)}}), "application/json");
    });
}

// ---------------------------------------------------------------------------
// Lifecycle

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
    auto& I = *impl_;
    I.install_routes();
    I.http.set_payload_max_length(I.opt.max_body_bytes);
    I.http.set_keep_alive_timeout(2);  // idle keep-alive connections hold a worker thread
    I.http.set_read_timeout(10);
    I.http.set_write_timeout(10);
    I.http.set_socket_options([](socket_t sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
}

Server::~Server() {
    shutdown();
}

int Server::bind() {
    auto& I = *impl_;
    // Every generation request holds a worker while it waits or streams:
    // -np running + the queue, plus spare workers for /health, /metrics,
    // queue-full answers and idle keep-alive connections.
    const int threads =
        I.opt.http_threads > 0 ? I.opt.http_threads : I.opt.n_parallel + I.opt.queue_limit + 16;
    I.http.new_task_queue = [threads] {
        return new httplib::ThreadPool(static_cast<size_t>(threads));
    };
    int port = I.opt.port;
    if (port == 0) {
        port = I.http.bind_to_any_port(I.opt.host);
        if (port < 0) throw Error("cannot bind " + I.opt.host + " on any port");
    } else if (!I.http.bind_to_port(I.opt.host, port)) {
        throw Error("cannot listen on " + I.opt.host + ":" + std::to_string(port) +
                    " (address in use, or not an address of this machine)");
    }
    I.bound_port = port;
    return port;
}

void Server::start() {
    auto& I = *impl_;
    I.listen_thread = std::thread([&I] {
        I.http.listen_after_bind();
        I.listen_ended = true;
    });
    // Until its loop runs, http.stop() does nothing (it stops a running
    // loop): a shutdown right after start — a model that fails to load —
    // would then join a listener that never ends, and the process hung.
    while (!I.http.is_running() && !I.listen_ended)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void Server::attach(const model::Model& model, runtime::EngineOptions engine_options) {
    auto& I = *impl_;
    I.model = &model;
    I.tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_gguf(model.file));
    const auto jinja = model.file.get_string("tokenizer.chat_template");
    I.flavor =
        chat_flavor(jinja ? std::string(*jinja) : std::string(),
                    model.hp.arch == model::Arch::Qwen3 || model.hp.arch == model::Arch::Qwen3Moe);
    I.engine = std::make_unique<runtime::Engine>(model, engine_options);
    I.constraints = std::make_unique<structured::ConstraintCache>(
        std::make_shared<const structured::TokenVocab>(
            structured::TokenVocab::from_tokenizer(*I.tok)),
        structured::ConstraintCache::kDefaultCapacity, structured::Warm::InBackground);
    I.engine_thread = std::thread([&I] {
        while (!I.engine_stop) {
            try {
                if (!I.engine->step()) I.engine->wait_for_work(50);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "minfer: engine step failed: %s\n", e.what());
            }
        }
    });
    I.ready = true;
}

void Server::shutdown() {
    auto& I = *impl_;
    if (I.down.exchange(true)) return;
    I.stopping = true;
    I.http.stop();  // no new connections
    // Running requests may finish within the grace period; then the rest
    // are cancelled (their streams end, their pages are freed).
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(I.opt.grace_seconds * 1e3));
    while (I.active.load() > 0 && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (I.engine) {
        std::vector<runtime::RequestId> ids;
        {
            std::lock_guard<std::mutex> lk(I.jobs_mu);
            ids.assign(I.live.begin(), I.live.end());
        }
        for (auto id : ids) I.engine->cancel(id);
    }
    if (I.listen_thread.joinable()) I.listen_thread.join();  // joins the workers too
    I.engine_stop = true;
    if (I.engine_thread.joinable()) I.engine_thread.join();
}

void Server::wait_for_stop_request() {
    while (!impl_->stop_requested.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

void Server::request_stop() {
    impl_->stop_requested.store(true);
}

int Server::port() const {
    return impl_->bound_port;
}

runtime::Engine* Server::engine() {
    return impl_->engine.get();
}

}  // namespace minfer::serve
