#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "base/checked_math.h"
#include "gguf/gguf.h"

namespace metro::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::kU8: return "u8";
    case ValueType::kI8: return "i8";
    case ValueType::kU16: return "u16";
    case ValueType::kI16: return "i16";
    case ValueType::kU32: return "u32";
    case ValueType::kI32: return "i32";
    case ValueType::kF32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kU64: return "u64";
    case ValueType::kI64: return "i64";
    case ValueType::kF64: return "f64";
  }
  return "unknown";
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool: return 1;
    case ValueType::kU16:
    case ValueType::kI16: return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32: return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64: return 8;
    case ValueType::kString:
    case ValueType::kArray: return 0;
  }
  return 0;
}

namespace {

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kF64); }

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;  // x86-64 and aarch64-le only; big-endian hosts are not supported
}

// Decodes a fixed-size scalar at p into a Value's numeric slot.
void decode_scalar(ValueType t, const uint8_t* p, uint64_t* u, int64_t* i, double* f) {
  switch (t) {
    case ValueType::kU8: *u = load_le<uint8_t>(p); break;
    case ValueType::kI8: *i = load_le<int8_t>(p); break;
    case ValueType::kU16: *u = load_le<uint16_t>(p); break;
    case ValueType::kI16: *i = load_le<int16_t>(p); break;
    case ValueType::kU32: *u = load_le<uint32_t>(p); break;
    case ValueType::kI32: *i = load_le<int32_t>(p); break;
    case ValueType::kF32: *f = load_le<float>(p); break;
    case ValueType::kBool: *u = load_le<uint8_t>(p); break;
    case ValueType::kU64: *u = load_le<uint64_t>(p); break;
    case ValueType::kI64: *i = load_le<int64_t>(p); break;
    case ValueType::kF64: *f = load_le<double>(p); break;
    case ValueType::kString:
    case ValueType::kArray: break;
  }
}

bool is_signed_type(ValueType t) {
  return t == ValueType::kI8 || t == ValueType::kI16 || t == ValueType::kI32 ||
         t == ValueType::kI64;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Value

bool Value::is_integer() const {
  switch (type_) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kU16:
    case ValueType::kI16:
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kU64:
    case ValueType::kI64: return true;
    default: return false;
  }
}

std::optional<int64_t> Value::as_int() const {
  if (!is_integer()) return std::nullopt;
  if (is_signed_type(type_)) return num_.i;
  if (num_.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(num_.u);
}

std::optional<uint64_t> Value::as_uint() const {
  if (!is_integer()) return std::nullopt;
  if (is_signed_type(type_)) {
    if (num_.i < 0) return std::nullopt;
    return static_cast<uint64_t>(num_.i);
  }
  return num_.u;
}

std::optional<double> Value::as_double() const {
  if (is_float()) return num_.f;
  if (is_integer()) {
    return is_signed_type(type_) ? static_cast<double>(num_.i) : static_cast<double>(num_.u);
  }
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (type_ != ValueType::kBool) return std::nullopt;
  return num_.u != 0;
}

std::optional<std::string_view> Value::as_string() const {
  if (type_ != ValueType::kString) return std::nullopt;
  return str_;
}

Value Value::array_at(size_t i) const {
  METRO_CHECK(is_array() && i < count_);
  if (elem_type_ == ValueType::kArray) return items_[i];
  Value v;
  v.type_ = elem_type_;
  if (elem_type_ == ValueType::kString) {
    v.str_ = strings_[i];
  } else {
    decode_scalar(elem_type_, raw_ + i * scalar_size(elem_type_), &v.num_.u, &v.num_.i,
                  &v.num_.f);
  }
  return v;
}

std::string Value::to_display_string(size_t max_items) const {
  switch (type_) {
    case ValueType::kString: {
      std::string s = "\"";
      size_t n = std::min<size_t>(str_.size(), 120);
      for (size_t k = 0; k < n; ++k) {
        unsigned char c = static_cast<unsigned char>(str_[k]);
        if (c == '\n') {
          s += "\\n";
        } else if (c < 0x20 || c == 0x7f) {
          s += '?';
        } else {
          s += static_cast<char>(c);
        }
      }
      if (n < str_.size()) s += "...";
      return s + "\"";
    }
    case ValueType::kBool: return num_.u ? "true" : "false";
    case ValueType::kF32:
    case ValueType::kF64: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", num_.f);
      return buf;
    }
    case ValueType::kArray: {
      std::string s = "[";
      for (size_t k = 0; k < count_ && k < max_items; ++k) {
        if (k) s += ", ";
        s += array_at(k).to_display_string(max_items);
      }
      if (count_ > max_items) s += ", ... (" + std::to_string(count_) + " items)";
      return s + "]";
    }
    default:
      return is_signed_type(type_) ? std::to_string(num_.i) : std::to_string(num_.u);
  }
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (uint32_t d = 0; d < n_dims; ++d) {
    if (d) s += ", ";
    s += std::to_string(ne[d]);
  }
  return s + "]";
}

// ---------------------------------------------------------------------------------------
// Parser: a cursor over the bytes that fails with the offset of the first bad read.

class Parser {
 public:
  explicit Parser(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  Status parse(File* file);

 private:
  size_t remaining() const { return bytes_.size() - pos_; }

  Status truncated(std::string_view what, size_t need) const {
    return data_loss("truncated GGUF: " + std::string(what) + " at offset " +
                     std::to_string(pos_) + " needs " + std::to_string(need) +
                     " bytes, the file has " + std::to_string(remaining()) + " left");
  }

  template <class T>
  Status read(T* out, std::string_view what) {
    if (remaining() < sizeof(T)) return truncated(what, sizeof(T));
    *out = load_le<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return {};
  }

  Status read_string(std::string_view* out, std::string_view what) {
    uint64_t len = 0;
    METRO_RETURN_IF_ERROR(read(&len, what));
    if (len > remaining()) {
      return data_loss("GGUF " + std::string(what) + " at offset " + std::to_string(pos_ - 8) +
                       " claims " + std::to_string(len) + " bytes, only " +
                       std::to_string(remaining()) + " remain");
    }
    *out = std::string_view(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return {};
  }

  Status read_value(ValueType type, Value* v, uint32_t depth, std::string_view key);
  Status read_tensor_info(TensorInfo* t, size_t index);

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

Status Parser::read_value(ValueType type, Value* v, uint32_t depth, std::string_view key) {
  v->type_ = type;
  if (type == ValueType::kString) return read_string(&v->str_, "string value");
  if (type != ValueType::kArray) {
    size_t n = scalar_size(type);
    if (remaining() < n) return truncated("value of key '" + std::string(key) + "'", n);
    decode_scalar(type, bytes_.data() + pos_, &v->num_.u, &v->num_.i, &v->num_.f);
    pos_ += n;
    return {};
  }
  if (depth >= kMaxArrayNesting) {
    return data_loss("GGUF array of key '" + std::string(key) + "' nests deeper than " +
                     std::to_string(kMaxArrayNesting) + " levels at offset " +
                     std::to_string(pos_));
  }
  uint32_t elem = 0;
  uint64_t count = 0;
  METRO_RETURN_IF_ERROR(read(&elem, "array element type"));
  if (!valid_value_type(elem)) {
    return data_loss("GGUF array of key '" + std::string(key) + "' has unknown element type " +
                     std::to_string(elem) + " at offset " + std::to_string(pos_ - 4));
  }
  METRO_RETURN_IF_ERROR(read(&count, "array length"));
  v->elem_type_ = static_cast<ValueType>(elem);
  // Every element takes at least this many bytes: refuse counts the file cannot hold before
  // allocating anything for them.
  size_t min_elem = scalar_size(v->elem_type_);
  if (v->elem_type_ == ValueType::kString) min_elem = 8;
  if (v->elem_type_ == ValueType::kArray) min_elem = 12;
  auto need = checked_mul(count, min_elem);
  if (!need || *need > remaining()) {
    return data_loss("GGUF array of key '" + std::string(key) + "' at offset " +
                     std::to_string(pos_ - 12) + " claims " + std::to_string(count) +
                     " elements of type " + std::string(value_type_name(v->elem_type_)) +
                     ", more than the " + std::to_string(remaining()) + " bytes left can hold");
  }
  v->count_ = count;
  if (v->elem_type_ == ValueType::kString) {
    v->strings_.resize(count);
    for (uint64_t k = 0; k < count; ++k) {
      METRO_RETURN_IF_ERROR(read_string(&v->strings_[k], "array string"));
    }
  } else if (v->elem_type_ == ValueType::kArray) {
    v->items_.resize(count);
    for (uint64_t k = 0; k < count; ++k) {
      METRO_RETURN_IF_ERROR(read_value(ValueType::kArray, &v->items_[k], depth + 1, key));
    }
  } else {
    v->raw_ = bytes_.data() + pos_;
    pos_ += *need;
  }
  return {};
}

Status Parser::read_tensor_info(TensorInfo* t, size_t index) {
  const size_t start = pos_;
  METRO_RETURN_IF_ERROR(read_string(&t->name, "tensor name"));
  const std::string label = "tensor #" + std::to_string(index) + " ('" +
                            std::string(t->name.substr(0, 80)) + "') at offset " +
                            std::to_string(start);
  if (t->name.empty()) return data_loss("GGUF " + label + " has an empty name");
  if (t->name.size() > kMaxTensorNameBytes) {
    return data_loss("GGUF " + label + " has a name longer than " +
                     std::to_string(kMaxTensorNameBytes) + " bytes");
  }
  METRO_RETURN_IF_ERROR(read(&t->n_dims, "tensor dimension count"));
  if (t->n_dims == 0 || t->n_dims > kMaxDims) {
    return data_loss("GGUF " + label + " has " + std::to_string(t->n_dims) +
                     " dimensions (1 to " + std::to_string(kMaxDims) + " allowed)");
  }
  uint64_t n_elem = 1;
  for (uint32_t d = 0; d < t->n_dims; ++d) {
    METRO_RETURN_IF_ERROR(read(&t->ne[d], "tensor dimension"));
    if (t->ne[d] == 0) return data_loss("GGUF " + label + " has a zero dimension");
    auto p = checked_mul(n_elem, t->ne[d]);
    if (!p || *p > (uint64_t{1} << 62)) {
      return data_loss("GGUF " + label + " has dimensions " + t->shape_string() +
                       " whose element count overflows");
    }
    n_elem = *p;
  }
  t->n_elements = n_elem;
  METRO_RETURN_IF_ERROR(read(&t->type_id, "tensor type"));
  auto info = ggml_type_info(t->type_id);
  if (!info) {
    return data_loss("GGUF " + label + " has unknown tensor type id " +
                     std::to_string(t->type_id));
  }
  t->type_info = *info;
  if (t->ne[0] % info->block_size != 0) {
    return data_loss("GGUF " + label + " of type " + std::string(info->name) +
                     " has a row length " + std::to_string(t->ne[0]) +
                     " that is not a multiple of its block size " +
                     std::to_string(info->block_size));
  }
  auto bytes = checked_mul(n_elem / info->block_size, info->bytes_per_block);
  if (!bytes) return data_loss("GGUF " + label + " byte size overflows");
  t->n_bytes = *bytes;
  METRO_RETURN_IF_ERROR(read(&t->offset, "tensor data offset"));
  return {};
}

Status Parser::parse(File* f) {
  uint32_t magic = 0;
  METRO_RETURN_IF_ERROR(read(&magic, "magic"));
  if (magic != kMagic) {
    return data_loss("not a GGUF file: bad magic at offset 0 (expected \"GGUF\")");
  }
  uint32_t version = 0;
  METRO_RETURN_IF_ERROR(read(&version, "version"));
  if (version != 2 && version != 3) {
    uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3) {
      return unimplemented("big-endian GGUF file (version field at offset 4 is byte-swapped); "
                           "metro reads little-endian GGUF only");
    }
    if (version == 1) {
      return unimplemented("GGUF version 1 at offset 4 is not supported (versions 2 and 3 are)");
    }
    return data_loss("unsupported GGUF version " + std::to_string(version) +
                     " at offset 4 (versions 2 and 3 are supported)");
  }
  f->version_ = version;
  uint64_t n_tensors = 0, n_kv = 0;
  METRO_RETURN_IF_ERROR(read(&n_tensors, "tensor count"));
  METRO_RETURN_IF_ERROR(read(&n_kv, "metadata count"));
  // A metadata entry is at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 + 1 + 4 + 8 + 4 + 8 bytes. Refuse counts the file cannot hold.
  auto kv_min = checked_mul(n_kv, 13);
  if (!kv_min || *kv_min > remaining()) {
    return data_loss("GGUF header at offset 16 claims " + std::to_string(n_kv) +
                     " metadata entries, more than the file can hold");
  }
  auto t_min = checked_mul(n_tensors, 33);
  if (!t_min || *t_min > remaining()) {
    return data_loss("GGUF header at offset 8 claims " + std::to_string(n_tensors) +
                     " tensors, more than the file can hold");
  }

  f->kv_.resize(n_kv);
  f->kv_index_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const size_t start = pos_;
    KeyValue& kv = f->kv_[k];
    METRO_RETURN_IF_ERROR(read_string(&kv.key, "metadata key"));
    if (kv.key.empty()) {
      return data_loss("GGUF metadata entry #" + std::to_string(k) + " at offset " +
                       std::to_string(start) + " has an empty key");
    }
    uint32_t type = 0;
    METRO_RETURN_IF_ERROR(read(&type, "metadata value type"));
    if (!valid_value_type(type)) {
      return data_loss("GGUF metadata key '" + std::string(kv.key.substr(0, 80)) +
                       "' at offset " + std::to_string(start) + " has unknown value type " +
                       std::to_string(type));
    }
    METRO_RETURN_IF_ERROR(read_value(static_cast<ValueType>(type), &kv.value, 0, kv.key));
    if (!f->kv_index_.emplace(kv.key, k).second) {
      return data_loss("GGUF metadata key '" + std::string(kv.key.substr(0, 80)) +
                       "' at offset " + std::to_string(start) + " appears twice");
    }
  }

  if (const Value* a = f->find("general.alignment")) {
    auto al = a->as_uint();
    if (a->type() != ValueType::kU32 || !al || !is_power_of_two(*al) || *al > (1u << 20)) {
      return data_loss("GGUF general.alignment must be a u32 power of two up to 1 MiB, found " +
                       std::string(value_type_name(a->type())) + " " + a->to_display_string());
    }
    f->alignment_ = *al;
  }

  f->tensors_.resize(n_tensors);
  f->tensor_index_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    METRO_RETURN_IF_ERROR(read_tensor_info(&f->tensors_[k], k));
    if (!f->tensor_index_.emplace(f->tensors_[k].name, k).second) {
      return data_loss("GGUF tensor name '" + std::string(f->tensors_[k].name.substr(0, 80)) +
                       "' appears twice");
    }
  }

  auto data_off = checked_align_up(pos_, f->alignment_);
  if (!data_off) return data_loss("GGUF data section offset overflows");
  if (n_tensors == 0) {
    f->data_offset_ = std::min<uint64_t>(*data_off, bytes_.size());
    return {};
  }
  if (*data_off > bytes_.size()) {
    return data_loss("truncated GGUF: the tensor data section should start at offset " +
                     std::to_string(*data_off) + " but the file ends at " +
                     std::to_string(bytes_.size()));
  }
  f->data_offset_ = *data_off;
  const uint64_t data_size = bytes_.size() - *data_off;

  std::vector<size_t> order(n_tensors);
  for (size_t k = 0; k < n_tensors; ++k) {
    TensorInfo& t = f->tensors_[k];
    order[k] = k;
    const std::string label = "GGUF tensor '" + std::string(t.name) + "'";
    if (t.offset % f->alignment_ != 0) {
      return data_loss(label + " data offset " + std::to_string(t.offset) +
                       " is not a multiple of the alignment " + std::to_string(f->alignment_));
    }
    auto end = checked_add(t.offset, t.n_bytes);
    if (!end || *end > data_size) {
      return data_loss(label + " data at file offset " + std::to_string(*data_off) + " + " +
                       std::to_string(t.offset) + " (" + std::to_string(t.n_bytes) +
                       " bytes) lies outside the data section of " + std::to_string(data_size) +
                       " bytes (file truncated?)");
    }
    t.data = bytes_.data() + *data_off + t.offset;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return f->tensors_[a].offset < f->tensors_[b].offset;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = f->tensors_[order[k - 1]];
    const TensorInfo& cur = f->tensors_[order[k]];
    if (prev.offset + prev.n_bytes > cur.offset) {
      return data_loss("GGUF tensors '" + std::string(prev.name) + "' and '" +
                       std::string(cur.name) + "' have overlapping data ranges");
    }
  }
  return {};
}

// ---------------------------------------------------------------------------------------
// File

Expected<File> File::parse(std::span<const uint8_t> bytes) {
  File f;
  f.bytes_ = bytes;
  Parser p(bytes);
  METRO_RETURN_IF_ERROR(p.parse(&f));
  return f;
}

Expected<File> File::open(const std::string& path) {
  METRO_ASSIGN_OR_RETURN(MappedFile map, MappedFile::open(path));
  auto shared = std::make_shared<MappedFile>(std::move(map));
  METRO_ASSIGN_OR_RETURN(File f, parse(shared->bytes()));
  f.map_ = std::move(shared);
  return f;
}

Expected<File> File::load(const std::string& path, const MappedFile::ReadOptions& options) {
  METRO_ASSIGN_OR_RETURN(MappedFile copy, MappedFile::read(path, options));
  auto shared = std::make_shared<MappedFile>(std::move(copy));
  METRO_ASSIGN_OR_RETURN(File f, parse(shared->bytes()));
  f.map_ = std::move(shared);
  return f;
}

Expected<File> File::copy_of(std::span<const uint8_t> bytes) {
  METRO_ASSIGN_OR_RETURN(MappedFile copy, MappedFile::copy_of(bytes));
  auto shared = std::make_shared<MappedFile>(std::move(copy));
  METRO_ASSIGN_OR_RETURN(File f, parse(shared->bytes()));
  f.map_ = std::move(shared);
  return f;
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Status missing(std::string_view key) {
  return not_found("metadata key '" + std::string(key) + "' is missing");
}
Status wrong(std::string_view key, const Value& v, std::string_view expected) {
  return invalid_argument("metadata key '" + std::string(key) + "' is " +
                          std::string(value_type_name(v.type())) + " " +
                          v.to_display_string(4) + ", expected " + std::string(expected));
}
}  // namespace

Expected<std::string_view> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  auto s = v->as_string();
  if (!s) return wrong(key, *v, "a string");
  return *s;
}

Expected<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  auto u = v->as_uint();
  if (!u) return wrong(key, *v, "a non-negative integer");
  return *u;
}

Expected<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  auto i = v->as_int();
  if (!i) return wrong(key, *v, "an integer");
  return *i;
}

Expected<uint32_t> File::get_u32(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  auto u = v->as_uint();
  if (!u || *u > std::numeric_limits<uint32_t>::max()) {
    return wrong(key, *v, "an integer in [0, 2^32)");
  }
  return static_cast<uint32_t>(*u);
}

Expected<double> File::get_double(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  auto d = v->as_double();
  if (!d) return wrong(key, *v, "a number");
  return *d;
}

Expected<float> File::get_f32(std::string_view key) const {
  METRO_ASSIGN_OR_RETURN(double d, get_double(key));
  return static_cast<float>(d);
}

Expected<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  auto b = v->as_bool();
  if (!b) return wrong(key, *v, "a bool");
  return *b;
}

Expected<std::span<const std::string_view>> File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (!v->is_array() || v->array_type() != ValueType::kString) {
    return wrong(key, *v, "an array of strings");
  }
  return v->strings();
}

Expected<std::vector<float>> File::get_f32_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (!v->is_array() || v->array_type() == ValueType::kString ||
      v->array_type() == ValueType::kArray) {
    return wrong(key, *v, "an array of numbers");
  }
  std::vector<float> out(v->array_size());
  for (size_t k = 0; k < out.size(); ++k) {
    auto d = v->array_at(k).as_double();
    if (!d) return wrong(key, *v, "an array of numbers");
    out[k] = static_cast<float>(*d);
  }
  return out;
}

Expected<std::vector<int64_t>> File::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (!v->is_array()) return wrong(key, *v, "an array of integers");
  std::vector<int64_t> out(v->array_size());
  for (size_t k = 0; k < out.size(); ++k) {
    auto i = v->array_at(k).as_int();
    if (!i) return wrong(key, *v, "an array of integers");
    out[k] = *i;
  }
  return out;
}

Expected<size_t> File::get_array_size(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return missing(key);
  if (!v->is_array()) return wrong(key, *v, "an array");
  return v->array_size();
}

}  // namespace metro::gguf
