// `minfer serve`: an OpenAI-compatible HTTP server (cpp-httplib) in front of
// the many-sequence engine (runtime/engine.h). HTTP worker threads parse and
// check requests, submit them to the engine and stream its tokens back; one
// engine thread runs Engine::step() in a loop. The server talks to the
// runtime only (engine and tokenizer), never to graphs or backends, and
// works the same whichever engine implementation is linked.
//
// Lifecycle: bind() (the port answers at once, /health says 503 while
// loading), start(), attach() once the model is loaded (/health 200), and
// shutdown(): stop accepting, let running requests finish within the grace
// period, cancel the rest, join every thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "model/model.h"
#include "runtime/engine.h"

namespace minfer::serve {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                   // 0: any free port (bind() returns it)
    std::string api_key;               // empty: no key asked for
    std::string model_name;            // /v1/models' id: --alias or the file's name
    size_t max_body_bytes = 8u << 20;  // larger bodies get 413
    int queue_limit = 64;              // requests waiting beyond -np; then 503
    int n_parallel = 8;                // the engine's -np: sizes the HTTP worker pool
    int http_threads = 0;              // 0: -np + queue_limit + 16, so /health never waits
    double grace_seconds = 10.0;       // shutdown: how long running requests may finish
    bool log_requests = true;          // one line per request on `log`
    std::FILE* log = stderr;
};

class Server {
  public:
    explicit Server(ServerOptions options);
    ~Server();  // shutdown() if not done
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Binds the listening socket (address reuse on). Returns the port.
    // Throws minfer::Error when the address cannot be bound.
    int bind();
    // Answers requests on a background thread (call after bind()).
    void start();
    // The model is loaded: builds the engine over it and starts its loop.
    // The model must outlive the server.
    void attach(const model::Model& model, runtime::EngineOptions engine_options);
    // Graceful stop (idempotent): see the file comment.
    void shutdown();
    // Blocks until shutdown() has been asked for from another thread or a
    // signal handler (request_stop()).
    void wait_for_stop_request();
    // Async-signal-safe: asks wait_for_stop_request() to return.
    void request_stop();

    int port() const;
    runtime::Engine* engine();  // null before attach()

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace minfer::serve
