// minfer serve -m MODEL: an OpenAI-compatible HTTP server (src/serve/) with
// llama-server's flags where they exist. It listens before the model is
// loaded (/health answers 503 until it is), serves until SIGINT/SIGTERM,
// then lets running requests finish within a grace period and exits 0.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "commands.h"
#include "common.h"
#include "serve/server.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

serve::Server* g_server = nullptr;
std::atomic<int> g_signals{0};

// The first signal asks for a graceful stop; a second one exits at once.
void on_stop_signal(int) {
    if (g_signals.fetch_add(1) > 0) _exit(130);
    if (g_server) g_server->request_stop();
}

std::string base_name(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

int cmd_serve(int argc, char** argv, int first) {
    std::string model_path = default_model_path();
    std::string host = "127.0.0.1", alias, api_key;
    int port = 8080, n_parallel = 4, queue_limit = 64, http_threads = 0;
    int64_t max_body = 8 << 20;
    double grace = 10.0;
    bool no_prefix_cache = false, quiet = false;
    EngineFlags eng;
    eng.ctx_size = 4096;
    eng.kv_type = "f16";  // llama-server's default; -ctv unset follows it (and a -ctk given)

    ArgParser p("minfer serve",
                "An OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions,\n"
                "/v1/models, /tokenize, /detokenize, /health, /metrics, and a chat page at /.\n"
                "With no -m it serves the built-in tiny model.");
    p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model to serve");
    p.option({"--host"}, &host, "ADDR", "address to listen on");
    p.option({"--port"}, &port, "N", "TCP port (0: any free port, printed at start)");
    p.option({"-np", "--parallel"}, &n_parallel, "N",
             "sequences decoded at once (each of a request's n samples counts as one)");
    eng.add_to(p);
    p.option({"--alias"}, &alias, "NAME", "model name /v1/models lists (default: the file's name)");
    p.option({"--api-key"}, &api_key, "KEY",
             "require 'Authorization: Bearer KEY' (default: $MINFER_API_KEY; none if unset)");
    p.option({"--max-body-size"}, &max_body, "BYTES", "larger request bodies get 413");
    p.option({"--queue-limit"}, &queue_limit, "N",
             "requests that may wait beyond -np; more get 503 with Retry-After");
    p.option({"--threads-http"}, &http_threads, "N",
             "HTTP worker threads (0: enough for -np, the queue and /health)");
    p.option({"--grace"}, &grace, "SECONDS",
             "on SIGINT/SIGTERM, how long running requests may finish");
    p.flag({"--no-prefix-cache"}, &no_prefix_cache,
           "do not share KV pages between requests with the same prompt prefix");
    p.flag({"--log-disable"}, &quiet, "no line per request");
    p.epilog(
        "Examples:\n"
        "  minfer serve -m qwen2.5-0.5b-instruct-q8_0.gguf -c 8192 -np 8\n"
        "  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "    -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'");
    if (!p.parse(argc, argv, first)) return 0;

    if (port < 0 || port > 65535) throw UsageError("--port must be between 0 and 65535");
    if (n_parallel < 1 || n_parallel > 256) throw UsageError("-np must be between 1 and 256");
    if (queue_limit < 0) throw UsageError("--queue-limit must be >= 0");
    if (http_threads < 0 || http_threads > 4096)
        throw UsageError("--threads-http must be between 0 and 4096");
    if (max_body < 1024) throw UsageError("--max-body-size must be at least 1024 bytes");
    if (grace < 0) throw UsageError("--grace must be >= 0");
    if (eng.ctx_size < 16) throw UsageError("-c must be at least 16");
    const runtime::SessionOptions so = eng.session_options();  // checks -t, -b, -ctk, -ctv
    if (api_key.empty())
        if (const char* k = std::getenv("MINFER_API_KEY")) api_key = k;

    serve::ServerOptions opt;
    opt.host = host;
    opt.port = port;
    opt.api_key = api_key;
    opt.model_name = alias.empty() ? base_name(model_path) : alias;
    opt.max_body_bytes = static_cast<size_t>(max_body);
    opt.queue_limit = queue_limit;
    opt.n_parallel = n_parallel;
    opt.http_threads = http_threads;
    opt.grace_seconds = grace;
    opt.log_requests = !quiet;

    serve::Server server(opt);
    const int bound = server.bind();
    g_server = &server;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal
    server.start();
    std::fprintf(stderr, "minfer: listening on http://%s:%d (loading %s)\n", host.c_str(), bound,
                 model_path.c_str());

    model::Model model = eng.load_model(model_path, n_parallel);
    runtime::EngineOptions eo;
    eo.n_ctx = eng.ctx_size;
    eo.n_batch = so.n_batch;
    eo.n_parallel = n_parallel;
    eo.n_threads = so.n_threads;
    eo.kv_type_k = so.kv_type;
    eo.kv_type_v = so.kv_type;
    eo.prefix_cache = !no_prefix_cache;
    eo.batch_invariant = so.batch_invariant;
    server.attach(model, eo);
    std::fprintf(stderr,
                 "minfer: serving %s as '%s' on http://%s:%d (-c %lld, -np %d%s); chat page at /\n",
                 model_path.c_str(), opt.model_name.c_str(), host.c_str(), bound,
                 static_cast<long long>(eng.ctx_size), n_parallel,
                 api_key.empty() ? "" : ", API key required");
    std::fflush(stderr);

    server.wait_for_stop_request();
    std::fprintf(stderr, "minfer: stopping (running requests get %.0f s to finish)\n", grace);
    server.shutdown();
    g_server = nullptr;
    std::fprintf(stderr, "minfer: stopped\n");
    return 0;
}

}  // namespace minfer::cli
