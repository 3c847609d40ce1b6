#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "gguf/file_type.h"
#include "gguf/gguf.h"
#include "shared_files.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::gguf;
using tensor::DType;

namespace {

// Raw little-endian byte builder for hand-made (mostly broken) files.
struct Bytes {
    std::vector<uint8_t> b;
    Bytes& u8(uint8_t v) { return raw(&v, 1); }
    Bytes& u32(uint32_t v) { return raw(&v, 4); }
    Bytes& u64(uint64_t v) { return raw(&v, 8); }
    Bytes& str(const std::string& s) {
        u64(s.size());
        return raw(s.data(), s.size());
    }
    Bytes& raw(const void* p, size_t n) {
        const auto* c = static_cast<const uint8_t*>(p);
        b.insert(b.end(), c, c + n);
        return *this;
    }
    Bytes& pad_to(size_t a) {
        while (b.size() % a) b.push_back(0);
        return *this;
    }
    Bytes& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
    // "GGUF", version, n_tensors, n_kv
    static Bytes header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        Bytes x;
        x.raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
        return x;
    }
    // One tensor info: name, dims, type, offset.
    Bytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(ne.size()));
        for (uint64_t n : ne) u64(n);
        return u32(type).u64(offset);
    }
};

// Parses and returns the error message; fails the test when nothing throws.
std::string parse_error(const std::vector<uint8_t>& bytes) {
    try {
        File::parse(bytes.data(), bytes.size(), "bad.gguf");
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "parse did not throw";
    return "";
}

#define EXPECT_HAS(msg, sub) \
    EXPECT_NE(std::string(msg).find(sub), std::string::npos) << "message: " << (msg)

std::vector<uint8_t> filled(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
    return v;
}

// A small valid file with a bit of everything. The last tensor is 32 bytes
// (a multiple of the alignment) so that the file has no trailing padding and
// every truncation must be detected.
Writer small_writer() {
    Writer w;
    w.set_string("general.architecture", "qwen2");
    w.set_u32("qwen2.block_count", 2);
    w.set_f32("qwen2.rope.freq_base", 10000.0f);
    w.set_string_array("tokenizer.ggml.tokens", {"a", "bc", ""});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 3});
    w.add_tensor("q8", DType::Q8_0, {32, 2}, filled(68, 1));
    w.add_tensor("f32", DType::F32, {8}, filled(32, 2));
    return w;
}

std::string tmp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("minfer_test_gguf_" + std::to_string(::getpid()) + "_" + name))
        .string();
}

}  // namespace

// ---- round trip ------------------------------------------------------------

TEST(Gguf, RoundTripsEveryValueType) {
    Writer w;
    auto scalar = [&](const char* k, ValueType t, uint64_t u, int64_t i, double f) {
        Value v;
        v.type = t;
        v.u64 = u;
        v.i64 = i;
        v.f64 = f;
        w.set(k, v);
    };
    scalar("u8", ValueType::UINT8, 255, 0, 0);
    scalar("i8", ValueType::INT8, 0, -128, 0);
    scalar("u16", ValueType::UINT16, 65535, 0, 0);
    scalar("i16", ValueType::INT16, 0, -32768, 0);
    scalar("u32", ValueType::UINT32, 4000000000u, 0, 0);
    scalar("i32", ValueType::INT32, 0, -2000000000, 0);
    scalar("f32", ValueType::FLOAT32, 0, 0, 1.5);
    scalar("bool", ValueType::BOOL, 1, 0, 0);
    scalar("u64", ValueType::UINT64, 0xFFFFFFFFFFFFFFFFull, 0, 0);
    scalar("i64", ValueType::INT64, 0, std::numeric_limits<int64_t>::min(), 0);
    scalar("f64", ValueType::FLOAT64, 0, 0, 0.1);
    w.set_string("str", std::string("h\0llo", 5));
    w.set_string_array("strs", {"x", "", "zz"});
    w.set_i32_array("i32s", {-1, 0, 7});
    w.set_f32_array("f32s", {0.25f, -3.0f});
    Value u8s;
    u8s.type = ValueType::ARRAY;
    u8s.elem_type = ValueType::UINT8;
    u8s.arr_int = {0, 200, 255};
    w.set("u8s", u8s);
    Value bools;
    bools.type = ValueType::ARRAY;
    bools.elem_type = ValueType::BOOL;
    bools.arr_int = {1, 0};
    w.set("bools", bools);
    Value f64s;
    f64s.type = ValueType::ARRAY;
    f64s.elem_type = ValueType::FLOAT64;
    f64s.arr_float = {0.1, 1e300};
    w.set("f64s", f64s);
    // [[1, 2], [["a"]]] as nested arrays: arr of arr.
    Value inner1;
    inner1.type = ValueType::ARRAY;
    inner1.elem_type = ValueType::INT64;
    inner1.arr_int = {1, 2};
    Value inner_s;
    inner_s.type = ValueType::ARRAY;
    inner_s.elem_type = ValueType::STRING;
    inner_s.arr_str = {"a"};
    Value inner2;
    inner2.type = ValueType::ARRAY;
    inner2.elem_type = ValueType::ARRAY;
    inner2.arr_nested = {inner_s};
    Value nested;
    nested.type = ValueType::ARRAY;
    nested.elem_type = ValueType::ARRAY;
    nested.arr_nested = {inner1, inner2};
    w.set("nested", nested);
    w.set_u32("u32", 5);  // replaces in place: order stays

    const auto bytes = w.to_bytes();
    File f = File::parse(bytes.data(), bytes.size());
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 32u);
    ASSERT_EQ(f.metadata().size(), 19u);
    EXPECT_EQ(f.metadata()[0].key, "u8");
    EXPECT_EQ(f.metadata()[4].key, "u32");
    EXPECT_EQ(f.get_int("u8"), 255);
    EXPECT_EQ(f.get_int("i8"), -128);
    EXPECT_EQ(f.get_int("u16"), 65535);
    EXPECT_EQ(f.get_int("i16"), -32768);
    EXPECT_EQ(f.get_int("u32"), 5);
    EXPECT_EQ(f.get_int("i32"), -2000000000);
    EXPECT_EQ(f.get_float("f32"), 1.5);
    EXPECT_EQ(f.get_bool("bool"), true);
    EXPECT_EQ(f.find("u64")->u64, 0xFFFFFFFFFFFFFFFFull);
    EXPECT_THROW(f.get_int("u64"), Error);  // does not fit in int64
    EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f.get_float("f64"), 0.1);
    EXPECT_EQ(f.get_float("u32"), 5.0);
    EXPECT_EQ(f.get_string("str"), std::string("h\0llo", 5));
    EXPECT_EQ(*f.get_string_array("strs"), (std::vector<std::string>{"x", "", "zz"}));
    EXPECT_EQ(*f.get_int_array("i32s"), (std::vector<int64_t>{-1, 0, 7}));
    EXPECT_EQ(*f.get_float_array("f32s"), (std::vector<double>{0.25, -3.0}));
    EXPECT_EQ(*f.get_int_array("u8s"), (std::vector<int64_t>{0, 200, 255}));
    EXPECT_EQ(*f.get_int_array("bools"), (std::vector<int64_t>{1, 0}));
    EXPECT_EQ(*f.get_float_array("f64s"), (std::vector<double>{0.1, 1e300}));
    const Value* n = f.find("nested");
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->elem_type, ValueType::ARRAY);
    ASSERT_EQ(n->array_size(), 2u);
    EXPECT_EQ(n->arr_nested[0].arr_int, (std::vector<int64_t>{1, 2}));
    ASSERT_EQ(n->arr_nested[1].arr_nested.size(), 1u);
    EXPECT_EQ(n->arr_nested[1].arr_nested[0].arr_str, (std::vector<std::string>{"a"}));

    // Absent keys are nullopt / nullptr; wrong types throw naming the key.
    EXPECT_EQ(f.get_int("missing"), std::nullopt);
    EXPECT_EQ(f.get_string_array("missing"), nullptr);
    try {
        f.get_string("u8");
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "'u8'");
    }
    EXPECT_THROW(f.get_float_array("strs"), Error);
    EXPECT_THROW(f.get_int_array("nested"), Error);
    EXPECT_THROW(f.get_bool("u8"), Error);

    // Writing what we read gives the same bytes.
    Writer w2;
    w2.copy_metadata(f);
    EXPECT_EQ(w2.to_bytes(), bytes);
}

TEST(Gguf, RoundTripsTensorsWithPaddingAndAlignment) {
    for (size_t align : {32u, 64u, 1u, 256u}) {
        Writer w;
        w.set_alignment(align);
        const auto a = filled(4 * 3 * 2, 1);        // f32 [3, 2]
        const auto b = filled(34 * 2 * 3, 2);       // q8_0 [64, 3]
        const auto c = filled(144 * 2, 3);          // q4_K [512]
        const auto d = filled(2 * 5, 4);            // f16 [5]
        const auto e = filled(210 * 1 * 2 * 2, 5);  // q6_K [256, 1, 2, 2]
        w.add_tensor("a", DType::F32, {3, 2}, a);
        w.add_tensor("b", DType::Q8_0, {64, 3}, b);
        w.add_tensor("c", DType::Q4_K, {512}, c);
        w.add_tensor("d", DType::F16, {5}, d);
        w.add_tensor("e", DType::Q6_K, {256, 1, 2, 2}, e);
        const auto bytes = w.to_bytes();
        File f = File::parse(bytes.data(), bytes.size());
        EXPECT_EQ(f.alignment(), align);
        EXPECT_EQ(f.data_offset() % align, 0u);
        EXPECT_EQ(f.find("general.alignment") != nullptr, align != 32);
        ASSERT_EQ(f.tensors().size(), 5u);
        const std::vector<std::vector<uint8_t>> datas = {a, b, c, d, e};
        for (size_t i = 0; i < 5; ++i) {
            const TensorInfo& t = f.tensors()[i];
            EXPECT_EQ(t.offset % align, 0u) << t.name;
            ASSERT_EQ(t.nbytes, datas[i].size()) << t.name;
            EXPECT_EQ(std::memcmp(t.data, datas[i].data(), t.nbytes), 0) << t.name;
            EXPECT_EQ(t.data, bytes.data() + f.data_offset() + t.offset);
        }
        const TensorInfo* e_info = f.find_tensor("e");
        ASSERT_NE(e_info, nullptr);
        EXPECT_EQ(e_info->type, DType::Q6_K);
        EXPECT_EQ(e_info->n_dims, 4u);
        EXPECT_EQ(e_info->ne, (std::array<int64_t, 4>{256, 1, 2, 2}));
        EXPECT_EQ(f.find_tensor("d")->ne, (std::array<int64_t, 4>{5, 1, 1, 1}));
        auto v = f.find_tensor("b")->view();
        EXPECT_EQ(v.n_rows(), 3);
        EXPECT_EQ(v.row_bytes(), 68u);
        EXPECT_EQ(v.row(1), f.find_tensor("b")->data + 68);
        EXPECT_EQ(f.find_tensor("zz"), nullptr);
        // ggml's layout: the data section holds every tensor padded.
        EXPECT_EQ(bytes.size() % align, 0u);
    }
}

TEST(Gguf, OpensAFileOnDisk) {
    const std::string path = tmp_path("ok.gguf");
    small_writer().write(path);
    File f = File::open(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.get_string("general.architecture"), "qwen2");
    EXPECT_EQ(f.file_size(), std::filesystem::file_size(path));
    ASSERT_NE(f.find_tensor("f32"), nullptr);
    EXPECT_EQ(f.find_tensor("f32")->data[0], 2);
    std::remove(path.c_str());
}

TEST(Gguf, ReadsVersion2) {
    auto bytes = small_writer().to_bytes();
    bytes[4] = 2;
    EXPECT_EQ(File::parse(bytes.data(), bytes.size()).version(), 2u);
}

TEST(Gguf, AllowsZeroSizedTensors) {
    // ggml allows ne == 0 (only negative sizes are refused).
    Bytes x = Bytes::header(1, 0);
    x.tensor("empty", {0, 4}, 0, 0).pad_to(32);
    File f = File::parse(x.b.data(), x.b.size());
    EXPECT_EQ(f.tensors()[0].nbytes, 0u);
}

// ---- bad input -------------------------------------------------------------

TEST(GgufBad, TruncationAtEveryByteThrows) {
    const auto bytes = small_writer().to_bytes();
    File::parse(bytes.data(), bytes.size());  // the whole file is fine
    for (size_t k = 0; k < bytes.size(); ++k) {
        // A fresh heap copy of exactly k bytes, so that ASan sees any read
        // past the end.
        std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + k);
        EXPECT_THROW(File::parse(cut.data(), cut.size(), "cut.gguf"), Error) << "k=" << k;
    }
}

TEST(GgufBad, EveryByteMutatedParsesOrThrows) {
    // A cheap deterministic fuzz: each byte replaced by a few telling values.
    // Each parse must either succeed or throw minfer::Error (ASan/UBSan runs
    // of this test catch any out-of-bounds read or overflow on the way).
    const auto bytes = small_writer().to_bytes();
    size_t n_ok = 0, n_err = 0;
    for (size_t k = 0; k < bytes.size(); ++k) {
        for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x80}, uint8_t(bytes[k] + 1)}) {
            std::vector<uint8_t> m = bytes;
            m[k] = v;
            try {
                File f = File::parse(m.data(), m.size());
                for (const auto& t : f.tensors()) {
                    if (t.nbytes) {
                        ASSERT_LE(t.data + t.nbytes, m.data() + m.size());
                    }
                }
                ++n_ok;
            } catch (const Error&) {
                ++n_err;
            }
        }
    }
    EXPECT_GT(n_err, 0u);
    EXPECT_GT(n_ok, 0u);  // data bytes may change freely
}

TEST(GgufBad, EmptyFile) {
    EXPECT_HAS(parse_error({}), "empty");
}

TEST(GgufBad, BadMagic) {
    auto bytes = small_writer().to_bytes();
    bytes[0] = 'X';
    const std::string m = parse_error(bytes);
    EXPECT_HAS(m, "magic");
    EXPECT_HAS(m, "bad.gguf");
}

TEST(GgufBad, Version1And99) {
    auto bytes = small_writer().to_bytes();
    bytes[4] = 1;
    EXPECT_HAS(parse_error(bytes), "version 1");
    bytes[4] = 99;
    EXPECT_HAS(parse_error(bytes), "version 99");
}

TEST(GgufBad, HugeCounts) {
    EXPECT_HAS(parse_error(Bytes::header(0, 1ull << 62).zeros(64).b), "metadata entries");
    EXPECT_HAS(parse_error(Bytes::header(~0ull, 0).zeros(64).b), "tensors");
}

TEST(GgufBad, StringLength2Pow63) {
    Bytes x = Bytes::header(0, 1);
    x.u64(1ull << 63).zeros(16);  // key length
    EXPECT_HAS(parse_error(x.b), "length 9223372036854775808");
    Bytes y = Bytes::header(0, 1);
    y.str("k").u32(8).u64(1ull << 63).zeros(16);  // string value length
    EXPECT_HAS(parse_error(y.b), "key 'k'");
}

TEST(GgufBad, ArrayCountNear2Pow64) {
    for (uint32_t et : {0u /*u8*/, 8u /*string*/, 9u /*array*/, 12u /*f64*/}) {
        Bytes x = Bytes::header(0, 1);
        x.str("arr").u32(9).u32(et).u64(~0ull - 1).zeros(64);
        const std::string m = parse_error(x.b);
        EXPECT_HAS(m, "key 'arr'");
        EXPECT_HAS(m, "18446744073709551614 elements");
    }
}

TEST(GgufBad, InvalidValueTypes) {
    Bytes x = Bytes::header(0, 1);
    x.str("k").u32(13).zeros(8);
    EXPECT_HAS(parse_error(x.b), "key 'k' has invalid value type 13");
    Bytes y = Bytes::header(0, 1);
    y.str("k").u32(9).u32(77).u64(1).zeros(8);
    EXPECT_HAS(parse_error(y.b), "invalid element type 77");
    Bytes z = Bytes::header(0, 1);
    z.str("flag").u32(7).u8(2);
    EXPECT_HAS(parse_error(z.b), "key 'flag'");
}

TEST(GgufBad, NestedArrayDepthBomb) {
    // 10000 levels of arrays of one array: must fail at the depth limit, not
    // overflow the stack.
    Bytes x = Bytes::header(0, 1);
    x.str("bomb").u32(9);
    for (int i = 0; i < 10000; ++i) x.u32(9).u64(1);
    const std::string m = parse_error(x.b);
    EXPECT_HAS(m, "key 'bomb'");
    EXPECT_HAS(m, "nested deeper");
}

TEST(GgufBad, DuplicateKey) {
    Bytes x = Bytes::header(0, 2);
    x.str("k").u32(4).u32(1).str("k").u32(4).u32(2);
    EXPECT_HAS(parse_error(x.b), "duplicate metadata key 'k'");
}

TEST(GgufBad, BadAlignment) {
    for (uint32_t a : {0u, 3u, 48u}) {
        Bytes x = Bytes::header(0, 1);
        x.str("general.alignment").u32(4).u32(a);
        const std::string m = parse_error(x.b);
        EXPECT_HAS(m, "general.alignment");
        EXPECT_HAS(m, "power of two");
    }
    Bytes y = Bytes::header(0, 1);
    y.str("general.alignment").u32(10).u64(32);
    EXPECT_HAS(parse_error(y.b), "expected u32");
}

TEST(GgufBad, NDims0And5) {
    for (uint32_t nd : {0u, 5u}) {
        Bytes x = Bytes::header(1, 0);
        x.str("t").u32(nd).zeros(80);
        const std::string m = parse_error(x.b);
        EXPECT_HAS(m, "tensor 't'");
        EXPECT_HAS(m, std::to_string(nd) + " dimensions");
    }
}

TEST(GgufBad, UnknownTensorType) {
    Bytes x = Bytes::header(1, 0);
    x.tensor("w", {32}, 4, 0).pad_to(32).zeros(128);
    const std::string m = parse_error(x.b);
    EXPECT_HAS(m, "tensor 'w'");
    EXPECT_HAS(m, "type id 4");
}

TEST(GgufBad, NegativeAndOverflowingShapes) {
    Bytes x = Bytes::header(1, 0);
    x.tensor("neg", {~0ull}, 0, 0).pad_to(32).zeros(32);
    EXPECT_HAS(parse_error(x.b), "tensor 'neg' ne[0]");
    Bytes y = Bytes::header(1, 0);
    y.tensor("big", {1ull << 32, 1ull << 32}, 0, 0).pad_to(32).zeros(32);
    const std::string m = parse_error(y.b);
    EXPECT_HAS(m, "tensor 'big'");
    EXPECT_HAS(m, "overflows");
    // Elements fit in int64 but bytes do not: 2^62 f32 elements.
    Bytes z = Bytes::header(1, 0);
    z.tensor("bytes", {1ull << 62}, 0, 0).pad_to(32).zeros(32);
    EXPECT_HAS(parse_error(z.b), "tensor 'bytes' byte size overflows");
}

TEST(GgufBad, RowNotAMultipleOfTheBlockSize) {
    Bytes x = Bytes::header(1, 0);
    x.tensor("q", {48, 2}, 8 /*q8_0*/, 0).pad_to(32).zeros(256);
    const std::string m = parse_error(x.b);
    EXPECT_HAS(m, "tensor 'q'");
    EXPECT_HAS(m, "block size 32");
}

TEST(GgufBad, MisalignedOffset) {
    Bytes x = Bytes::header(1, 0);
    x.tensor("m", {4}, 0, 16).pad_to(32).zeros(64);
    const std::string m = parse_error(x.b);
    EXPECT_HAS(m, "tensor 'm'");
    EXPECT_HAS(m, "alignment 32");
}

TEST(GgufBad, DataPastTheEnd) {
    Bytes x = Bytes::header(1, 0);
    x.tensor("blk.0.attn_q.weight", {16}, 0, 32).pad_to(32);
    const size_t data_offset = x.b.size();
    x.zeros(80);  // 64 + 16 would be needed
    const std::string m = parse_error(x.b);
    EXPECT_HAS(m, "tensor 'blk.0.attn_q.weight': data [offset " + std::to_string(data_offset + 32) +
                      ", 64 bytes] runs past the end of the "
                      "file (" +
                      std::to_string(x.b.size()) + " bytes)");
    // An offset so large that offset + nbytes wraps around.
    Bytes y = Bytes::header(1, 0);
    y.tensor("wrap", {16}, 0, ~0ull - 31).pad_to(32).zeros(64);
    EXPECT_HAS(parse_error(y.b), "tensor 'wrap'");
}

TEST(GgufBad, OverlappingTensors) {
    Bytes x = Bytes::header(2, 0);
    x.tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad_to(32).zeros(128);
    const std::string m = parse_error(x.b);
    EXPECT_HAS(m, "tensor 'b'");
    EXPECT_HAS(m, "overlaps tensor 'a'");
}

TEST(GgufBad, DuplicateTensorName) {
    Bytes x = Bytes::header(2, 0);
    x.tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32).pad_to(32).zeros(64);
    EXPECT_HAS(parse_error(x.b), "duplicate tensor name 't'");
}

TEST(GgufBad, MissingFileAndDirectory) {
    try {
        File::open("/nonexistent/model.gguf");
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "/nonexistent/model.gguf");
    }
    const std::string dir = std::filesystem::temp_directory_path().string();
    try {
        File::open(dir);
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_HAS(e.what(), "directory");
    }
}

TEST(GgufBad, WriterRefusesBadTensors) {
    Writer w;
    EXPECT_THROW(w.add_tensor("x", DType::Q8_0, {33}, filled(34, 0)), Error);
    EXPECT_THROW(w.add_tensor("x", DType::F32, {4}, filled(15, 0)), Error);
    EXPECT_THROW(w.add_tensor("x", DType::F32, {1, 1, 1, 1, 1}, filled(4, 0)), Error);
    EXPECT_THROW(w.set_alignment(3), Error);
    w.add_tensor("x", DType::F32, {4}, filled(16, 0));
    EXPECT_THROW(w.add_tensor("x", DType::F32, {4}, filled(16, 0)), Error);
}

// ---- file types ------------------------------------------------------------

TEST(GgufFileType, NamesBothWays) {
    EXPECT_EQ(file_type_name(15), "MOSTLY_Q4_K_M");
    EXPECT_EQ(file_type_name(7), "MOSTLY_Q8_0");
    EXPECT_EQ(file_type_name(0), "ALL_F32");
    EXPECT_EQ(file_type_name(32), "MOSTLY_BF16");
    EXPECT_EQ(file_type_name(4), std::nullopt);
    EXPECT_EQ(file_type_from_name("Q4_K_M"), 15u);
    EXPECT_EQ(file_type_from_name("q8_0"), 7u);
    EXPECT_EQ(file_type_from_name("MOSTLY_IQ4_XS"), 30u);
    EXPECT_EQ(file_type_from_name("f16"), 1u);
    EXPECT_EQ(file_type_from_name("Q9"), std::nullopt);
    EXPECT_EQ(file_type_main_dtype(12), DType::Q3_K);
    EXPECT_EQ(describe_file_type(1024 + 18), "MOSTLY_Q6_K (18) (guessed)");
    EXPECT_EQ(describe_file_type(99), "unknown (99)");
}

// ---- the models in ../shared -------------------------------------------------

TEST(GgufShared, OpensEachModel) {
    struct Known {
        const char* file;
        const char* arch;
        DType embd_type;
    };
    const Known models[] = {
        {"kjv-tiny-f32.gguf", "qwen2", DType::F32},
        {"kjv-tiny-f16.gguf", "qwen2", DType::F16},
        {"kjv-tiny-q8_0.gguf", "qwen2", DType::Q8_0},
        {"qwen2-mini-q8_0.gguf", "qwen2", DType::Q8_0},
        {"qwen3-mini-q4_k_m.gguf", "qwen3", DType::Q6_K}  // Q4_K_M keeps embd at q6_K,
    };
    int opened = 0;
    std::string missing;
    for (const auto& m : models) {
        const std::string path = minfer::testing::shared_file(std::string("models/") + m.file);
        if (!std::filesystem::exists(path)) {
            // Said, not silent; a failure where ../shared must be complete.
            if (minfer::testing::shared_required())
                ADD_FAILURE() << "missing " << path << " (MINFER_REQUIRE_SHARED=1)";
            missing += " " + path;
            continue;
        }
        ++opened;
        SCOPED_TRACE(path);
        File f = File::open(path);
        auto arch = f.get_string("general.architecture");
        ASSERT_TRUE(arch.has_value());
        if (m.arch) {
            EXPECT_EQ(*arch, m.arch);
        }
        EXPECT_GT(f.tensors().size(), 0u);
        const TensorInfo* e = f.find_tensor("token_embd.weight");
        ASSERT_NE(e, nullptr);
        auto n_embd = f.get_int(*arch + ".embedding_length");
        ASSERT_TRUE(n_embd.has_value());
        EXPECT_EQ(e->ne[0], *n_embd);
        auto tokens = f.get_string_array("tokenizer.ggml.tokens");
        ASSERT_NE(tokens, nullptr);
        EXPECT_EQ(e->ne[1], static_cast<int64_t>(tokens->size()));
        EXPECT_EQ(e->type, m.embd_type);
        EXPECT_EQ(e->nbytes, tensor::row_size(e->type, e->ne[0]) * static_cast<size_t>(e->ne[1]));
        EXPECT_GT(f.get_int(*arch + ".block_count").value_or(0), 0);
        EXPECT_EQ(f.version(), 3u);
    }
    if (opened == 0)
        GTEST_SKIP() << "no models in " MINFER_SHARED_DIR "/models (missing:" << missing << ")";
    if (!missing.empty()) std::printf("skipped, not present:%s\n", missing.c_str());
}

// ---- minfer info -----------------------------------------------------------

namespace {

using minfer::testing::CliResult;
using minfer::testing::run_cli;

}  // namespace

TEST(GgufInfoCli, DescribesAWrittenModel) {
    Writer w = small_writer();
    w.set_u32("qwen2.embedding_length", 32);
    w.set_u32("general.file_type", 7);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_string("tokenizer.ggml.model", "gpt2");
    const std::string path = tmp_path("info.gguf");
    w.write(path);

    CliResult r = run_cli("info " + path);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_HAS(r.out, "architecture:   qwen2");
    EXPECT_HAS(r.out, "file type:      MOSTLY_Q8_0 (7)");
    EXPECT_HAS(r.out, "qwen2.block_count       2");
    EXPECT_HAS(r.out, "qwen2.rope.freq_base    10000.0");
    EXPECT_HAS(r.out, "bos id         1 'bc'");
    EXPECT_HAS(r.out, "token types    CONTROL 1, NORMAL 2");  // types 1, 1, 3; by name
    // 64 + 8 parameters in 68 + 32 bytes: 800 / 72 bits per weight.
    EXPECT_HAS(r.out, "parameters     72 ");
    EXPECT_HAS(r.out, "bits/weight    11.11");
    EXPECT_HAS(r.out, "tensors: 2 (f32 1, q8_0 1)");
    EXPECT_HAS(r.out, "q8    q8_0    [32, 2]");

    CliResult j = run_cli("info -m " + path + " --json");
    ASSERT_EQ(j.code, 0);
    const auto doc = nlohmann::json::parse(j.out);
    EXPECT_EQ(doc["n_tensors"], 2);
    EXPECT_EQ(doc["tensors"].size(), 2u);
    EXPECT_EQ(doc["tensors"][0]["name"], "q8");
    EXPECT_EQ(doc["tensors"][0]["bytes"], 68);
    EXPECT_EQ(doc["hparams"]["qwen2.block_count"], 2);
    EXPECT_EQ(doc["tokenizer"]["n_tokens"], 3);
    EXPECT_EQ(doc["tokenizer"]["bos"]["text"], "bc");
    EXPECT_EQ(doc["file_type"]["name"], "MOSTLY_Q8_0");
    EXPECT_EQ(doc["tensor_types"]["q8_0"], 1);

    CliResult nt = run_cli("info --no-tensors --json " + path);
    ASSERT_EQ(nt.code, 0);
    EXPECT_FALSE(nlohmann::json::parse(nt.out).contains("tensors"));
    std::remove(path.c_str());
}

TEST(GgufInfoCli, BadFileExitsWithOne) {
    const std::string path = tmp_path("bad.gguf");
    auto bytes = small_writer().to_bytes();
    bytes.pop_back();  // cuts the last tensor short
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    CliResult r = run_cli("info " + path);
    EXPECT_EQ(r.code, 1);
    EXPECT_HAS(r.err, "minfer: error: gguf: '" + path + "': tensor 'f32'");
    EXPECT_EQ(run_cli("info").code, 2);  // usage error: no model
    std::remove(path.c_str());
}

// A small file must not decode into a huge amount of memory: 3 million
// empty nested arrays take 36 MB in the file format but over 400 MB as
// Values. The parser stops at its 256 MiB metadata budget before
// allocating them.
TEST(GgufBad, MetadataThatDecodesToMoreThanTheBudgetIsRefused) {
    std::vector<uint8_t> b;
    auto put = [&](const void* p, size_t n) {
        const auto* c = static_cast<const uint8_t*>(p);
        b.insert(b.end(), c, c + n);
    };
    auto u32 = [&](uint32_t x) { put(&x, 4); };
    auto u64 = [&](uint64_t x) { put(&x, 8); };
    put("GGUF", 4);
    u32(3);
    u64(0);  // tensors
    u64(1);  // kv
    u64(4);
    put("bomb", 4);
    u32(9);  // ARRAY
    u32(9);  // of ARRAY
    const uint64_t n = 3'000'000;
    u64(n);
    // Only the first nested arrays are present; the count alone must be refused
    // by the budget, not by running out of bytes (so make the file big enough
    // that the byte bound does not catch it first: 12 bytes per element).
    b.resize(b.size() + n * 12, 0);
    try {
        minfer::gguf::File::parse(b.data(), b.size(), "bomb.gguf");
        FAIL() << "expected an error";
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find("more than 256 MiB of memory once decoded"),
                  std::string::npos)
            << e.what();
    }
}
