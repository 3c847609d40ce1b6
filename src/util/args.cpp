#include "util/args.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace minfer {

namespace {

int64_t parse_int(const std::string& name, const std::string& v) {
    if (v.empty()) throw UsageError("option " + name + " needs an integer, got an empty value");
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (errno == ERANGE || *end != '\0')
        throw UsageError("option " + name + " needs an integer, got '" + v + "'");
    return x;
}

double parse_double(const std::string& name, const std::string& v) {
    if (v.empty()) throw UsageError("option " + name + " needs a number, got an empty value");
    char* end = nullptr;
    errno = 0;
    double x = std::strtod(v.c_str(), &end);
    if (errno == ERANGE || *end != '\0' || !std::isfinite(x))
        throw UsageError("option " + name + " needs a number, got '" + v + "'");
    return x;
}

std::string fmt_double(double d) {
    std::ostringstream os;
    os << d;
    return os.str();
}

}  // namespace

ArgParser::ArgParser(std::string prog, std::string summary)
    : prog_(std::move(prog)), summary_(std::move(summary)) {}

ArgParser::Opt* ArgParser::find(const std::string& name) {
    for (auto& o : opts_)
        for (auto& n : o.names)
            if (n == name) return &o;
    return nullptr;
}

void ArgParser::flag(std::vector<std::string> names, bool* out, std::string help) {
    opts_.push_back({std::move(names), "", std::move(help), "", false,
                     [out](const std::string&) { *out = true; }});
}

void ArgParser::option(std::vector<std::string> names, std::string* out, std::string metavar,
                       std::string help) {
    std::string def = out->empty() ? "" : *out;
    opts_.push_back({std::move(names), std::move(metavar), std::move(help), def, false,
                     [out](const std::string& v) { *out = v; }});
}

void ArgParser::option(std::vector<std::string> names, int64_t* out, std::string metavar,
                       std::string help) {
    std::string n0 = names[0];
    opts_.push_back({std::move(names), std::move(metavar), std::move(help), std::to_string(*out),
                     false, [out, n0](const std::string& v) { *out = parse_int(n0, v); }});
}

void ArgParser::option(std::vector<std::string> names, int* out, std::string metavar,
                       std::string help) {
    std::string n0 = names[0];
    opts_.push_back({std::move(names), std::move(metavar), std::move(help), std::to_string(*out),
                     false, [out, n0](const std::string& v) {
                         int64_t x = parse_int(n0, v);
                         if (x < INT32_MIN || x > INT32_MAX)
                             throw UsageError("option " + n0 + ": " + v + " is out of range");
                         *out = static_cast<int>(x);
                     }});
}

void ArgParser::option(std::vector<std::string> names, double* out, std::string metavar,
                       std::string help) {
    std::string n0 = names[0];
    opts_.push_back({std::move(names), std::move(metavar), std::move(help), fmt_double(*out), false,
                     [out, n0](const std::string& v) { *out = parse_double(n0, v); }});
}

void ArgParser::option(std::vector<std::string> names, float* out, std::string metavar,
                       std::string help) {
    std::string n0 = names[0];
    opts_.push_back({std::move(names), std::move(metavar), std::move(help), fmt_double(*out), false,
                     [out, n0](const std::string& v) {
                         const double x = parse_double(n0, v);
                         // Converting a double outside float's range is undefined.
                         if (std::fabs(x) > std::numeric_limits<float>::max())
                             throw UsageError("option " + n0 + ": " + v + " is out of range");
                         *out = static_cast<float>(x);
                     }});
}

void ArgParser::multi(std::vector<std::string> names, std::vector<std::string>* out,
                      std::string metavar, std::string help) {
    opts_.push_back({std::move(names), std::move(metavar), std::move(help), "", false,
                     [out](const std::string& v) { out->push_back(v); }});
}

void ArgParser::optional_value(std::vector<std::string> names, bool* given, std::string* out,
                               std::string metavar, std::string help) {
    opts_.push_back({std::move(names), std::move(metavar), std::move(help), "", true,
                     [given, out](const std::string& v) {
                         *given = true;
                         if (!v.empty()) *out = v;
                     }});
}

void ArgParser::positional(std::string name, std::string* out, std::string help, bool required) {
    pos_.push_back({std::move(name), out, std::move(help), required});
}

bool ArgParser::was_set(const std::string& first_name) const {
    for (auto& o : opts_)
        if (o.names[0] == first_name) return o.seen;
    return false;
}

bool ArgParser::parse(int argc, char** argv, int first) {
    size_t next_pos = 0;
    for (int i = first; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(usage().c_str(), stdout);
            return false;
        }
        if (a.size() > 1 && a[0] == '-' &&
            !(a.size() > 1 && (std::isdigit((unsigned char)a[1]) || a[1] == '.'))) {
            std::string name = a, value;
            bool inline_value = false;
            if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
                name = a.substr(0, eq);
                value = a.substr(eq + 1);
                inline_value = true;
            }
            Opt* o = find(name);
            if (!o) throw UsageError("unknown option '" + name + "'");
            o->seen = true;
            if (o->metavar.empty()) {
                if (inline_value) throw UsageError("option " + name + " takes no value");
                o->set("");
            } else if (inline_value) {
                o->set(value);
            } else if (o->optional_value) {
                if (i + 1 < argc && argv[i + 1][0] != '-')
                    o->set(argv[++i]);
                else
                    o->set("");
            } else {
                if (i + 1 >= argc)
                    throw UsageError("option " + name + " needs a value (" + o->metavar + ")");
                o->set(argv[++i]);
            }
            continue;
        }
        if (next_pos >= pos_.size()) throw UsageError("unexpected argument '" + a + "'");
        *pos_[next_pos].out = a;
        pos_[next_pos].seen = true;
        ++next_pos;
    }
    for (auto& p : pos_)
        if (p.required && !p.seen) throw UsageError("missing " + p.name);
    return true;
}

std::string ArgParser::usage() const {
    std::ostringstream os;
    os << "usage: " << prog_;
    if (!opts_.empty()) os << " [options]";
    for (auto& p : pos_) os << (p.required ? " " : " [") << p.name << (p.required ? "" : "]");
    os << "\n\n" << summary_ << "\n";
    if (!pos_.empty()) {
        os << "\narguments:\n";
        for (auto& p : pos_)
            os << "  " << p.name << std::string(p.name.size() < 26 ? 26 - p.name.size() : 1, ' ')
               << p.help << "\n";
    }
    if (!opts_.empty()) {
        os << "\noptions:\n";
        for (auto& o : opts_) {
            std::string left = "  ";
            for (size_t k = 0; k < o.names.size(); ++k) left += (k ? ", " : "") + o.names[k];
            if (!o.metavar.empty())
                left += o.optional_value ? " [" + o.metavar + "]" : " " + o.metavar;
            os << left;
            if (left.size() < 28)
                os << std::string(28 - left.size(), ' ');
            else
                os << "\n" << std::string(28, ' ');
            os << o.help;
            if (!o.default_text.empty()) os << " (default: " << o.default_text << ")";
            os << "\n";
        }
        os << "  -h, --help" << std::string(28 - 12, ' ') << "show this help and exit\n";
    }
    if (!epilog_.empty()) os << "\n" << epilog_ << "\n";
    return os.str();
}

}  // namespace minfer
