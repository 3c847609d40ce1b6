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
#include <cstdlib>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "runtime/sample_text.h"
#include "serve/chat_page.h"
#include "serve/job_impl.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/reply_parser.h"
#include "serve/responses.h"
#include "structured/constraint.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/quantile.h"

namespace minfer::serve {

using nlohmann::json;
using HandlerResponse = httplib::Server::HandlerResponse;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
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
    res.set_content(dump_json(error_body(status, message, param, code)), "application/json");
}

// Per worker thread: what the request log line says beyond method, path and
// status (generation requests fill it in), and when the request came in.
thread_local std::string t_log_detail;
thread_local Clock::time_point t_request_start;
// Set when the request reached routing: httplib answers a request whose
// line or headers do not parse (400) without it, and t_request_start then
// holds an earlier request's time.
thread_local bool t_routed = false;

// What a generation request's log line says beyond method, path and status
// (caller holds job.mu): token counts, time to first token as this server
// saw it (a request that ended early — client gone, cancelled — has no
// engine result that says), and for a constrained request its constraint
// and mask times.
std::string request_log_detail(const Job& job, const std::string& constraint_detail) {
    int64_t gen = 0, n_prompt = 0, cached = 0;
    bool cancelled = false;
    for (const auto& s : job.samples) {
        gen += std::max(s.result.generated, s.n_tokens);
        cancelled = cancelled || s.result.reason == runtime::FinishReason::Cancelled;
    }
    for (size_t p = 0; p < job.req.prompts.size(); ++p) {
        n_prompt += static_cast<int64_t>(job.req.prompts[p].size());
        cached += job.prompt_result(p).cached_tokens;
    }
    char ttft[32] = "-";
    if (job.any_token)
        std::snprintf(ttft, sizeof ttft, "%.1f ms", ms_between(job.t_start, job.t_first_token));
    char buf[256];
    std::snprintf(buf, sizeof buf, "prompt=%lld cached=%lld generated=%lld ttft=%s total=%.1f ms%s",
                  static_cast<long long>(n_prompt), static_cast<long long>(cached),
                  static_cast<long long>(gen), ttft, ms_between(job.t_start, Clock::now()),
                  cancelled ? " cancelled" : "");
    if (constraint_detail.empty()) return std::string(buf);
    // The mask time per token of every sample (the engine's, for this request).
    std::vector<float> mask_us;
    for (const auto& s : job.samples)
        mask_us.insert(mask_us.end(), s.result.mask_us.begin(), s.result.mask_us.end());
    char mask[96];
    std::snprintf(mask, sizeof mask, " mask p50=%.1f us p99=%.1f us", quantile(mask_us, 0.5),
                  quantile(mask_us, 0.99));
    return std::string(buf) + " " + constraint_detail + mask;
}

// A generation request's admission slot (at most -np running plus
// queue_limit waiting), held until its answer is written: a stream's
// provider keeps it.
struct AdmissionSlot {
    std::atomic<int>* active;
    explicit AdmissionSlot(std::atomic<int>* active) : active(active) {}
    AdmissionSlot(const AdmissionSlot&) = delete;
    AdmissionSlot& operator=(const AdmissionSlot&) = delete;
    ~AdmissionSlot() { active->fetch_sub(1); }
};

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

    // Routes
    void install_routes();
    HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
    HandlerResponse on_http_error(const httplib::Request& req, httplib::Response& res);
    void install_info_routes();
    void handle_health(httplib::Response& res);
    void handle_model(const httplib::Request& req, httplib::Response& res);
    void handle_tokenize(const httplib::Request& req, httplib::Response& res);
    void handle_detokenize(const httplib::Request& req, httplib::Response& res);

    // Generation
    void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat);
    std::shared_ptr<Job> make_job(const httplib::Request& req, bool chat,
                                  std::string& constraint_detail);
    std::shared_ptr<AdmissionSlot> admit(httplib::Response& res);
    std::vector<runtime::RequestId> submit_job(const std::shared_ptr<Job>& job);
    runtime::RequestCallbacks callbacks_for(const std::shared_ptr<Job>& job, size_t first);
    bool on_token(Job& job, size_t first, const runtime::TokenEvent& ev);
    void on_finish(Job& job, size_t first, const runtime::RequestResult& r);
    void cancel(const std::vector<runtime::RequestId>& ids);
    void answer_whole(const httplib::Request& req, httplib::Response& res, Job& job,
                      const std::vector<runtime::RequestId>& ids,
                      const std::string& constraint_detail);
    void answer_stream(httplib::Response& res, const std::shared_ptr<Job>& job,
                       std::shared_ptr<AdmissionSlot> slot, std::vector<runtime::RequestId> ids,
                       std::string constraint_detail);
    bool write_stream(Job& job, httplib::DataSink& sink, const std::vector<runtime::RequestId>& ids,
                      const std::string& constraint_detail);
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
    std::string constraint_detail;
    auto job = make_job(req, chat, constraint_detail);
    auto slot = admit(res);
    if (!slot) return;
    std::vector<runtime::RequestId> ids = submit_job(job);
    if (!job->req.stream) return answer_whole(req, res, *job, ids, constraint_detail);
    answer_stream(res, job, std::move(slot), std::move(ids), std::move(constraint_detail));
}

// The request parsed, its constraint compiled, one reply state per choice.
std::shared_ptr<Job> Server::Impl::make_job(const httplib::Request& req, bool chat,
                                            std::string& constraint_detail) {
    const auto body = parse_json_object(req.body);
    auto job = std::make_shared<Job>();
    job->req =
        parse_completion_request(body, chat, *tok, engine->options().n_ctx, n_parallel(), flavor);
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
    return job;
}

// Admission: at most -np running plus queue_limit waiting; beyond, a 503
// is answered and null returned.
std::shared_ptr<AdmissionSlot> Server::Impl::admit(httplib::Response& res) {
    const int limit = n_parallel() + opt.queue_limit;
    if (active.fetch_add(1) >= limit) {
        active.fetch_sub(1);
        res.set_header("Retry-After", "1");
        send_error(res, 503,
                   "the server is busy: " + std::to_string(limit) +
                       " requests are running or waiting; retry later");
        return nullptr;
    }
    return std::make_shared<AdmissionSlot>(&active);
}

// Every prompt is submitted before any is waited for: the engine runs them
// as sequences of one batch. Returns the engine's ids, one per prompt.
std::vector<runtime::RequestId> Server::Impl::submit_job(const std::shared_ptr<Job>& job) {
    std::vector<runtime::RequestId> ids;
    try {
        // Not under job->mu: the engine may call back on its thread meanwhile.
        for (size_t p = 0; p < job->req.prompts.size(); ++p) {
            runtime::GenParams gen = job->req.gen;
            gen.prompt = job->req.prompts[p];
            ids.push_back(engine->submit(
                std::move(gen),
                callbacks_for(job, p * static_cast<size_t>(job->req.gen.n_samples))));
        }
    } catch (const Error& e) {
        for (auto id : ids) engine->cancel(id);
        throw ApiError(400, e.what());
    }
    // Registered for shutdown() unless it already finished.
    std::lock_guard<std::mutex> lk(job->mu);
    job->ids = ids;
    std::lock_guard<std::mutex> lk2(jobs_mu);
    if (!job->done()) live.insert(ids.begin(), ids.end());
    return ids;
}

// Prompt p's callbacks: its samples are the job's choices from `first` on.
runtime::RequestCallbacks Server::Impl::callbacks_for(const std::shared_ptr<Job>& job,
                                                      size_t first) {
    runtime::RequestCallbacks cb;
    cb.on_token = [this, job, first](const runtime::TokenEvent& ev) {
        return on_token(*job, first, ev);
    };
    cb.on_finish = [this, job, first](const runtime::RequestResult& r) {
        on_finish(*job, first, r);
    };
    return cb;
}

// Engine thread: one token of a sample. Returns false to stop it (a stop string).
bool Server::Impl::on_token(Job& job, size_t first, const runtime::TokenEvent& ev) {
    std::lock_guard<std::mutex> lk(job.mu);
    auto& s = job.samples[first + static_cast<size_t>(ev.sample)];
    const auto now = Clock::now();
    if (s.any_token) metrics.inter_token(ms_between(s.last_token, now) / 1e3);
    if (!job.any_token) job.t_first_token = now;
    job.any_token = s.any_token = true;
    s.last_token = now;
    ++s.n_tokens;
    const bool go_on = s.text->push(ev.token);
    if (job.req.logprobs) {
        json e = logprob_entry(*tok, ev);
        s.logprobs.push_back(e);
        s.pending_logprobs.push_back(e);
    }
    job.first_event = true;
    ++job.events;
    job.cv.notify_all();
    return go_on;
}

// Engine thread: a sample's end.
void Server::Impl::on_finish(Job& job, size_t first, const runtime::RequestResult& r) {
    {
        std::lock_guard<std::mutex> lk(job.mu);
        auto& s = job.samples[first + static_cast<size_t>(r.sample)];
        s.result = r;
        s.finished = true;
        ++job.n_finished;
        job.first_event = true;
        ++job.events;
        if (first == 0 && r.sample == 0 && r.reason != runtime::FinishReason::Cancelled &&
            r.reason != runtime::FinishReason::Error)
            metrics.first_token(r.t_first_token_ms / 1e3);
        metrics.mask_times(r.mask_us);
        if (job.done()) {
            std::lock_guard<std::mutex> lk2(jobs_mu);
            for (auto id : job.ids) live.erase(id);
        }
    }
    job.cv.notify_all();
}

void Server::Impl::cancel(const std::vector<runtime::RequestId>& ids) {
    for (auto id : ids) engine->cancel(id);
}

// A whole answer. The connection is watched while it is computed: a client
// that hangs up cancels the request and frees its pages at once.
void Server::Impl::answer_whole(const httplib::Request& req, httplib::Response& res, Job& job,
                                const std::vector<runtime::RequestId>& ids,
                                const std::string& constraint_detail) {
    const int conn = connection_socket(req);
    bool gone = false;
    std::unique_lock<std::mutex> lk(job.mu);
    while (!job.cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return job.done(); })) {
        if (gone || conn < 0 || !peer_hung_up(conn)) continue;
        gone = true;
        lk.unlock();  // the engine may finish the job on this thread
        cancel(ids);
        lk.lock();
    }
    t_log_detail = request_log_detail(job, constraint_detail);
    if (gone) {
        t_log_detail += " client gone";
        res.status = 499;  // nginx's "client closed request": nobody reads it
        return;
    }
    for (const auto& s : job.samples)
        if (s.result.reason == runtime::FinishReason::Error)
            return send_error(res, 500, "generation failed: " + s.result.error);
        else if (s.result.reason == runtime::FinishReason::Cancelled)
            return send_error(res, 503, "the request was cancelled (server shutting down)");
    res.set_content(dump_json(final_body(job, opt.model_name)), "application/json");
}

// A stream: the first event decides between an error status and a 200
// stream, whose provider (write_stream) holds the admission slot.
void Server::Impl::answer_stream(httplib::Response& res, const std::shared_ptr<Job>& job,
                                 std::shared_ptr<AdmissionSlot> slot,
                                 std::vector<runtime::RequestId> ids,
                                 std::string constraint_detail) {
    {
        std::unique_lock<std::mutex> lk(job->mu);
        job->cv.wait(lk, [&] { return job->first_event; });
        const auto& s0 = job->samples[0];
        if (s0.finished && s0.result.reason == runtime::FinishReason::Error) {
            job->cv.wait(lk, [&] { return job->done(); });
            t_log_detail = request_log_detail(*job, constraint_detail);
            return send_error(res, 500, "generation failed: " + s0.result.error);
        }
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // nginx: pass events through at once
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, slot, ids, constraint_detail](size_t, httplib::DataSink& sink) {
            return write_stream(*job, sink, ids, constraint_detail);
        },
        [this, ids](bool success) {
            if (!success) cancel(ids);
        });
}

// The whole stream, written on the worker thread: a chat's role events,
// then the events of new tokens as they come, until every sample finished
// (true) or the client left (false; its requests are cancelled).
bool Server::Impl::write_stream(Job& job, httplib::DataSink& sink,
                                const std::vector<runtime::RequestId>& ids,
                                const std::string& constraint_detail) {
    std::unique_lock<std::mutex> lk(job.mu);
    if (job.req.chat && !job.role_sent) {
        const std::string first = role_chunks(job, opt.model_name);
        job.role_sent = true;
        lk.unlock();
        if (!sink.write(first.data(), first.size())) {
            cancel(ids);
            return false;
        }
        lk.lock();
    }
    uint64_t seen = 0;
    while (true) {
        // Wake on new tokens or the end; the timeout only bounds the wait.
        job.cv.wait_for(lk, std::chrono::milliseconds(500),
                        [&] { return job.events != seen || job.done(); });
        seen = job.events;
        const bool all_done = job.done();
        const std::string out = stream_chunks(job, all_done, opt.model_name);
        if (!out.empty()) {
            lk.unlock();
            const bool ok = sink.write(out.data(), out.size());
            lk.lock();
            if (!ok) {
                cancel(ids);
                t_log_detail = request_log_detail(job, constraint_detail) + " client gone";
                return false;
            }
        }
        if (all_done) {
            t_log_detail = request_log_detail(job, constraint_detail);
            lk.unlock();
            sink.done();
            return true;
        }
    }
}

// ---------------------------------------------------------------------------
// Routes

void Server::Impl::install_routes() {
    http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        return pre_route(req, res);
    });
    http.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) {
            return on_http_error(req, res);
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

    install_info_routes();
    for (const char* path : {"/v1/chat/completions", "/chat/completions"})
        http.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
            handle_completion(req, res, true);
        });
    for (const char* path : {"/v1/completions", "/completions"})
        http.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
            handle_completion(req, res, false);
        });
    http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
        handle_tokenize(req, res);
    });
    http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
        handle_detokenize(req, res);
    });
}

// Every request: its log state, then the API key (all but the open pages).
HandlerResponse Server::Impl::pre_route(const httplib::Request& req, httplib::Response& res) {
    t_request_start = Clock::now();
    t_routed = true;
    t_log_detail.clear();
    if (req.method == "OPTIONS") return HandlerResponse::Unhandled;
    const bool open = req.path == "/" || req.path == "/health" || req.path == "/metrics" ||
                      req.path == "/favicon.ico";
    if (!open && !authorized(req)) {
        send_error(res, 401, "a valid API key is required (Authorization: Bearer KEY)", {},
                   "invalid_api_key");
        return HandlerResponse::Handled;
    }
    return HandlerResponse::Unhandled;
}

// An error status without a body (no route, a body too large) gets OpenAI's error object.
HandlerResponse Server::Impl::on_http_error(const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return HandlerResponse::Unhandled;
    if (res.status == 413)
        send_error(
            res, 413,
            "the request body is larger than " + std::to_string(opt.max_body_bytes) + " bytes");
    else if (res.status == 404)
        send_error(res, 404, "no route " + req.method + " " + req.path);
    else
        send_error(res, res.status, "HTTP error " + std::to_string(res.status));
    return HandlerResponse::Handled;
}

// CORS preflight, /health, /metrics, the chat page and the model list.
void Server::Impl::install_info_routes() {
    http.Options(".*", [](const httplib::Request&, httplib::Response& res) {
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key");
        res.set_header("Access-Control-Max-Age", "86400");
    });
    http.Get("/health",
             [this](const httplib::Request&, httplib::Response& res) { handle_health(res); });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        runtime::EngineStats s;
        if (ready) s = engine->stats();  // ready is set after the engine exists
        res.set_content(metrics.render(s, ready), "text/plain; version=0.0.4");
    });
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(chat_page_html(), "text/html; charset=utf-8");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        if (!ready) return send_error(res, 503, "the model is still loading");
        const json list = {
            {"object", "list"},
            {"data", json::array({model_object(opt.model_name, *model, engine->options().n_ctx)})}};
        res.set_content(dump_json(list), "application/json");
    });
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
        handle_model(req, res);
    });
}

void Server::Impl::handle_health(httplib::Response& res) {
    if (!ready) {
        res.status = 503;
        res.set_header("Retry-After", "1");
        res.set_content(
            dump_json(json{{"status", "loading"},
                           {"error", error_body(503, "the model is still loading")["error"]}}),
            "application/json");
        return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
}

void Server::Impl::handle_model(const httplib::Request& req, httplib::Response& res) {
    if (!ready) return send_error(res, 503, "the model is still loading");
    const std::string id = req.matches[1];
    if (id != opt.model_name)
        return send_error(
            res, 404,
            "the model '" + id + "' does not exist (this server has '" + opt.model_name + "')",
            "model", "model_not_found");
    res.set_content(dump_json(model_object(opt.model_name, *model, engine->options().n_ctx)),
                    "application/json");
}

void Server::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
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
    res.set_content(dump_json(json{{"tokens", tokens}}), "application/json");
}

void Server::Impl::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
    if (!ready) return send_error(res, 503, "the model is still loading");
    const auto b = parse_json_object(req.body);
    if (!b.contains("tokens") || !b["tokens"].is_array())
        throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const auto& t : b["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok->n_vocab())
            throw ApiError(400,
                           "'tokens' must hold token ids in [0, " + std::to_string(tok->n_vocab()) +
                               "), got " + t.dump(),
                           "tokens");
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    res.set_content(dump_json(json{{"content", tok->decode(ids, true)}}), "application/json");
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
