// A GGUF (v2/v3) reader: the metadata key/values, the tensor infos and the tensor data, with every
// tensor dequantized to float32 on request. The whole file is read into memory and validated up
// front: counts and sizes are capped by the file's size, every tensor's bytes must lie inside the
// data section, and any violation is a load_error naming the file, the field and the byte offset.
//
// Layout (ggml/docs/gguf.md): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then
// kv_count key/values, tensor_count tensor infos, padding to `general.alignment` (default 32) and
// the data section, in which each tensor info's offset points.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dequantize.hpp"

namespace pagedkv::llama {

/// Value types of GGUF metadata, numbered as in the file.
enum class gguf_type : std::uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6,
  boolean = 7, string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12,
};
std::string_view to_string(gguf_type type) noexcept;

/// An array value, stored by element kind: integers widened to 64 bits (signed or not, as
/// declared), floats to double. Keeping elements unboxed holds the memory a hostile file can make
/// us allocate to 8 bytes (a std::string for string arrays) per element the file spends a byte or more on.
struct gguf_array {
  gguf_type element_type = gguf_type::uint8;
  std::variant<std::vector<std::uint64_t>, std::vector<std::int64_t>, std::vector<double>, std::vector<bool>,
               std::vector<std::string>, std::vector<gguf_array>>
      elements;

  [[nodiscard]] std::size_t size() const noexcept {
    return std::visit([](const auto& v) { return v.size(); }, elements);
  }
};

/// One metadata value. Integers are widened to 64 bits (signed or not, as stored), floats to
/// double; `type` keeps the type the file declared.
struct gguf_value {
  gguf_type type = gguf_type::uint8;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, gguf_array> data;
};

struct gguf_entry {
  gguf_value value;
  std::uint64_t offset = 0;  ///< byte offset of the key in the file, for error messages
};

struct gguf_tensor_info {
  std::string name;
  std::vector<std::uint64_t> dims;  ///< ggml order: dims[0] is the innermost (contiguous) one
  ggml_type type = ggml_type::f32;
  std::uint64_t num_elements = 0;
  std::uint64_t data_offset = 0;  ///< absolute byte offset of the tensor's data in the file
  std::uint64_t size_bytes = 0;
  std::uint64_t info_offset = 0;  ///< byte offset of this tensor info, for error messages

  /// The shape outermost first (row-major, as PyTorch writes it): dims reversed.
  [[nodiscard]] std::vector<std::int64_t> shape() const;
};

class gguf_file {
 public:
  /// Reads and validates `path`. Throws load_error.
  static gguf_file open(const std::filesystem::path& path);
  /// Validates a file already in memory; `file_name` appears in error messages.
  static gguf_file parse(std::vector<std::uint8_t> bytes, std::string file_name);

  [[nodiscard]] const std::string& file_name() const noexcept { return file_name_; }
  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] std::uint64_t data_section_offset() const noexcept { return data_section_offset_; }
  [[nodiscard]] const std::map<std::string, gguf_entry, std::less<>>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] const std::vector<gguf_tensor_info>& tensors() const noexcept { return tensors_; }

  [[nodiscard]] const gguf_value* find(std::string_view key) const;
  [[nodiscard]] const gguf_tensor_info* find_tensor(std::string_view name) const;

  // Typed metadata access. The plain forms throw load_error when the key is missing or holds the
  // wrong type; the optional forms return nullopt when it is missing (and still throw on a wrong
  // type). Any integer type converts to an integer that can hold its value; float32 and float64
  // both read as float.
  [[nodiscard]] std::uint64_t get_uint(std::string_view key) const;
  [[nodiscard]] std::optional<std::uint64_t> try_get_uint(std::string_view key) const;
  [[nodiscard]] std::int64_t get_int(std::string_view key) const;
  [[nodiscard]] double get_float(std::string_view key) const;
  [[nodiscard]] std::optional<double> try_get_float(std::string_view key) const;
  [[nodiscard]] bool get_bool(std::string_view key) const;
  [[nodiscard]] std::optional<bool> try_get_bool(std::string_view key) const;
  [[nodiscard]] const std::string& get_string(std::string_view key) const;
  [[nodiscard]] std::optional<std::string> try_get_string(std::string_view key) const;
  [[nodiscard]] std::vector<std::string> get_string_array(std::string_view key) const;
  [[nodiscard]] std::vector<std::int64_t> get_int_array(std::string_view key) const;
  [[nodiscard]] std::vector<float> get_float_array(std::string_view key) const;

  /// The packed bytes of a tensor (inside the file, already bounds-checked).
  [[nodiscard]] std::span<const std::uint8_t> tensor_bytes(const gguf_tensor_info& tensor) const;
  /// The tensor converted to float32, num_elements values in ggml order (row-major over shape()).
  [[nodiscard]] std::vector<float> dequantize(const gguf_tensor_info& tensor) const;
  /// dequantize(find_tensor(name)); throws load_error naming the tensor when it is not there.
  [[nodiscard]] std::vector<float> dequantize(std::string_view name) const;

 private:
  const gguf_entry& entry(std::string_view key) const;
  [[noreturn]] void wrong_type(std::string_view key, const gguf_entry& entry, std::string_view expected) const;

  std::vector<std::uint8_t> bytes_;
  std::string file_name_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_section_offset_ = 0;
  std::map<std::string, gguf_entry, std::less<>> metadata_;
  std::vector<gguf_tensor_info> tensors_;
};

/// Reads a whole file into memory; throws load_error naming the file when it cannot.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path);

}  // namespace pagedkv::llama
