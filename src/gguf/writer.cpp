#include "gguf/writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/check.h"
#include "base/checked_math.h"

namespace metro::gguf {

void Writer::set_alignment(uint32_t alignment) {
  METRO_CHECK(is_power_of_two(alignment));
  METRO_CHECK(!alignment_written_);
  alignment_ = alignment;
  add_u32("general.alignment", alignment);
  alignment_written_ = true;
}

void Writer::copy_metadata(const File& f, std::string_view skip) {
  for (const auto& kv : f.metadata()) {
    if (!skip.empty() && kv.key == skip) continue;
    if (kv.key == "general.alignment") {
      set_alignment(static_cast<uint32_t>(*kv.value.as_uint()));
      continue;
    }
    add_value(kv.key, kv.value);
  }
}

void Writer::add_string(std::string_view key, std::string_view v) {
  meta_.put_string(key);
  meta_.put<uint32_t>(static_cast<uint32_t>(ValueType::kString));
  meta_.put_string(v);
  ++n_kv_;
}

void Writer::add_string_array(std::string_view key, const std::vector<std::string>& v) {
  meta_.put_string(key);
  meta_.put<uint32_t>(static_cast<uint32_t>(ValueType::kArray));
  meta_.put<uint32_t>(static_cast<uint32_t>(ValueType::kString));
  meta_.put<uint64_t>(v.size());
  for (const auto& s : v) meta_.put_string(s);
  ++n_kv_;
}

void Writer::add_f32_array(std::string_view key, const std::vector<float>& v) {
  meta_.put_string(key);
  meta_.put<uint32_t>(static_cast<uint32_t>(ValueType::kArray));
  meta_.put<uint32_t>(static_cast<uint32_t>(ValueType::kF32));
  meta_.put<uint64_t>(v.size());
  for (float x : v) meta_.put<float>(x);
  ++n_kv_;
}

void Writer::add_i32_array(std::string_view key, const std::vector<int32_t>& v) {
  meta_.put_string(key);
  meta_.put<uint32_t>(static_cast<uint32_t>(ValueType::kArray));
  meta_.put<uint32_t>(static_cast<uint32_t>(ValueType::kI32));
  meta_.put<uint64_t>(v.size());
  for (int32_t x : v) meta_.put<int32_t>(x);
  ++n_kv_;
}

void Writer::add_raw(std::string_view key, ValueType type, std::span<const uint8_t> payload) {
  meta_.put_string(key);
  meta_.put<uint32_t>(static_cast<uint32_t>(type));
  meta_.put_bytes(payload);
  ++n_kv_;
}

namespace {

void encode_payload(Encoder& e, const Value& v) {
  switch (v.type()) {
    case ValueType::kU8: e.put<uint8_t>(static_cast<uint8_t>(*v.as_uint())); break;
    case ValueType::kI8: e.put<int8_t>(static_cast<int8_t>(*v.as_int())); break;
    case ValueType::kU16: e.put<uint16_t>(static_cast<uint16_t>(*v.as_uint())); break;
    case ValueType::kI16: e.put<int16_t>(static_cast<int16_t>(*v.as_int())); break;
    case ValueType::kU32: e.put<uint32_t>(static_cast<uint32_t>(*v.as_uint())); break;
    case ValueType::kI32: e.put<int32_t>(static_cast<int32_t>(*v.as_int())); break;
    case ValueType::kU64: e.put<uint64_t>(*v.as_uint()); break;
    case ValueType::kI64: e.put<int64_t>(*v.as_int()); break;
    case ValueType::kF32: e.put<float>(static_cast<float>(*v.as_double())); break;
    case ValueType::kF64: e.put<double>(*v.as_double()); break;
    case ValueType::kBool: e.put<uint8_t>(*v.as_bool() ? 1 : 0); break;
    case ValueType::kString: e.put_string(*v.as_string()); break;
    case ValueType::kArray:
      e.put<uint32_t>(static_cast<uint32_t>(v.array_type()));
      e.put<uint64_t>(v.array_size());
      if (v.array_type() == ValueType::kString) {
        for (std::string_view s : v.strings()) e.put_string(s);
      } else {
        for (size_t i = 0; i < v.array_size(); ++i) encode_payload(e, v.array_at(i));
      }
      break;
  }
}

}  // namespace

void Writer::add_value(std::string_view key, const Value& v) {
  Encoder payload;
  encode_payload(payload, v);
  add_raw(key, v.type(), payload.bytes());
}

Expected<uint64_t> Writer::checked_bytes(std::string_view name, GgmlType type,
                                         const std::vector<uint64_t>& dims) const {
  auto info = ggml_type_info(static_cast<uint32_t>(type));
  if (!info) return invalid_argument("unknown tensor type");
  if (dims.empty() || dims.size() > kMaxDims) return invalid_argument("tensor needs 1-4 dims");
  uint64_t n = 1;
  for (uint64_t d : dims) {
    auto p = checked_mul(n, d);
    if (!p || d == 0) return invalid_argument("bad tensor dims for '" + std::string(name) + "'");
    n = *p;
  }
  if (dims[0] % info->block_size) {
    return invalid_argument("tensor '" + std::string(name) + "' row not a multiple of block");
  }
  return n / info->block_size * info->bytes_per_block;
}

Status Writer::add_tensor(std::string_view name, GgmlType type, const std::vector<uint64_t>& dims,
                          std::span<const uint8_t> data) {
  METRO_ASSIGN_OR_RETURN(const uint64_t bytes, checked_bytes(name, type, dims));
  if (bytes != data.size()) {
    return invalid_argument("tensor '" + std::string(name) + "' has " +
                            std::to_string(data.size()) + " bytes, its shape needs " +
                            std::to_string(bytes));
  }
  tensors_.push_back({std::string(name), type, dims, {data.begin(), data.end()}, bytes, nullptr});
  return {};
}

Status Writer::add_tensor_lazy(std::string_view name, GgmlType type, const std::vector<uint64_t>& dims,
                               TensorFill fill) {
  METRO_ASSIGN_OR_RETURN(const uint64_t bytes, checked_bytes(name, type, dims));
  METRO_CHECK(fill != nullptr);
  tensors_.push_back({std::string(name), type, dims, {}, bytes, std::move(fill)});
  return {};
}

std::vector<uint8_t> Writer::header() const {
  Encoder out;
  out.put<uint32_t>(kMagic);
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(n_kv_);
  out.put_bytes(meta_.bytes());
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.put_string(t.name);
    out.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) out.put<uint64_t>(d);
    out.put<uint32_t>(static_cast<uint32_t>(t.type));
    out.put<uint64_t>(offset);
    offset += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  out.pad_to(alignment_);
  return std::move(out.bytes());
}

uint64_t Writer::file_size() const {
  uint64_t n = header().size();
  for (const auto& t : tensors_) n += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
  return n;
}

std::vector<uint8_t> Writer::serialize() const {
  auto bytes = build();
  METRO_CHECK_MSG(bytes.ok(), "Writer::serialize: a lazy tensor failed; use build()");
  return std::move(*bytes);
}

Expected<std::vector<uint8_t>> Writer::build() const {
  std::vector<uint8_t> out = header();
  out.reserve(file_size());
  for (const auto& t : tensors_) {
    const size_t at = out.size();
    out.resize(at + (t.n_bytes + alignment_ - 1) / alignment_ * alignment_, 0);
    if (t.fill) {
      METRO_RETURN_IF_ERROR(t.fill(std::span<uint8_t>(out.data() + at, t.n_bytes)));
    } else {
      std::memcpy(out.data() + at, t.data.data(), t.n_bytes);
    }
  }
  return out;
}

Status Writer::write(const std::string& path) const {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return io_error("cannot create '" + path + "': " + std::strerror(errno));
  auto put = [&](const uint8_t* p, size_t n) -> Status {
    if (n != 0 && std::fwrite(p, 1, n, f.get()) != n) {
      return io_error("cannot write '" + path + "': " + std::strerror(errno));
    }
    return {};
  };
  const std::vector<uint8_t> head = header();
  METRO_RETURN_IF_ERROR(put(head.data(), head.size()));
  std::vector<uint8_t> buf;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const auto& t : tensors_) {
    if (t.fill) {
      buf.assign(t.n_bytes, 0);
      METRO_RETURN_IF_ERROR(t.fill(std::span<uint8_t>(buf.data(), buf.size())));
      METRO_RETURN_IF_ERROR(put(buf.data(), buf.size()));
      std::vector<uint8_t>().swap(buf);
    } else {
      METRO_RETURN_IF_ERROR(put(t.data.data(), t.n_bytes));
    }
    const uint64_t pad = (t.n_bytes + alignment_ - 1) / alignment_ * alignment_ - t.n_bytes;
    METRO_RETURN_IF_ERROR(put(zeros.data(), pad));
  }
  if (std::fflush(f.get()) != 0 || ::fsync(::fileno(f.get())) != 0) {
    return io_error("cannot write '" + path + "': " + std::strerror(errno));
  }
  return {};
}

Status Writer::write_atomically(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (Status st = write(tmp); !st.ok()) {
    std::remove(tmp.c_str());
    return st;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return io_error("cannot rename '" + tmp + "' to '" + path + "': " + why);
  }
  return {};
}

}  // namespace metro::gguf
