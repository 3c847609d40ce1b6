#include "gguf/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "util/error.h"

namespace minfer::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr size_t kDefaultAlignment = 32;
// ggml has no nested arrays at all; we read them, but a file that nests
// deeper than this is an attack on the stack, not a model.
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;

bool is_valid_type(uint32_t t) {
    return t <= static_cast<uint32_t>(ValueType::FLOAT64);
}

// Bytes of one scalar element; 0 for STRING and ARRAY (variable length).
size_t scalar_size(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::BOOL:
            return 1;
        case ValueType::UINT16:
        case ValueType::INT16:
            return 2;
        case ValueType::UINT32:
        case ValueType::INT32:
        case ValueType::FLOAT32:
            return 4;
        case ValueType::UINT64:
        case ValueType::INT64:
        case ValueType::FLOAT64:
            return 8;
        case ValueType::STRING:
        case ValueType::ARRAY:
            return 0;
    }
    return 0;
}

// Fewest bytes one element of this type can take in the file: bounds a
// count against the bytes that remain before anything is reserved.
size_t min_encoded_size(ValueType t) {
    if (t == ValueType::STRING) return 8;  // u64 length, maybe no bytes
    if (t == ValueType::ARRAY) return 12;  // u32 type + u64 count
    return scalar_size(t);
}

bool is_unsigned(ValueType t) {
    return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 ||
           t == ValueType::UINT64 || t == ValueType::BOOL;
}
bool is_signed(ValueType t) {
    return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 ||
           t == ValueType::INT64;
}
bool is_float(ValueType t) {
    return t == ValueType::FLOAT32 || t == ValueType::FLOAT64;
}
bool is_integer(ValueType t) {
    return (is_unsigned(t) && t != ValueType::BOOL) || is_signed(t);
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
    return __builtin_mul_overflow(a, b, out);
}
bool checked_add(uint64_t a, uint64_t b, uint64_t* out) {
    return __builtin_add_overflow(a, b, out);
}

uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

// A bounds-checked little-endian cursor over the file. Every read checks the
// bytes that remain first; errors name the file and the byte offset.
class Cursor {
  public:
    Cursor(const uint8_t* data, size_t size, const std::string& source)
        : data_(data), size_(size), source_(source) {}

    size_t pos() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }

    // Decoded metadata takes more memory than its encoding (an 8-byte
    // string length becomes a 32-byte std::string, a 12-byte empty nested
    // array a whole Value), so a hostile file could make a small file cost
    // many GiB. Every array charges its decoded size here; real models use
    // a few tens of MiB (Qwen's 151k tokens and merges: ~15 MiB).
    static constexpr size_t kMetadataBudget = size_t{256} << 20;
    void charge(size_t count, size_t bytes_each, const std::string& what) {
        const size_t bytes =
            count > kMetadataBudget / bytes_each ? kMetadataBudget + 1 : count * bytes_each;
        decoded_ += bytes;
        if (bytes > kMetadataBudget || decoded_ > kMetadataBudget)
            fail(what + " at offset " + std::to_string(pos_) +
                 ": the metadata would take more than 256 MiB of memory once decoded");
    }

    [[noreturn]] void fail(const std::string& msg) const {
        throw Error("gguf: '" + source_ + "': " + msg);
    }

    void need(uint64_t n, const std::string& what) const {
        if (n > remaining())
            fail(what + " at offset " + std::to_string(pos_) + " needs " + std::to_string(n) +
                 " bytes, but the file ends at " + std::to_string(size_) + " bytes");
    }

    template <typename T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));  // little-endian host assumed (x86/ARM)
        pos_ += sizeof(T);
        return v;
    }

    // `index` >= 0 labels an array element; the label is only built on failure,
    // because token arrays hold ~150k strings.
    std::string read_string(const std::string& what, int64_t index = -1) {
        auto label = [&] { return index < 0 ? what : what + "[" + std::to_string(index) + "]"; };
        const size_t at = pos_;
        if (remaining() < sizeof(uint64_t)) need(sizeof(uint64_t), label() + " length");
        uint64_t len;
        std::memcpy(&len, data_ + pos_, sizeof len);
        pos_ += sizeof len;
        if (len > remaining())
            fail(label() + " at offset " + std::to_string(at) + " has length " +
                 std::to_string(len) + ", more than the " + std::to_string(remaining()) +
                 " bytes left in the file");
        std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
        pos_ += static_cast<size_t>(len);
        return s;
    }

  private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
    size_t decoded_ = 0;  // bytes charged by arrays so far
    const std::string& source_;
};

Value read_scalar(Cursor& c, ValueType t, const std::string& what) {
    Value v;
    v.type = t;
    switch (t) {
        case ValueType::UINT8:
            v.u64 = c.read<uint8_t>(what);
            break;
        case ValueType::INT8:
            v.i64 = c.read<int8_t>(what);
            break;
        case ValueType::UINT16:
            v.u64 = c.read<uint16_t>(what);
            break;
        case ValueType::INT16:
            v.i64 = c.read<int16_t>(what);
            break;
        case ValueType::UINT32:
            v.u64 = c.read<uint32_t>(what);
            break;
        case ValueType::INT32:
            v.i64 = c.read<int32_t>(what);
            break;
        case ValueType::FLOAT32:
            v.f64 = c.read<float>(what);
            break;
        case ValueType::UINT64:
            v.u64 = c.read<uint64_t>(what);
            break;
        case ValueType::INT64:
            v.i64 = c.read<int64_t>(what);
            break;
        case ValueType::FLOAT64:
            v.f64 = c.read<double>(what);
            break;
        case ValueType::BOOL: {
            const size_t at = c.pos();
            const uint8_t b = c.read<uint8_t>(what);
            if (b > 1)
                c.fail(what + " at offset " + std::to_string(at) + " is a bool of value " +
                       std::to_string(b) + " (must be 0 or 1)");
            v.u64 = b;
            break;
        }
        case ValueType::STRING:
            v.str = c.read_string(what);
            break;
        case ValueType::ARRAY:
            MINFER_ASSERT(false);
    }
    return v;
}

Value read_value(Cursor& c, ValueType t, const std::string& what, int depth);

Value read_array(Cursor& c, const std::string& what, int depth) {
    if (depth > kMaxArrayDepth)
        c.fail(what + " at offset " + std::to_string(c.pos()) + ": arrays nested deeper than " +
               std::to_string(kMaxArrayDepth) + " levels");
    const size_t at = c.pos();
    const uint32_t et = c.read<uint32_t>(what + " element type");
    if (!is_valid_type(et))
        c.fail(what + " at offset " + std::to_string(at) + " has invalid element type " +
               std::to_string(et));
    const uint64_t n = c.read<uint64_t>(what + " element count");
    Value v;
    v.type = ValueType::ARRAY;
    v.elem_type = static_cast<ValueType>(et);
    // Bound the count by the bytes left BEFORE reserving anything.
    const uint64_t min_size = min_encoded_size(v.elem_type);
    if (n > c.remaining() / min_size)
        c.fail(what + " at offset " + std::to_string(at) + " claims " + std::to_string(n) +
               " elements of type " + std::string(value_type_name(v.elem_type)) +
               ", more than the " + std::to_string(c.remaining()) +
               " bytes left in the file can hold");
    const size_t count = static_cast<size_t>(n);
    const size_t each = v.elem_type == ValueType::STRING  ? sizeof(std::string)
                        : v.elem_type == ValueType::ARRAY ? sizeof(Value)
                        : is_float(v.elem_type)           ? sizeof(double)
                                                          : sizeof(int64_t);
    c.charge(count, each, what);
    if (v.elem_type == ValueType::STRING) {
        v.arr_str.reserve(count);
        for (size_t i = 0; i < count; ++i)
            v.arr_str.push_back(c.read_string(what, static_cast<int64_t>(i)));
    } else if (v.elem_type == ValueType::ARRAY) {
        v.arr_nested.reserve(count);
        for (size_t i = 0; i < count; ++i)
            v.arr_nested.push_back(read_array(c, what + "[" + std::to_string(i) + "]", depth + 1));
    } else if (is_float(v.elem_type)) {
        v.arr_float.reserve(count);
        for (size_t i = 0; i < count; ++i)
            v.arr_float.push_back(read_scalar(c, v.elem_type, what).f64);
    } else {
        v.arr_int.reserve(count);
        for (size_t i = 0; i < count; ++i) {
            Value e = read_scalar(c, v.elem_type, what);
            // UINT64 above INT64_MAX is kept bit-for-bit (two's complement).
            v.arr_int.push_back(is_signed(v.elem_type) ? e.i64 : static_cast<int64_t>(e.u64));
        }
    }
    return v;
}

Value read_value(Cursor& c, ValueType t, const std::string& what, int depth) {
    if (t == ValueType::ARRAY) return read_array(c, what, depth + 1);
    return read_scalar(c, t, what);
}

std::string type_mismatch(std::string_view key, const Value& v, const char* wanted) {
    std::string have(value_type_name(v.type));
    if (v.type == ValueType::ARRAY) have += " of " + std::string(value_type_name(v.elem_type));
    return "gguf: key '" + std::string(key) + "' has type " + have + ", expected " + wanted;
}

// ---- writer helpers --------------------------------------------------------

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}

void put_scalar_bits(std::vector<uint8_t>& out, ValueType t, uint64_t u, int64_t i, double f) {
    switch (t) {
        case ValueType::UINT8:
            put<uint8_t>(out, static_cast<uint8_t>(u));
            break;
        case ValueType::INT8:
            put<int8_t>(out, static_cast<int8_t>(i));
            break;
        case ValueType::UINT16:
            put<uint16_t>(out, static_cast<uint16_t>(u));
            break;
        case ValueType::INT16:
            put<int16_t>(out, static_cast<int16_t>(i));
            break;
        case ValueType::UINT32:
            put<uint32_t>(out, static_cast<uint32_t>(u));
            break;
        case ValueType::INT32:
            put<int32_t>(out, static_cast<int32_t>(i));
            break;
        case ValueType::FLOAT32:
            put<float>(out, static_cast<float>(f));
            break;
        case ValueType::BOOL:
            put<uint8_t>(out, u ? 1 : 0);
            break;
        case ValueType::UINT64:
            put<uint64_t>(out, u);
            break;
        case ValueType::INT64:
            put<int64_t>(out, i);
            break;
        case ValueType::FLOAT64:
            put<double>(out, f);
            break;
        case ValueType::STRING:
        case ValueType::ARRAY:
            MINFER_ASSERT(false);
    }
}

void put_array(std::vector<uint8_t>& out, const Value& v) {
    put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
    put<uint64_t>(out, v.array_size());
    if (v.elem_type == ValueType::STRING) {
        for (const auto& s : v.arr_str) put_string(out, s);
    } else if (v.elem_type == ValueType::ARRAY) {
        for (const auto& e : v.arr_nested) {
            MINFER_ASSERT(e.type == ValueType::ARRAY);
            put_array(out, e);
        }
    } else if (is_float(v.elem_type)) {
        for (double f : v.arr_float) put_scalar_bits(out, v.elem_type, 0, 0, f);
    } else {
        for (int64_t x : v.arr_int)
            put_scalar_bits(out, v.elem_type, static_cast<uint64_t>(x), x, 0);
    }
}

void put_value(std::vector<uint8_t>& out, const Value& v) {
    if (v.type == ValueType::STRING) {
        put_string(out, v.str);
    } else if (v.type == ValueType::ARRAY) {
        put_array(out, v);
    } else {
        put_scalar_bits(out, v.type, v.u64, v.i64, v.f64);
    }
}

bool valid_alignment(uint64_t a) {
    return a != 0 && (a & (a - 1)) == 0;
}

}  // namespace

std::string_view value_type_name(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
            return "u8";
        case ValueType::INT8:
            return "i8";
        case ValueType::UINT16:
            return "u16";
        case ValueType::INT16:
            return "i16";
        case ValueType::UINT32:
            return "u32";
        case ValueType::INT32:
            return "i32";
        case ValueType::FLOAT32:
            return "f32";
        case ValueType::BOOL:
            return "bool";
        case ValueType::STRING:
            return "str";
        case ValueType::ARRAY:
            return "arr";
        case ValueType::UINT64:
            return "u64";
        case ValueType::INT64:
            return "i64";
        case ValueType::FLOAT64:
            return "f64";
    }
    return "?";
}

size_t Value::array_size() const {
    if (type != ValueType::ARRAY) return 0;
    if (elem_type == ValueType::STRING) return arr_str.size();
    if (elem_type == ValueType::ARRAY) return arr_nested.size();
    if (is_float(elem_type)) return arr_float.size();
    return arr_int.size();
}

tensor::TensorView TensorInfo::view() const {
    tensor::TensorView v;
    v.name = name;
    v.type = type;
    v.ne = ne;
    v.data = data;
    v.nbytes = nbytes;
    return v;
}

// ---- File ------------------------------------------------------------------

File File::open(const std::string& path) {
    auto map = std::make_shared<MappedFile>(path);  // names the path on failure
    File f;
    f.map_ = map;
    f.source_ = path;
    f.base_ = map->data();
    f.size_ = map->size();
    f.parse_all();
    // Everything before the tensor data (the vocabulary is most of it) is
    // decoded into the File's own strings and arrays: its pages can go.
    f.release(f.base_, f.data_offset_);
    return f;
}

File File::parse(const uint8_t* data, size_t size, std::string source_name) {
    File f;
    f.source_ = std::move(source_name);
    f.base_ = data;
    f.size_ = size;
    f.parse_all();
    return f;
}

void File::parse_all() {
    Cursor c(base_, size_, source_);
    if (size_ == 0) c.fail("empty file (0 bytes), not a GGUF model");
    if (size_ < 4) c.fail("file of " + std::to_string(size_) + " bytes is too short to be GGUF");

    const uint32_t magic = c.read<uint32_t>("magic");
    if (magic != kMagic) {
        char shown[5] = {};
        std::memcpy(shown, base_, 4);
        for (char& ch : shown)
            if (ch && (ch < 32 || ch > 126)) ch = '?';
        c.fail("bad magic '" + std::string(shown, 4) + "' (expected 'GGUF'): not a GGUF file");
    }
    version_ = c.read<uint32_t>("version");
    if (version_ == 1)
        c.fail(
            "GGUF version 1 is not supported (it predates 64-bit counts); re-convert the model "
            "with a current llama.cpp");
    if (version_ != 2 && version_ != 3)
        c.fail("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");

    const uint64_t n_tensors = c.read<uint64_t>("tensor count");
    const uint64_t n_kv = c.read<uint64_t>("metadata count");
    // Smallest possible entries: a key-value is 8 (key length) + 4 (type) +
    // 1 (value); a tensor info is 8 (name length) + 4 + 8 (one dim) + 4 + 8.
    if (n_kv > c.remaining() / 13)
        c.fail("header claims " + std::to_string(n_kv) + " metadata entries, more than the " +
               std::to_string(c.remaining()) +
               " bytes left in the file can hold (is it truncated?)");
    if (n_tensors > c.remaining() / 32)
        c.fail("header claims " + std::to_string(n_tensors) + " tensors, more than the " +
               std::to_string(c.remaining()) +
               " bytes left in the file can hold (is it truncated?)");

    kv_.reserve(static_cast<size_t>(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        const size_t at = c.pos();
        std::string key = c.read_string("key of metadata entry " + std::to_string(i));
        if (kv_index_.count(key))
            c.fail("duplicate metadata key '" + key + "' at offset " + std::to_string(at));
        const std::string what = "key '" + key + "'";
        const size_t type_at = c.pos();
        const uint32_t t = c.read<uint32_t>(what + " value type");
        if (!is_valid_type(t))
            c.fail(what + " has invalid value type " + std::to_string(t) + " at offset " +
                   std::to_string(type_at));
        Value v = read_value(c, static_cast<ValueType>(t), what, 0);
        kv_index_.emplace(key, kv_.size());
        kv_.push_back({std::move(key), std::move(v)});
    }

    alignment_ = kDefaultAlignment;
    if (const Value* a = find("general.alignment")) {
        if (a->type != ValueType::UINT32)
            c.fail("key 'general.alignment' has type " + std::string(value_type_name(a->type)) +
                   ", expected u32");
        if (!valid_alignment(a->u64))
            c.fail("key 'general.alignment' is " + std::to_string(a->u64) +
                   ", not a nonzero power of two");
        alignment_ = static_cast<size_t>(a->u64);
    }

    tensors_.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        TensorInfo ti;
        const size_t at = c.pos();
        ti.name = c.read_string("name of tensor " + std::to_string(i));
        if (tensor_index_.count(ti.name))
            c.fail("duplicate tensor name '" + ti.name + "' at offset " + std::to_string(at));
        const std::string what = "tensor '" + ti.name + "'";
        ti.n_dims = c.read<uint32_t>(what + " n_dims");
        if (ti.n_dims < 1 || ti.n_dims > kMaxDims)
            c.fail(what + " has " + std::to_string(ti.n_dims) + " dimensions (must be 1 to 4)");
        uint64_t n_elements = 1;
        for (uint32_t d = 0; d < ti.n_dims; ++d) {
            const uint64_t ne = c.read<uint64_t>(what + " ne[" + std::to_string(d) + "]");
            // ggml stores ne as int64 and allows 0 (an empty tensor); anything
            // above INT64_MAX is a negative size.
            if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                c.fail(what + " ne[" + std::to_string(d) + "] = " + std::to_string(ne) +
                       " is out of range");
            ti.ne[d] = static_cast<int64_t>(ne);
            if (checked_mul(n_elements, ne, &n_elements) ||
                n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                c.fail(what + " has too many elements: the product of its dimensions overflows");
        }
        const size_t type_at = c.pos();
        const uint32_t type_id = c.read<uint32_t>(what + " type");
        const tensor::DTypeTraits* tr = tensor::dtype_traits(type_id);
        if (!tr)
            c.fail(what + " has unknown or unsupported tensor type id " + std::to_string(type_id) +
                   " at offset " + std::to_string(type_at));
        ti.type = tr->type;
        if (ti.ne[0] % tr->block_size != 0)
            c.fail(what + " of type " + std::string(tr->name) + " has rows of " +
                   std::to_string(ti.ne[0]) + " elements, not a multiple of the block size " +
                   std::to_string(tr->block_size));
        // nbytes = (ne0 / block) * type_size * rows, every step checked.
        uint64_t nbytes = static_cast<uint64_t>(ti.ne[0] / tr->block_size);
        bool overflow = checked_mul(nbytes, tr->type_size, &nbytes);
        for (uint32_t d = 1; d < kMaxDims; ++d)
            overflow = overflow || checked_mul(nbytes, static_cast<uint64_t>(ti.ne[d]), &nbytes);
        if (overflow || nbytes > std::numeric_limits<size_t>::max())
            c.fail(what + " byte size overflows");
        ti.nbytes = static_cast<size_t>(nbytes);
        ti.offset = c.read<uint64_t>(what + " data offset");
        if (ti.offset % alignment_ != 0)
            c.fail(what + " data offset " + std::to_string(ti.offset) +
                   " is not a multiple of the alignment " + std::to_string(alignment_));
        tensor_index_.emplace(ti.name, tensors_.size());
        tensors_.push_back(std::move(ti));
    }

    data_offset_ = static_cast<size_t>(align_up(c.pos(), alignment_));
    const uint64_t data_size = size_ > data_offset_ ? size_ - data_offset_ : 0;
    for (auto& ti : tensors_) {
        uint64_t end = 0;
        if (checked_add(ti.offset, ti.nbytes, &end) || end > data_size) {
            uint64_t abs = 0;
            const std::string where = checked_add(data_offset_, ti.offset, &abs)
                                          ? "data offset " + std::to_string(ti.offset)
                                          : "offset " + std::to_string(abs);
            c.fail("tensor '" + ti.name + "': data [" + where + ", " + std::to_string(ti.nbytes) +
                   " bytes] runs past the end of the file (" + std::to_string(size_) + " bytes)");
        }
        ti.data = ti.nbytes ? base_ + data_offset_ + ti.offset : nullptr;
    }

    // No two tensors may share bytes (empty tensors occupy none).
    std::vector<const TensorInfo*> by_offset;
    for (const auto& ti : tensors_)
        if (ti.nbytes) by_offset.push_back(&ti);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const TensorInfo* a = by_offset[i - 1];
        const TensorInfo* b = by_offset[i];
        if (a->offset + a->nbytes > b->offset)
            c.fail("tensor '" + b->name + "' [data offset " + std::to_string(b->offset) +
                   "] overlaps tensor '" + a->name + "' [data offset " + std::to_string(a->offset) +
                   ", " + std::to_string(a->nbytes) + " bytes]");
    }
}

const Value* File::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void File::release(const void* p, size_t n) const {
    if (map_) map_->release(p, n);
}

std::optional<std::string> File::get_string(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != ValueType::STRING) throw Error(type_mismatch(key, *v, "a string"));
    return v->str;
}

std::optional<int64_t> File::get_int(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (is_signed(v->type)) return v->i64;
    if (is_integer(v->type)) {
        if (v->u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw Error("gguf: key '" + std::string(key) + "' value " + std::to_string(v->u64) +
                        " is too large");
        return static_cast<int64_t>(v->u64);
    }
    throw Error(type_mismatch(key, *v, "an integer"));
}

std::optional<double> File::get_float(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (is_float(v->type)) return v->f64;
    if (is_signed(v->type)) return static_cast<double>(v->i64);
    if (is_integer(v->type)) return static_cast<double>(v->u64);
    throw Error(type_mismatch(key, *v, "a number"));
}

std::optional<bool> File::get_bool(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return std::nullopt;
    if (v->type != ValueType::BOOL) throw Error(type_mismatch(key, *v, "a bool"));
    return v->u64 != 0;
}

const std::vector<std::string>* File::get_string_array(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return nullptr;
    if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING)
        throw Error(type_mismatch(key, *v, "an array of strings"));
    return &v->arr_str;
}

const std::vector<int64_t>* File::get_int_array(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return nullptr;
    if (v->type != ValueType::ARRAY ||
        !(is_integer(v->elem_type) || v->elem_type == ValueType::BOOL))
        throw Error(type_mismatch(key, *v, "an array of integers"));
    return &v->arr_int;
}

const std::vector<double>* File::get_float_array(std::string_view key) const {
    const Value* v = find(key);
    if (!v) return nullptr;
    if (v->type != ValueType::ARRAY || !is_float(v->elem_type))
        throw Error(type_mismatch(key, *v, "an array of floats"));
    return &v->arr_float;
}

// ---- Writer ----------------------------------------------------------------

Value make_u32(uint32_t v) {
    Value x;
    x.type = ValueType::UINT32;
    x.u64 = v;
    return x;
}
Value make_i32(int32_t v) {
    Value x;
    x.type = ValueType::INT32;
    x.i64 = v;
    return x;
}
Value make_u64(uint64_t v) {
    Value x;
    x.type = ValueType::UINT64;
    x.u64 = v;
    return x;
}
Value make_f32(float v) {
    Value x;
    x.type = ValueType::FLOAT32;
    x.f64 = v;
    return x;
}
Value make_bool(bool v) {
    Value x;
    x.type = ValueType::BOOL;
    x.u64 = v ? 1 : 0;
    return x;
}
Value make_string(std::string v) {
    Value x;
    x.type = ValueType::STRING;
    x.str = std::move(v);
    return x;
}

void Writer::set_alignment(size_t a) {
    if (!valid_alignment(a))
        throw Error("gguf: alignment " + std::to_string(a) + " is not a nonzero power of two");
    alignment_ = a;
    auto it = std::find_if(kv_.begin(), kv_.end(),
                           [](const KeyValue& kv) { return kv.key == "general.alignment"; });
    if (a == kDefaultAlignment) {
        if (it != kv_.end()) kv_.erase(it);
    } else if (it != kv_.end()) {
        it->value = make_u32(static_cast<uint32_t>(a));
    } else {
        kv_.push_back({"general.alignment", make_u32(static_cast<uint32_t>(a))});
    }
}

void Writer::set(std::string key, Value v) {
    if (key == "general.alignment") {
        if (v.type != ValueType::UINT32) throw Error("gguf: key 'general.alignment' must be a u32");
        set_alignment(static_cast<size_t>(v.u64));
        return;
    }
    for (auto& kv : kv_) {
        if (kv.key == key) {
            kv.value = std::move(v);
            return;
        }
    }
    kv_.push_back({std::move(key), std::move(v)});
}

void Writer::set_u32(std::string key, uint32_t v) {
    set(std::move(key), make_u32(v));
}
void Writer::set_i32(std::string key, int32_t v) {
    set(std::move(key), make_i32(v));
}
void Writer::set_u64(std::string key, uint64_t v) {
    set(std::move(key), make_u64(v));
}
void Writer::set_f32(std::string key, float v) {
    set(std::move(key), make_f32(v));
}
void Writer::set_bool(std::string key, bool v) {
    set(std::move(key), make_bool(v));
}
void Writer::set_string(std::string key, std::string v) {
    set(std::move(key), make_string(std::move(v)));
}

void Writer::set_string_array(std::string key, std::vector<std::string> v) {
    Value x;
    x.type = ValueType::ARRAY;
    x.elem_type = ValueType::STRING;
    x.arr_str = std::move(v);
    set(std::move(key), std::move(x));
}

void Writer::set_i32_array(std::string key, const std::vector<int32_t>& v) {
    Value x;
    x.type = ValueType::ARRAY;
    x.elem_type = ValueType::INT32;
    x.arr_int.assign(v.begin(), v.end());
    set(std::move(key), std::move(x));
}

void Writer::set_f32_array(std::string key, const std::vector<float>& v) {
    Value x;
    x.type = ValueType::ARRAY;
    x.elem_type = ValueType::FLOAT32;
    x.arr_float.assign(v.begin(), v.end());
    set(std::move(key), std::move(x));
}

void Writer::copy_metadata(const File& f) {
    for (const auto& kv : f.metadata())
        if (kv.key != "general.alignment") set(kv.key, kv.value);
}

void Writer::add_tensor(std::string name, tensor::DType type, std::vector<int64_t> ne,
                        std::vector<uint8_t> data) {
    const std::string what = "gguf: tensor '" + name + "'";
    for (const auto& t : tensors_)
        if (t.name == name) throw Error(what + " added twice");
    if (ne.empty() || ne.size() > kMaxDims)
        throw Error(what + " has " + std::to_string(ne.size()) + " dimensions (must be 1 to 4)");
    const tensor::DTypeTraits& tr = tensor::traits(type);
    uint64_t rows = 1;
    for (size_t d = 0; d < ne.size(); ++d) {
        if (ne[d] < 0) throw Error(what + " has a negative dimension");
        if (d > 0 && checked_mul(rows, static_cast<uint64_t>(ne[d]), &rows))
            throw Error(what + " is too large");
    }
    if (ne[0] % tr.block_size != 0)
        throw Error(what + " row length " + std::to_string(ne[0]) +
                    " is not a multiple of the block size " + std::to_string(tr.block_size));
    uint64_t expected = 0;
    if (checked_mul(tensor::row_size(type, ne[0]), rows, &expected) || expected != data.size())
        throw Error(what + " has " + std::to_string(data.size()) + " bytes of data, expected " +
                    std::to_string(expected));
    tensors_.push_back({std::move(name), type, std::move(ne), std::move(data)});
}

std::vector<uint8_t> Writer::to_bytes() const {
    std::vector<uint8_t> out;
    put<uint32_t>(out, kMagic);
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, kv_.size());
    for (const auto& kv : kv_) {
        put_string(out, kv.key);
        put<uint32_t>(out, static_cast<uint32_t>(kv.value.type));
        put_value(out, kv.value);
    }
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
        put_string(out, t.name);
        put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
        for (int64_t n : t.ne) put<uint64_t>(out, static_cast<uint64_t>(n));
        put<uint32_t>(out, static_cast<uint32_t>(t.type));
        put<uint64_t>(out, offset);
        offset += align_up(t.data.size(), alignment_);
    }
    out.resize(align_up(out.size(), alignment_), 0);
    // Every tensor, the last included, is padded to the alignment, as ggml
    // does: ggml's reader expects the padded data section size.
    for (const auto& t : tensors_) {
        out.insert(out.end(), t.data.begin(), t.data.end());
        out.resize(align_up(out.size(), alignment_), 0);
    }
    return out;
}

void Writer::write(const std::string& path) const {
    const std::vector<uint8_t> bytes = to_bytes();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error("gguf: cannot create '" + path + "': " + std::strerror(errno));
    const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), f);
    const bool ok = n == bytes.size() && std::fflush(f) == 0;
    const int e = errno;
    if (std::fclose(f) != 0 || !ok)
        throw Error("gguf: cannot write '" + path + "': " + std::strerror(ok ? errno : e));
}

}  // namespace minfer::gguf
