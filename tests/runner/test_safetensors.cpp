// The safetensors reader on files built here: dtypes F32/F16/BF16 to float, metadata, and hostile
// headers, offsets and truncations that must give a load_error naming file, field and offset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "load_error.hpp"
#include "safetensors.hpp"

namespace pagedkv::llama {
namespace {

std::vector<std::uint8_t> make_file(const std::string& header, const std::vector<std::uint8_t>& data) {
  const std::uint64_t length = header.size();
  std::vector<std::uint8_t> bytes(8 + header.size() + data.size());
  std::memcpy(bytes.data(), &length, 8);
  std::copy(header.begin(), header.end(), bytes.begin() + 8);
  std::copy(data.begin(), data.end(), bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return bytes;
}

template <class T>
void append(std::vector<std::uint8_t>& out, T value) {
  const auto size = out.size();
  out.resize(size + sizeof(T));
  std::memcpy(out.data() + size, &value, sizeof(T));
}

std::vector<std::uint8_t> valid_file() {
  std::vector<std::uint8_t> data;
  for (float v : {1.0f, -2.0f, 0.5f, 3.0f, 4.0f, 5.0f}) append(data, v);  // "w" F32 [2, 3]
  for (std::uint16_t v : {0x3C00, 0xC000}) append(data, v);               // "h" F16 [2]: 1, -2
  for (std::uint16_t v : {0x3F80, 0xC0A0}) append(data, v);               // "b" BF16 [2]: 1, -5
  append(data, std::int64_t{7});                                          // "i" I64 [1]
  return make_file(R"({"__metadata__": {"format": "pt"},
    "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "h": {"dtype": "F16", "shape": [2], "data_offsets": [24, 28]},
    "b": {"dtype": "BF16", "shape": [2], "data_offsets": [28, 32]},
    "i": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]}})",
                   data);
}

TEST(safetensors, reads_tensors_and_metadata) {
  const auto file = safetensors_file::parse(valid_file(), "model.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.tensors().size(), 4u);
  EXPECT_EQ(file.tensors()[0].name, "w");  // in data order
  EXPECT_EQ(file.find_tensor("w")->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(file.to_float("w"), (std::vector<float>{1, -2, 0.5f, 3, 4, 5}));
  EXPECT_EQ(file.to_float("h"), (std::vector<float>{1, -2}));
  EXPECT_EQ(file.to_float("b"), (std::vector<float>{1, -5}));
  EXPECT_THROW((void)file.to_float("i"), load_error);
  EXPECT_THROW((void)file.to_float("missing"), load_error);
}

TEST(safetensors, every_truncation_is_a_load_error) {
  const auto bytes = valid_file();
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    std::vector<std::uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
    EXPECT_THROW((void)safetensors_file::parse(std::move(prefix), "cut.safetensors"), load_error) << "size " << size;
  }
}

std::string error_of(const std::string& header, std::size_t data_bytes) {
  try {
    (void)safetensors_file::parse(make_file(header, std::vector<std::uint8_t>(data_bytes)), "bad.safetensors");
  } catch (const load_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(safetensors, hostile_headers_are_named) {
  std::vector<std::uint8_t> huge(16, 0xFF);
  try {
    (void)safetensors_file::parse(huge, "bad.safetensors");
    FAIL();
  } catch (const load_error& e) {
    EXPECT_STREQ(e.what(), "bad.safetensors: header length at byte 0: a header of 18446744073709551615 bytes does not fit in the 8 bytes after it (or exceeds the 100 MB limit)");
  }
  EXPECT_EQ(error_of("[1]", 0), "bad.safetensors: header JSON at byte 8: the header is not a JSON object");
  EXPECT_EQ(error_of(R"({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})", 1),
            "bad.safetensors: tensor 'w' dtype at byte 8: unknown dtype 'Q4'");
  EXPECT_EQ(error_of(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
            "bad.safetensors: tensor 'w' shape at byte 8: dimension -1 is not a non-negative integer");
  EXPECT_EQ(error_of(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})", 4),
            "bad.safetensors: tensor 'w' shape at byte 8: shape [4294967296,4294967296] has more elements than the file has bytes");
  EXPECT_EQ(error_of(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4),
            "bad.safetensors: tensor 'w' data_offsets at byte 69: holds 4 bytes but F32 [2] needs 8");
  EXPECT_EQ(error_of(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 4),
            "bad.safetensors: tensor 'w' data_offsets at byte 73: [4, 8) is not a range inside the 4 data bytes");
  EXPECT_EQ(error_of(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})", 8),
            "bad.safetensors: tensor 'b' data_offsets at byte 132: the tensor overlaps the one before it");
  EXPECT_EQ(error_of(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8),
            "bad.safetensors: data at byte 73: the tensors cover 4 of the 8 data bytes");
  EXPECT_EQ(error_of(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", 4).substr(0, 42),
            "bad.safetensors: header JSON at byte 68: [");
}

}  // namespace
}  // namespace pagedkv::llama
