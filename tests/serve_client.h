// What the server tests read from a `minfer serve` answer: the events of an
// SSE body, an OpenAI error's shape, a value from /metrics. Shared by the
// tests/test_serve*.cpp suites (each runs its own server on a loopback port).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

namespace minfer::testing {

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
