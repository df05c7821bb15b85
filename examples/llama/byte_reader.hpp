// A cursor over untrusted bytes: every read checks that it stays inside the buffer and, when it
// does not, throws a load_error that names the file, the field and the offset. Little-endian, as
// GGUF and safetensors are.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "load_error.hpp"

namespace pagedkv::llama {

static_assert(std::endian::native == std::endian::little, "the model readers assume a little-endian host");

class byte_reader {
 public:
  byte_reader(std::span<const std::uint8_t> bytes, std::string_view file_name)
      : bytes_(bytes), file_name_(file_name) {}

  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  [[nodiscard]] std::uint64_t size() const noexcept { return bytes_.size(); }
  [[nodiscard]] std::uint64_t remaining() const noexcept { return bytes_.size() - offset_; }
  [[nodiscard]] std::string_view file_name() const noexcept { return file_name_; }

  /// Fails unless `count` more bytes are there to read for `field`.
  void require(std::uint64_t count, std::string_view field) const {
    if (count > remaining())
      fail_at(file_name_, field, offset_, "needs ", count, " bytes but the file has ", remaining(), " left");
  }

  template <class T>
    requires std::is_trivially_copyable_v<T>
  T read(std::string_view field) {
    require(sizeof(T), field);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  std::string_view read_bytes(std::uint64_t count, std::string_view field) {
    require(count, field);
    std::string_view view(reinterpret_cast<const char*>(bytes_.data() + offset_), count);
    offset_ += count;
    return view;
  }

  void seek(std::uint64_t offset, std::string_view field) {
    if (offset > bytes_.size())
      fail_at(file_name_, field, offset_, "offset ", offset, " is past the end of the file (", bytes_.size(), " bytes)");
    offset_ = offset;
  }

  template <class... Parts>
  [[noreturn]] void fail(std::string_view field, const Parts&... parts) const {
    fail_at(file_name_, field, offset_, parts...);
  }

 private:
  std::span<const std::uint8_t> bytes_;
  std::string_view file_name_;
  std::uint64_t offset_ = 0;
};

}  // namespace pagedkv::llama
