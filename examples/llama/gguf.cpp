#include "gguf.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>

#include "byte_reader.hpp"
#include "load_error.hpp"

namespace pagedkv::llama {
namespace {

constexpr std::uint64_t default_alignment = 32;
constexpr int max_array_nesting = 8;    // GGUF writers never nest; the cap keeps recursion bounded
constexpr std::uint32_t max_dims = 4;   // GGML_MAX_DIMS

bool is_known(gguf_type type) { return static_cast<std::uint32_t>(type) <= static_cast<std::uint32_t>(gguf_type::float64); }

// The fewest bytes one value of `type` takes, used to cap element counts by the bytes left.
std::uint64_t min_value_bytes(gguf_type type) {
  switch (type) {
    case gguf_type::uint8: case gguf_type::int8: case gguf_type::boolean: return 1;
    case gguf_type::uint16: case gguf_type::int16: return 2;
    case gguf_type::uint32: case gguf_type::int32: case gguf_type::float32: return 4;
    case gguf_type::uint64: case gguf_type::int64: case gguf_type::float64: case gguf_type::string: return 8;
    case gguf_type::array: return 12;
  }
  return 1;
}

bool read_bool(byte_reader& in, std::string_view field) {
  const auto byte = in.read<std::uint8_t>(field);
  if (byte > 1) in.fail(field, "boolean byte is ", int{byte}, ", not 0 or 1");
  return byte == 1;
}

std::string read_string(byte_reader& in, std::string_view field) {
  const auto length = in.read<std::uint64_t>(field);
  if (length > in.remaining())
    in.fail(field, "string length ", length, " is larger than the ", in.remaining(), " bytes left");
  return std::string(in.read_bytes(length, field));
}

gguf_array read_array(byte_reader& in, const std::string& field, int depth);

gguf_value read_value(byte_reader& in, gguf_type type, const std::string& field, int depth) {
  gguf_value value;
  value.type = type;
  switch (type) {
    case gguf_type::uint8: value.data = std::uint64_t{in.read<std::uint8_t>(field)}; break;
    case gguf_type::uint16: value.data = std::uint64_t{in.read<std::uint16_t>(field)}; break;
    case gguf_type::uint32: value.data = std::uint64_t{in.read<std::uint32_t>(field)}; break;
    case gguf_type::uint64: value.data = in.read<std::uint64_t>(field); break;
    case gguf_type::int8: value.data = std::int64_t{in.read<std::int8_t>(field)}; break;
    case gguf_type::int16: value.data = std::int64_t{in.read<std::int16_t>(field)}; break;
    case gguf_type::int32: value.data = std::int64_t{in.read<std::int32_t>(field)}; break;
    case gguf_type::int64: value.data = in.read<std::int64_t>(field); break;
    case gguf_type::float32: value.data = double{in.read<float>(field)}; break;
    case gguf_type::float64: value.data = in.read<double>(field); break;
    case gguf_type::boolean: value.data = read_bool(in, field); break;
    case gguf_type::string: value.data = read_string(in, field); break;
    case gguf_type::array: value.data = read_array(in, field, depth); break;
  }
  return value;
}

template <class T, class Read>
std::vector<T> read_elements(std::uint64_t count, Read read) {
  std::vector<T> elements;
  elements.reserve(count);
  for (std::uint64_t i = 0; i < count; ++i) elements.push_back(read());
  return elements;
}

gguf_array read_array(byte_reader& in, const std::string& field, int depth) {
  if (depth >= max_array_nesting) in.fail(field, "arrays nested deeper than ", max_array_nesting);
  gguf_array array;
  const auto element_offset = in.offset();
  const auto element_type = static_cast<gguf_type>(in.read<std::uint32_t>(field));
  if (!is_known(element_type))
    fail_at(in.file_name(), field, element_offset, "unknown array element type ", static_cast<std::uint32_t>(element_type));
  array.element_type = element_type;
  const auto count = in.read<std::uint64_t>(field);
  if (count > in.remaining() / min_value_bytes(element_type))
    in.fail(field, "array of ", count, " ", to_string(element_type), " values cannot fit in the ", in.remaining(), " bytes left");
  switch (element_type) {
    case gguf_type::uint8: case gguf_type::uint16: case gguf_type::uint32: case gguf_type::uint64:
      array.elements = read_elements<std::uint64_t>(count, [&] { return std::get<std::uint64_t>(read_value(in, element_type, field, depth).data); });
      break;
    case gguf_type::int8: case gguf_type::int16: case gguf_type::int32: case gguf_type::int64:
      array.elements = read_elements<std::int64_t>(count, [&] { return std::get<std::int64_t>(read_value(in, element_type, field, depth).data); });
      break;
    case gguf_type::float32: case gguf_type::float64:
      array.elements = read_elements<double>(count, [&] { return std::get<double>(read_value(in, element_type, field, depth).data); });
      break;
    case gguf_type::boolean:
      array.elements = read_elements<bool>(count, [&] { return read_bool(in, field); });
      break;
    case gguf_type::string:
      array.elements = read_elements<std::string>(count, [&] { return read_string(in, field); });
      break;
    case gguf_type::array:
      array.elements = read_elements<gguf_array>(count, [&] { return read_array(in, field, depth + 1); });
      break;
  }
  return array;
}

std::string_view ggml_type_name(std::uint32_t id) {
  // Names of the ggml types the runner does not dequantize, so an error says what the file holds.
  static constexpr std::string_view names[] = {"F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0",
                                               "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS",
                                               "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                               "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16"};
  return id < std::size(names) ? names[id] : "unknown";
}

}  // namespace

std::string_view to_string(gguf_type type) noexcept {
  switch (type) {
    case gguf_type::uint8: return "uint8";
    case gguf_type::int8: return "int8";
    case gguf_type::uint16: return "uint16";
    case gguf_type::int16: return "int16";
    case gguf_type::uint32: return "uint32";
    case gguf_type::int32: return "int32";
    case gguf_type::float32: return "float32";
    case gguf_type::boolean: return "bool";
    case gguf_type::string: return "string";
    case gguf_type::array: return "array";
    case gguf_type::uint64: return "uint64";
    case gguf_type::int64: return "int64";
    case gguf_type::float64: return "float64";
  }
  return "unknown";
}

std::vector<std::int64_t> gguf_tensor_info::shape() const {
  return {dims.rbegin(), dims.rend()};
}

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path) {
  // A directory opens as a stream whose end reads as 2^63 - 1 bytes: check what the path is first.
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) fail_in(path.string(), "open", "no such file");
  if (std::filesystem::is_directory(status)) fail_in(path.string(), "open", "is a directory, not a file");
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) fail_in(path.string(), "open", "cannot open the file");
  const auto size = static_cast<std::streamoff>(file.tellg());
  if (size < 0 || size == std::numeric_limits<std::streamoff>::max())
    fail_in(path.string(), "open", "cannot tell the file's size");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  file.seekg(0);
  if (!file.read(reinterpret_cast<char*>(bytes.data()), size)) fail_in(path.string(), "read", "cannot read ", size, " bytes");
  return bytes;
}

gguf_file gguf_file::open(const std::filesystem::path& path) {
  return parse(read_file_bytes(path), path.string());
}

gguf_file gguf_file::parse(std::vector<std::uint8_t> bytes, std::string file_name) {
  gguf_file file;
  file.bytes_ = std::move(bytes);
  file.file_name_ = std::move(file_name);
  byte_reader in(file.bytes_, file.file_name_);

  const auto magic = in.read_bytes(4, "magic");
  if (magic != "GGUF") fail_at(file.file_name_, "magic", 0, "not a GGUF file (the first bytes are not \"GGUF\")");
  file.version_ = in.read<std::uint32_t>("version");
  if (file.version_ != 2 && file.version_ != 3)
    fail_at(file.file_name_, "version", 4, "GGUF version ", file.version_, " is not supported (2 and 3 are)");
  const auto tensor_count = in.read<std::uint64_t>("tensor_count");
  const auto kv_count = in.read<std::uint64_t>("kv_count");
  // A key/value takes at least 13 bytes (key length, type, one byte of value) and a tensor info at
  // least 32 (name length, dimension count, one dimension, type, offset).
  if (kv_count > in.remaining() / 13) fail_at(file.file_name_, "kv_count", 16, kv_count, " key/values cannot fit in a file of ", in.size(), " bytes");
  if (tensor_count > in.remaining() / 32) fail_at(file.file_name_, "tensor_count", 8, tensor_count, " tensor infos cannot fit in a file of ", in.size(), " bytes");

  for (std::uint64_t i = 0; i < kv_count; ++i) {
    const auto key_offset = in.offset();
    std::string key = read_string(in, "metadata key");
    const std::string field = "metadata '" + key + "'";
    const auto type_offset = in.offset();
    const auto type = static_cast<gguf_type>(in.read<std::uint32_t>(field));
    if (!is_known(type)) fail_at(file.file_name_, field, type_offset, "unknown value type ", static_cast<std::uint32_t>(type));
    gguf_entry entry{read_value(in, type, field, 0), key_offset};
    if (!file.metadata_.emplace(std::move(key), std::move(entry)).second)
      fail_at(file.file_name_, field, key_offset, "the key appears twice");
  }

  if (const auto* alignment = file.find("general.alignment")) {
    const auto offset = file.metadata_.find("general.alignment")->second.offset;
    if (alignment->type != gguf_type::uint32) fail_at(file.file_name_, "metadata 'general.alignment'", offset, "must be uint32, is ", to_string(alignment->type));
    file.alignment_ = std::get<std::uint64_t>(alignment->data);
    if (file.alignment_ == 0 || (file.alignment_ & (file.alignment_ - 1)) != 0)
      fail_at(file.file_name_, "metadata 'general.alignment'", offset, "alignment ", file.alignment_, " is not a power of two");
  } else {
    file.alignment_ = default_alignment;
  }

  std::set<std::string, std::less<>> names;
  file.tensors_.reserve(tensor_count);
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    gguf_tensor_info tensor;
    tensor.info_offset = in.offset();
    tensor.name = read_string(in, "tensor name");
    const std::string field = "tensor '" + tensor.name + "'";
    const auto num_dims = in.read<std::uint32_t>(field + " n_dims");
    if (num_dims == 0 || num_dims > max_dims) in.fail(field + " n_dims", "has ", num_dims, " dimensions (1 to ", max_dims, " allowed)");
    tensor.num_elements = 1;
    for (std::uint32_t d = 0; d < num_dims; ++d) {
      const auto dim_offset = in.offset();
      const auto dim = in.read<std::uint64_t>(field + " dims");
      // The bound keeps element counts and byte sizes far from overflow; real sizes are then
      // checked against the file.
      if (dim == 0 || dim > (std::uint64_t{1} << 40) || tensor.num_elements > (std::uint64_t{1} << 40) / dim)
        fail_at(file.file_name_, field + " dims", dim_offset, "dimension ", d, " is ", dim, ", which gives an empty or impossibly large tensor");
      tensor.dims.push_back(dim);
      tensor.num_elements *= dim;
    }
    const auto type_offset = in.offset();
    const auto type_id = in.read<std::uint32_t>(field + " type");
    tensor.type = static_cast<ggml_type>(type_id);
    const auto layout = layout_of(tensor.type);
    if (!layout)
      fail_at(file.file_name_, field + " type", type_offset, "ggml type ", type_id, " (", ggml_type_name(type_id),
              ") is not supported: the runner reads F32, F16, BF16, Q4_0, Q4_1 and Q8_0");
    if (tensor.dims[0] % layout->block_elements != 0)
      fail_at(file.file_name_, field + " dims", type_offset, "the row length ", tensor.dims[0], " is not a multiple of the ",
              layout->name, " block of ", layout->block_elements);
    tensor.size_bytes = tensor.num_elements / layout->block_elements * layout->block_bytes;
    const auto offset_offset = in.offset();
    tensor.data_offset = in.read<std::uint64_t>(field + " offset");
    if (tensor.data_offset % file.alignment_ != 0)
      fail_at(file.file_name_, field + " offset", offset_offset, "data offset ", tensor.data_offset, " is not a multiple of the alignment ", file.alignment_);
    if (!names.insert(tensor.name).second) fail_at(file.file_name_, field, tensor.info_offset, "the tensor name appears twice");
    file.tensors_.push_back(std::move(tensor));
  }

  const auto header_end = in.offset();
  file.data_section_offset_ = (header_end + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  if (!file.tensors_.empty() && file.data_section_offset_ > in.size())
    fail_at(file.file_name_, "data section", header_end, "starts at ", file.data_section_offset_, ", past the end of the file (", in.size(), " bytes)");
  for (auto& tensor : file.tensors_) {
    const std::uint64_t available = in.size() - file.data_section_offset_;
    if (tensor.data_offset > available || tensor.size_bytes > available - tensor.data_offset)
      fail_at(file.file_name_, "tensor '" + tensor.name + "' data", file.data_section_offset_ + std::min(tensor.data_offset, available),
              "needs ", tensor.size_bytes, " bytes at data offset ", tensor.data_offset, " but the data section holds ", available);
    tensor.data_offset += file.data_section_offset_;
  }
  return file;
}

const gguf_value* gguf_file::find(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second.value;
}

const gguf_tensor_info* gguf_file::find_tensor(std::string_view name) const {
  const auto it = std::find_if(tensors_.begin(), tensors_.end(), [&](const auto& t) { return t.name == name; });
  return it == tensors_.end() ? nullptr : &*it;
}

const gguf_entry& gguf_file::entry(std::string_view key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) fail_in(file_name_, "metadata '" + std::string(key) + "'", "the key is missing");
  return it->second;
}

void gguf_file::wrong_type(std::string_view key, const gguf_entry& entry, std::string_view expected) const {
  std::string found(to_string(entry.value.type));
  if (entry.value.type == gguf_type::array)
    found += " of " + std::string(to_string(std::get<gguf_array>(entry.value.data).element_type));
  fail_at(file_name_, "metadata '" + std::string(key) + "'", entry.offset, "expected ", expected, ", found ", found);
}

namespace {
std::optional<std::int64_t> as_int(const gguf_value& value) {
  if (const auto* u = std::get_if<std::uint64_t>(&value.data))
    return *u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ? std::optional<std::int64_t>(static_cast<std::int64_t>(*u)) : std::nullopt;
  if (const auto* i = std::get_if<std::int64_t>(&value.data)) return *i;
  return std::nullopt;
}
}  // namespace

std::optional<std::uint64_t> gguf_file::try_get_uint(std::string_view key) const {
  if (!find(key)) return std::nullopt;
  return get_uint(key);
}

std::uint64_t gguf_file::get_uint(std::string_view key) const {
  const auto& e = entry(key);
  if (const auto* u = std::get_if<std::uint64_t>(&e.value.data)) return *u;
  if (const auto* i = std::get_if<std::int64_t>(&e.value.data); i && *i >= 0) return static_cast<std::uint64_t>(*i);
  wrong_type(key, e, "a non-negative integer");
}

std::int64_t gguf_file::get_int(std::string_view key) const {
  const auto& e = entry(key);
  if (const auto value = as_int(e.value)) return *value;
  wrong_type(key, e, "an integer that fits int64");
}

double gguf_file::get_float(std::string_view key) const {
  const auto& e = entry(key);
  if (const auto* d = std::get_if<double>(&e.value.data)) return *d;
  wrong_type(key, e, "float32 or float64");
}

std::optional<double> gguf_file::try_get_float(std::string_view key) const {
  if (!find(key)) return std::nullopt;
  return get_float(key);
}

bool gguf_file::get_bool(std::string_view key) const {
  const auto& e = entry(key);
  if (const auto* b = std::get_if<bool>(&e.value.data)) return *b;
  wrong_type(key, e, "bool");
}

std::optional<bool> gguf_file::try_get_bool(std::string_view key) const {
  if (!find(key)) return std::nullopt;
  return get_bool(key);
}

const std::string& gguf_file::get_string(std::string_view key) const {
  const auto& e = entry(key);
  if (const auto* s = std::get_if<std::string>(&e.value.data)) return *s;
  wrong_type(key, e, "string");
}

std::optional<std::string> gguf_file::try_get_string(std::string_view key) const {
  if (!find(key)) return std::nullopt;
  return get_string(key);
}

std::vector<std::string> gguf_file::get_string_array(std::string_view key) const {
  const auto& e = entry(key);
  const auto* array = std::get_if<gguf_array>(&e.value.data);
  if (!array || array->element_type != gguf_type::string) wrong_type(key, e, "array of string");
  return std::get<std::vector<std::string>>(array->elements);
}

std::vector<std::int64_t> gguf_file::get_int_array(std::string_view key) const {
  const auto& e = entry(key);
  const auto* array = std::get_if<gguf_array>(&e.value.data);
  if (!array) wrong_type(key, e, "array of integers");
  if (const auto* signed_values = std::get_if<std::vector<std::int64_t>>(&array->elements)) return *signed_values;
  const auto* unsigned_values = std::get_if<std::vector<std::uint64_t>>(&array->elements);
  if (!unsigned_values) wrong_type(key, e, "array of integers");
  std::vector<std::int64_t> out;
  out.reserve(unsigned_values->size());
  for (const auto value : *unsigned_values) {
    if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) wrong_type(key, e, "array of integers that fit int64");
    out.push_back(static_cast<std::int64_t>(value));
  }
  return out;
}

std::vector<float> gguf_file::get_float_array(std::string_view key) const {
  const auto& e = entry(key);
  const auto* array = std::get_if<gguf_array>(&e.value.data);
  if (!array || (array->element_type != gguf_type::float32 && array->element_type != gguf_type::float64))
    wrong_type(key, e, "array of float");
  const auto& values = std::get<std::vector<double>>(array->elements);
  return {values.begin(), values.end()};
}

std::span<const std::uint8_t> gguf_file::tensor_bytes(const gguf_tensor_info& tensor) const {
  return std::span<const std::uint8_t>(bytes_).subspan(tensor.data_offset, tensor.size_bytes);
}

std::vector<float> gguf_file::dequantize(const gguf_tensor_info& tensor) const {
  std::vector<float> out(tensor.num_elements);
  llama::dequantize(tensor.type, tensor_bytes(tensor), out);
  return out;
}

std::vector<float> gguf_file::dequantize(std::string_view name) const {
  const auto* tensor = find_tensor(name);
  if (!tensor) fail_in(file_name_, "tensor '" + std::string(name) + "'", "no tensor of that name in the file");
  return dequantize(*tensor);
}

}  // namespace pagedkv::llama
