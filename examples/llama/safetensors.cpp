#include "safetensors.hpp"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "byte_reader.hpp"
#include "dequantize.hpp"
#include "gguf.hpp"
#include "load_error.hpp"

namespace pagedkv::llama {
namespace {

// The reference implementation refuses headers past 100 MB.
constexpr std::uint64_t max_header_bytes = 100'000'000;

struct dtype_name {
  std::string_view name;
  safetensors_dtype dtype;
  std::size_t size;
};
constexpr std::array<dtype_name, 15> dtypes = {{
    {"BOOL", safetensors_dtype::boolean, 1}, {"U8", safetensors_dtype::u8, 1},   {"I8", safetensors_dtype::i8, 1},
    {"F8_E5M2", safetensors_dtype::f8_e5m2, 1}, {"F8_E4M3", safetensors_dtype::f8_e4m3, 1}, {"I16", safetensors_dtype::i16, 2},
    {"U16", safetensors_dtype::u16, 2}, {"F16", safetensors_dtype::f16, 2}, {"BF16", safetensors_dtype::bf16, 2},
    {"I32", safetensors_dtype::i32, 4}, {"U32", safetensors_dtype::u32, 4}, {"F32", safetensors_dtype::f32, 4},
    {"F64", safetensors_dtype::f64, 8}, {"I64", safetensors_dtype::i64, 8}, {"U64", safetensors_dtype::u64, 8},
}};

}  // namespace

std::string_view to_string(safetensors_dtype dtype) noexcept {
  for (const auto& d : dtypes)
    if (d.dtype == dtype) return d.name;
  return "unknown";
}

std::size_t size_bytes(safetensors_dtype dtype) noexcept {
  for (const auto& d : dtypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

safetensors_file safetensors_file::open(const std::filesystem::path& path) {
  return parse(read_file_bytes(path), path.string());
}

safetensors_file safetensors_file::parse(std::vector<std::uint8_t> bytes, std::string file_name) {
  using nlohmann::json;
  safetensors_file file;
  file.bytes_ = std::move(bytes);
  file.file_name_ = std::move(file_name);
  const auto& name = file.file_name_;
  byte_reader in(file.bytes_, name);

  const auto header_bytes = in.read<std::uint64_t>("header length");
  if (header_bytes > max_header_bytes || header_bytes > in.remaining())
    fail_at(name, "header length", 0, "a header of ", header_bytes, " bytes does not fit in the ", in.remaining(),
            " bytes after it (or exceeds the 100 MB limit)");
  const auto header_text = in.read_bytes(header_bytes, "header");
  const std::uint64_t data_start = 8 + header_bytes;
  const std::uint64_t data_bytes = file.bytes_.size() - data_start;

  json header;
  try {
    header = json::parse(header_text);
  } catch (const json::parse_error& e) {
    fail_at(name, "header JSON", 8 + (e.byte > 0 ? e.byte - 1 : 0), e.what());
  } catch (const json::exception& e) {  // out_of_range: a number too large for a double
    fail_in(name, "header JSON", e.what());
  }
  if (!header.is_object()) fail_at(name, "header JSON", 8, "the header is not a JSON object");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail_at(name, "__metadata__", 8, "expected an object of strings, found ", value.type_name());
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) fail_at(name, "__metadata__." + meta_key, 8, "expected a string, found ", meta_value.type_name());
        file.metadata_.emplace(meta_key, meta_value.get<std::string>());
      }
      continue;
    }
    const std::string field = "tensor '" + key + "'";
    if (!value.is_object()) fail_at(name, field, 8, "expected an object, found ", value.type_name());
    safetensors_tensor tensor;
    tensor.name = key;

    const auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) fail_at(name, field + " dtype", 8, "missing or not a string");
    const auto known = std::find_if(dtypes.begin(), dtypes.end(), [&](const auto& d) { return d.name == dtype->get<std::string>(); });
    if (known == dtypes.end()) fail_at(name, field + " dtype", 8, "unknown dtype '", dtype->get<std::string>(), "'");
    tensor.dtype = known->dtype;

    const auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) fail_at(name, field + " shape", 8, "missing or not an array");
    tensor.num_elements = 1;
    for (const auto& dim : *shape) {
      if (!dim.is_number_unsigned()) fail_at(name, field + " shape", 8, "dimension ", dim.dump(), " is not a non-negative integer");
      const auto extent = dim.get<std::uint64_t>();
      // Every element takes at least a byte, so a tensor larger than the data is already wrong.
      if (extent != 0 && tensor.num_elements > data_bytes / extent)
        fail_at(name, field + " shape", 8, "shape ", shape->dump(), " has more elements than the file has bytes");
      tensor.num_elements *= extent;
      tensor.shape.push_back(static_cast<std::int64_t>(extent));
    }
    tensor.size_bytes = tensor.num_elements * known->size;

    const auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned())
      fail_at(name, field + " data_offsets", 8, "expected [begin, end] of non-negative integers");
    const auto begin = (*offsets)[0].get<std::uint64_t>();
    const auto end = (*offsets)[1].get<std::uint64_t>();
    if (begin > end || end > data_bytes)
      fail_at(name, field + " data_offsets", data_start + std::min(begin, data_bytes), "[", begin, ", ", end,
              ") is not a range inside the ", data_bytes, " data bytes");
    if (end - begin != tensor.size_bytes)
      fail_at(name, field + " data_offsets", data_start + begin, "holds ", end - begin, " bytes but ", known->name, " ",
              shape->dump(), " needs ", tensor.size_bytes);
    tensor.data_offset = data_start + begin;
    file.tensors_.push_back(std::move(tensor));
  }

  // As the reference implementation requires: tensors tile the data section, no gaps, no overlap.
  std::sort(file.tensors_.begin(), file.tensors_.end(), [](const auto& a, const auto& b) {
    return a.data_offset != b.data_offset ? a.data_offset < b.data_offset : a.size_bytes < b.size_bytes;
  });
  std::uint64_t expected = data_start;
  for (const auto& tensor : file.tensors_) {
    if (tensor.data_offset != expected)
      fail_at(name, "tensor '" + tensor.name + "' data_offsets", tensor.data_offset, "the tensor ",
              tensor.data_offset < expected ? "overlaps the one before it" : "leaves a gap after the one before it");
    expected += tensor.size_bytes;
  }
  if (expected != file.bytes_.size())
    fail_at(name, "data", expected, "the tensors cover ", expected - data_start, " of the ", data_bytes, " data bytes");
  return file;
}

const safetensors_tensor* safetensors_file::find_tensor(std::string_view name) const {
  const auto it = std::find_if(tensors_.begin(), tensors_.end(), [&](const auto& t) { return t.name == name; });
  return it == tensors_.end() ? nullptr : &*it;
}

std::span<const std::uint8_t> safetensors_file::tensor_bytes(const safetensors_tensor& tensor) const {
  return std::span<const std::uint8_t>(bytes_).subspan(tensor.data_offset, tensor.size_bytes);
}

std::vector<float> safetensors_file::to_float(const safetensors_tensor& tensor) const {
  ggml_type type;
  switch (tensor.dtype) {
    case safetensors_dtype::f32: type = ggml_type::f32; break;
    case safetensors_dtype::f16: type = ggml_type::f16; break;
    case safetensors_dtype::bf16: type = ggml_type::bf16; break;
    default:
      fail_at(file_name_, "tensor '" + tensor.name + "' dtype", tensor.data_offset, "dtype ", to_string(tensor.dtype),
              " is not a weight type the runner reads (F32, F16, BF16)");
  }
  std::vector<float> out(tensor.num_elements);
  dequantize(type, tensor_bytes(tensor), out);
  return out;
}

std::vector<float> safetensors_file::to_float(std::string_view name) const {
  const auto* tensor = find_tensor(name);
  if (!tensor) fail_in(file_name_, "tensor '" + std::string(name) + "'", "no tensor of that name in the file");
  return to_float(*tensor);
}

}  // namespace pagedkv::llama
