// GGUF v2/v3: a validated, read-only view over a memory-mapped file, and a
// writer that produces files the reader reads back bit-for-bit.
//
// Everything is validated before anything is used: lengths and counts against
// the bytes that remain, overflow in every size computation, tensor offsets
// and sizes inside the data section, alignment, known tensor types, row
// lengths that are a multiple of the type's block size, duplicate keys and
// tensor names. A bad file throws minfer::Error naming the key, tensor or
// byte offset at fault; nothing is read out of bounds.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor_view.h"
#include "util/mapped_file.h"

namespace minfer::gguf {

enum class ValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
std::string_view value_type_name(ValueType t);

// One metadata value. Scalars keep their exact type; every integer type is
// also readable as int64/uint64 through the File getters.
struct Value {
    ValueType type = ValueType::UINT8;
    // scalars
    uint64_t u64 = 0;  // unsigned integers and bool
    int64_t i64 = 0;   // signed integers
    double f64 = 0;    // FLOAT32 / FLOAT64
    std::string str;   // STRING
    // arrays: elem_type says which of the vectors holds the elements
    ValueType elem_type = ValueType::UINT8;
    std::vector<int64_t> arr_int;      // any integer or bool element type
    std::vector<double> arr_float;     // FLOAT32 / FLOAT64 elements
    std::vector<std::string> arr_str;  // STRING elements
    std::vector<Value> arr_nested;     // ARRAY elements (nested arrays)

    size_t array_size() const;
};

struct KeyValue {
    std::string key;
    Value value;
};

struct TensorInfo {
    std::string name;
    uint32_t n_dims = 0;
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    tensor::DType type = tensor::DType::F32;
    uint64_t offset = 0;  // relative to the data section
    size_t nbytes = 0;
    const uint8_t* data = nullptr;  // inside the mapped file

    tensor::TensorView view() const;
};

class File {
  public:
    // Maps and validates `path`. Throws minfer::Error.
    static File open(const std::string& path);
    // Validates a buffer that the caller keeps alive (fuzzing, tests).
    static File parse(const uint8_t* data, size_t size, std::string source_name = "<memory>");

    const std::string& path() const { return source_; }
    uint32_t version() const { return version_; }
    size_t alignment() const { return alignment_; }
    size_t file_size() const { return size_; }
    size_t data_offset() const { return data_offset_; }

    const std::vector<KeyValue>& metadata() const { return kv_; }
    const Value* find(std::string_view key) const;

    // Typed getters: std::nullopt when the key is absent; minfer::Error
    // naming the key when present with an incompatible type.
    std::optional<std::string> get_string(std::string_view key) const;
    std::optional<int64_t> get_int(std::string_view key) const;   // any integer type
    std::optional<double> get_float(std::string_view key) const;  // float or integer types
    std::optional<bool> get_bool(std::string_view key) const;
    // Arrays: nullptr when absent; Error when present with another element type.
    const std::vector<std::string>* get_string_array(std::string_view key) const;
    const std::vector<int64_t>* get_int_array(std::string_view key) const;
    const std::vector<double>* get_float_array(std::string_view key) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;

    // For a mapped file, drops the pages of [p, p + n) from resident memory
    // (MappedFile::release); for a parsed buffer, nothing.
    void release(const void* p, size_t n) const;

  private:
    std::shared_ptr<MappedFile> map_;  // null for parse()
    std::string source_;
    const uint8_t* base_ = nullptr;
    size_t size_ = 0;
    uint32_t version_ = 0;
    size_t alignment_ = 32;
    size_t data_offset_ = 0;
    std::vector<KeyValue> kv_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;

    void parse_all();
};

// Builds a GGUF v3 file in memory and writes it. Keys and tensors are written
// in the order they were added; tensor data is padded to the alignment.
class Writer {
  public:
    void set_alignment(size_t a);        // writes general.alignment when != 32
    void set(std::string key, Value v);  // replaces an existing key in place
    void set_u32(std::string key, uint32_t v);
    void set_i32(std::string key, int32_t v);
    void set_u64(std::string key, uint64_t v);
    void set_f32(std::string key, float v);
    void set_bool(std::string key, bool v);
    void set_string(std::string key, std::string v);
    void set_string_array(std::string key, std::vector<std::string> v);
    void set_i32_array(std::string key, const std::vector<int32_t>& v);
    void set_f32_array(std::string key, const std::vector<float>& v);
    // Copies every key of `f` (except general.alignment, which follows
    // set_alignment) — how quantize carries metadata over.
    void copy_metadata(const File& f);

    // `data` must hold exactly row_size(type, ne[0]) * rows bytes.
    void add_tensor(std::string name, tensor::DType type, std::vector<int64_t> ne,
                    std::vector<uint8_t> data);

    std::vector<uint8_t> to_bytes() const;
    void write(const std::string& path) const;  // throws Error on I/O failure

  private:
    struct PendingTensor {
        std::string name;
        tensor::DType type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> data;
    };
    size_t alignment_ = 32;
    std::vector<KeyValue> kv_;
    std::vector<PendingTensor> tensors_;
};

// Convenience for Value construction.
Value make_u32(uint32_t v);
Value make_i32(int32_t v);
Value make_u64(uint64_t v);
Value make_f32(float v);
Value make_bool(bool v);
Value make_string(std::string v);

}  // namespace minfer::gguf
