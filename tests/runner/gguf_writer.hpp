// Builds small GGUF files in memory for the tests, field by field, so a test can write a valid file
// and then break exactly one thing in it.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv::llama::testing {

class gguf_writer {
 public:
  std::vector<std::uint8_t> bytes;

  template <class T>
  gguf_writer& raw(T value) {
    const auto size = bytes.size();
    bytes.resize(size + sizeof(T));
    std::memcpy(bytes.data() + size, &value, sizeof(T));
    return *this;
  }
  gguf_writer& string(std::string_view text) {
    raw<std::uint64_t>(text.size());
    bytes.insert(bytes.end(), text.begin(), text.end());
    return *this;
  }
  gguf_writer& header(std::uint64_t tensor_count, std::uint64_t kv_count, std::uint32_t version = 3) {
    // raw(), not insert({...}): GCC 12 at -O3 warns falsely (stringop-overflow) on the insert.
    return raw(std::array<char, 4>{'G', 'G', 'U', 'F'}).raw(version).raw(tensor_count).raw(kv_count);
  }
  gguf_writer& kv_u32(std::string_view key, std::uint32_t value) { return string(key).raw<std::uint32_t>(4).raw(value); }
  gguf_writer& kv_f32(std::string_view key, float value) { return string(key).raw<std::uint32_t>(6).raw(value); }
  gguf_writer& kv_bool(std::string_view key, bool value) { return string(key).raw<std::uint32_t>(7).raw<std::uint8_t>(value); }
  gguf_writer& kv_string(std::string_view key, std::string_view value) { return string(key).raw<std::uint32_t>(8).string(value); }
  gguf_writer& kv_strings(std::string_view key, const std::vector<std::string>& values) {
    string(key).raw<std::uint32_t>(9).raw<std::uint32_t>(8).raw<std::uint64_t>(values.size());
    for (const auto& v : values) string(v);
    return *this;
  }
  gguf_writer& kv_i32s(std::string_view key, const std::vector<std::int32_t>& values) {
    string(key).raw<std::uint32_t>(9).raw<std::uint32_t>(5).raw<std::uint64_t>(values.size());
    for (auto v : values) raw(v);
    return *this;
  }
  gguf_writer& kv_f32s(std::string_view key, const std::vector<float>& values) {
    string(key).raw<std::uint32_t>(9).raw<std::uint32_t>(6).raw<std::uint64_t>(values.size());
    for (auto v : values) raw(v);
    return *this;
  }
  /// A tensor info; `dims` in ggml order (innermost first).
  gguf_writer& tensor_info(std::string_view name, const std::vector<std::uint64_t>& dims, std::uint32_t type, std::uint64_t offset) {
    string(name).raw<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) raw(d);
    return raw(type).raw(offset);
  }
  gguf_writer& align(std::size_t alignment = 32) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }
  template <class T>
  gguf_writer& data(const std::vector<T>& values) {
    for (const auto& v : values) raw(v);
    return *this;
  }
};

}  // namespace pagedkv::llama::testing
