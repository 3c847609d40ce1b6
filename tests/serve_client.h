// The server tests' side of `minfer serve`: a server started on a loopback
// port for a suite, its request log, and what the tests read from an
// answer (the events of an SSE body, an OpenAI error's shape, a value from
// /metrics). Shared by the tests/test_serve*.cpp suites.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "serve/server.h"

namespace minfer::testing {

// A server on an ephemeral 127.0.0.1 port (options.port is ignored),
// answering, with the model attached (it must outlive the server).
inline serve::Server* start_test_server(const model::Model& model, serve::ServerOptions options,
                                        const runtime::EngineOptions& engine_options) {
    options.port = 0;
    auto* server = new serve::Server(options);
    server->bind();
    server->start();
    server->attach(model, engine_options);
    return server;
}

// A client of the test server on `port`; the read timeout bounds a hang,
// it is no speed check.
inline httplib::Client test_client(int port, int read_timeout_s = 30) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(read_timeout_s);
    return c;
}

// A suite's TearDownTestSuite: the server first (it reads the model and
// writes the request log), then what it used, in the order given; every
// pointer is left null.
template <typename... Owned>
void delete_server_then(serve::Server*& server, Owned*&... owned) {
    delete server;
    server = nullptr;
    ((delete owned, owned = nullptr), ...);
}

// The request log of a suite's server: one file per process (ctest runs
// the tests as processes side by side).
class RequestLog {
  public:
    explicit RequestLog(const std::string& name)
        : path_(::testing::TempDir() + name + "." + std::to_string(getpid()) + ".log"),
          file_(std::fopen(path_.c_str(), "w")) {}
    ~RequestLog() {
        if (file_) std::fclose(file_);
        std::remove(path_.c_str());
    }
    std::FILE* file() const { return file_; }  // null when it could not be made
    std::vector<std::string> lines() const {
        std::vector<std::string> out;
        std::ifstream in(path_);
        for (std::string line; std::getline(in, line);) out.push_back(line);
        return out;
    }
    // The first line after the first `skip` that matches `pattern`, waiting
    // up to 5 s (a line is written after its answer: an earlier test's may
    // still come); empty when none comes.
    std::string wait_line(size_t skip, const std::string& pattern) const {
        const std::regex re(pattern);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (std::chrono::steady_clock::now() < end) {
            const auto all = lines();
            for (size_t i = skip; i < all.size(); ++i)
                if (std::regex_search(all[i], re)) return all[i];
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return {};
    }

  private:
    std::string path_;
    std::FILE* file_;
};

// The data events of an SSE body, [DONE] excluded (and required last).
inline std::vector<nlohmann::json> sse_events(const std::string& body) {
    std::vector<nlohmann::json> out;
    size_t pos = 0;
    bool done = false;
    while (pos < body.size()) {
        size_t end = body.find("\n\n", pos);
        EXPECT_NE(end, std::string::npos) << "an event not ended by a blank line";
        if (end == std::string::npos) break;
        std::string ev = body.substr(pos, end - pos);
        pos = end + 2;
        EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
        std::string data = ev.substr(6);
        EXPECT_FALSE(done) << "an event after [DONE]";
        if (data == "[DONE]") {
            done = true;
            continue;
        }
        out.push_back(nlohmann::json::parse(data));
    }
    EXPECT_TRUE(done) << "no data: [DONE]";
    return out;
}

// The answer is an error of OpenAI's shape with this status, whose message
// holds `needle` (and whose param is `param`, when one is given).
inline void expect_api_error(const httplib::Result& r, int status, const std::string& needle,
                             const std::string& param = {}) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    // OpenAI's shape: code is a string or null (never the HTTP status),
    // param a string or null.
    EXPECT_TRUE(j["error"]["code"].is_string() || j["error"]["code"].is_null()) << r->body;
    EXPECT_TRUE(j["error"]["param"].is_string() || j["error"]["param"].is_null()) << r->body;
    if (!j["error"]["message"].is_string()) return;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << j["error"]["message"];
    if (!param.empty()) {
        EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
}

// A sample's value from a /metrics body (`name` with its labels, if any);
// -1 when the line is missing.
inline double metric_value(const std::string& metrics, const std::string& name) {
    std::smatch m;
    const std::regex re("(^|\n)" +
                        std::regex_replace(name, std::regex(R"([{}"\\.+*?()|\[\]^$])"), R"(\$&)") +
                        " ([0-9.e+-]+)\n");
    if (!std::regex_search(metrics, m, re)) return -1;
    return std::stod(m[2]);
}

}  // namespace minfer::testing
