// A reader for Hugging Face safetensors files: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data.
// Validated as the reference implementation does (offsets contiguous and covering the data,
// sizes matching shapes), with errors naming the file, the field and the byte offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv::llama {

enum class safetensors_dtype { boolean, u8, i8, f8_e5m2, f8_e4m3, i16, u16, f16, bf16, i32, u32, f32, f64, i64, u64 };
std::string_view to_string(safetensors_dtype dtype) noexcept;
std::size_t size_bytes(safetensors_dtype dtype) noexcept;

struct safetensors_tensor {
  std::string name;
  safetensors_dtype dtype = safetensors_dtype::f32;
  std::vector<std::int64_t> shape;  ///< outermost first
  std::uint64_t num_elements = 0;
  std::uint64_t data_offset = 0;    ///< absolute byte offset in the file
  std::uint64_t size_bytes = 0;
};

class safetensors_file {
 public:
  /// Reads and validates `path`. Throws load_error.
  static safetensors_file open(const std::filesystem::path& path);
  /// Validates a file already in memory; `file_name` appears in error messages.
  static safetensors_file parse(std::vector<std::uint8_t> bytes, std::string file_name);

  [[nodiscard]] const std::string& file_name() const noexcept { return file_name_; }
  [[nodiscard]] const std::vector<safetensors_tensor>& tensors() const noexcept { return tensors_; }  ///< in data order
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] const safetensors_tensor* find_tensor(std::string_view name) const;

  [[nodiscard]] std::span<const std::uint8_t> tensor_bytes(const safetensors_tensor& tensor) const;
  /// An F32, F16 or BF16 tensor as float32, row-major. Throws load_error for other dtypes.
  [[nodiscard]] std::vector<float> to_float(const safetensors_tensor& tensor) const;
  /// to_float(find_tensor(name)); throws load_error naming the tensor when it is not there.
  [[nodiscard]] std::vector<float> to_float(std::string_view name) const;

 private:
  std::vector<std::uint8_t> bytes_;
  std::string file_name_;
  std::vector<safetensors_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pagedkv::llama
