// The GGUF reader on files built in the test: every metadata type, tensor infos, alignment and
// data offsets, dequantization of each block format, and hostile files that must give a
// load_error naming file, field and offset (never a crash: this also runs under ASan/UBSan).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "dequantize.hpp"
#include "gguf.hpp"
#include "gguf_writer.hpp"
#include "llama_config.hpp"
#include "tokenizer.hpp"
#include "load_error.hpp"

namespace pagedkv::llama {
namespace {

using testing::gguf_writer;

std::uint16_t half_bits(float value) {
  // Exact for the small integers and halves the tests use.
  if (value == 0.0f) return 0;
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000;
  const std::int32_t exponent = static_cast<std::int32_t>((bits >> 23) & 0xFF) - 127 + 15;
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(exponent) << 10) | ((bits >> 13) & 0x3FF));
}

// A small valid file: every scalar metadata type, a string array, and two tensors (F32 3x2 and F16 4).
std::vector<std::uint8_t> valid_file() {
  gguf_writer w;
  w.header(2, 14);
  w.string("u8").raw<std::uint32_t>(0).raw<std::uint8_t>(200);
  w.string("i8").raw<std::uint32_t>(1).raw<std::int8_t>(-5);
  w.string("u16").raw<std::uint32_t>(2).raw<std::uint16_t>(60000);
  w.string("i16").raw<std::uint32_t>(3).raw<std::int16_t>(-300);
  w.kv_u32("u32", 4000000000u);
  w.string("i32").raw<std::uint32_t>(5).raw<std::int32_t>(-70000);
  w.kv_f32("f32", 0.5f);
  w.kv_bool("flag", true);
  w.kv_string("general.architecture", "llama");
  w.string("u64").raw<std::uint32_t>(10).raw<std::uint64_t>(1ull << 40);
  w.string("i64").raw<std::uint32_t>(11).raw<std::int64_t>(-(1ll << 40));
  w.string("f64").raw<std::uint32_t>(12).raw<double>(0.25);
  w.kv_strings("names", {"a", "", "ccc"});
  w.kv_i32s("types", {1, -2, 3});
  w.tensor_info("matrix", {2, 3}, 0, 0);
  w.tensor_info("vector", {4}, 1, 32);
  w.align();
  w.data(std::vector<float>{1, 2, 3, 4, 5, 6});
  w.align();
  w.data(std::vector<std::uint16_t>{half_bits(1.0f), half_bits(-2.0f), half_bits(0.5f), 0x7C00});
  return w.bytes;
}

TEST(gguf, reads_every_metadata_type_and_tensor) {
  const auto file = gguf_file::parse(valid_file(), "valid.gguf");
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.get_uint("u8"), 200u);
  EXPECT_EQ(file.get_int("i8"), -5);
  EXPECT_EQ(file.get_uint("u16"), 60000u);
  EXPECT_EQ(file.get_int("i16"), -300);
  EXPECT_EQ(file.get_uint("u32"), 4000000000u);
  EXPECT_EQ(file.get_int("i32"), -70000);
  EXPECT_EQ(file.get_float("f32"), 0.5);
  EXPECT_TRUE(file.get_bool("flag"));
  EXPECT_EQ(file.get_string("general.architecture"), "llama");
  EXPECT_EQ(file.get_uint("u64"), 1ull << 40);
  EXPECT_EQ(file.get_int("i64"), -(1ll << 40));
  EXPECT_EQ(file.get_float("f64"), 0.25);
  EXPECT_EQ(file.get_string_array("names"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(file.get_int_array("types"), (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_FALSE(file.try_get_uint("missing").has_value());

  ASSERT_EQ(file.tensors().size(), 2u);
  const auto* matrix = file.find_tensor("matrix");
  ASSERT_NE(matrix, nullptr);
  EXPECT_EQ(matrix->shape(), (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(matrix->data_offset % 32, 0u);
  EXPECT_EQ(file.dequantize("matrix"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const auto vector = file.dequantize("vector");
  ASSERT_EQ(vector.size(), 4u);
  EXPECT_EQ(vector[0], 1.0f);
  EXPECT_EQ(vector[1], -2.0f);
  EXPECT_EQ(vector[2], 0.5f);
  EXPECT_TRUE(std::isinf(vector[3]));
}

TEST(gguf, typed_access_names_the_key_and_the_types) {
  const auto file = gguf_file::parse(valid_file(), "valid.gguf");
  try {
    (void)file.get_string("u32");
    FAIL() << "expected load_error";
  } catch (const load_error& e) {
    EXPECT_STREQ(e.what(), "valid.gguf: metadata 'u32' at byte 88: expected string, found uint32");
  }
  EXPECT_THROW((void)file.get_uint("i8"), load_error);
  EXPECT_THROW((void)file.get_string_array("types"), load_error);
  EXPECT_THROW((void)file.get_float("missing"), load_error);
  EXPECT_THROW((void)file.dequantize("missing"), load_error);
}

TEST(gguf, arrays_of_every_kind) {
  gguf_writer w;
  w.header(0, 4).kv_f32s("floats", {0.5f, -1.0f});
  w.string("flags").raw<std::uint32_t>(9).raw<std::uint32_t>(7).raw<std::uint64_t>(3).raw<std::uint8_t>(1).raw<std::uint8_t>(0).raw<std::uint8_t>(1);
  w.string("u16s").raw<std::uint32_t>(9).raw<std::uint32_t>(2).raw<std::uint64_t>(2).raw<std::uint16_t>(7).raw<std::uint16_t>(65535);
  // An array of two arrays: [[1, 2], []] of int8.
  w.string("nested").raw<std::uint32_t>(9).raw<std::uint32_t>(9).raw<std::uint64_t>(2);
  w.raw<std::uint32_t>(1).raw<std::uint64_t>(2).raw<std::int8_t>(1).raw<std::int8_t>(2);
  w.raw<std::uint32_t>(1).raw<std::uint64_t>(0);
  const auto file = gguf_file::parse(w.bytes, "arrays.gguf");
  EXPECT_EQ(file.get_float_array("floats"), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(std::get<std::vector<bool>>(std::get<gguf_array>(file.find("flags")->data).elements), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(file.get_int_array("u16s"), (std::vector<std::int64_t>{7, 65535}));
  const auto& nested = std::get<gguf_array>(file.find("nested")->data);
  ASSERT_EQ(nested.size(), 2u);
  const auto& inner = std::get<std::vector<gguf_array>>(nested.elements);
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(inner[0].elements), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(inner[1].size(), 0u);
  EXPECT_THROW((void)file.get_int_array("floats"), load_error);
}

TEST(gguf, honours_general_alignment) {
  gguf_writer w;
  w.header(1, 1).kv_u32("general.alignment", 64).tensor_info("t", {2}, 0, 0).align(64).data(std::vector<float>{7, 8});
  const auto file = gguf_file::parse(w.bytes, "aligned.gguf");
  EXPECT_EQ(file.alignment(), 64u);
  EXPECT_EQ(file.data_section_offset() % 64, 0u);
  EXPECT_EQ(file.dequantize("t"), (std::vector<float>{7, 8}));
}

// Every prefix of a valid file is a truncated file: each must fail cleanly, never read past it.
TEST(gguf, every_truncation_is_a_load_error) {
  const auto bytes = valid_file();
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    std::vector<std::uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
    EXPECT_THROW((void)gguf_file::parse(std::move(prefix), "cut.gguf"), load_error) << "size " << size;
  }
}

std::string error_of(std::vector<std::uint8_t> bytes) {
  try {
    (void)gguf_file::parse(std::move(bytes), "bad.gguf");
  } catch (const load_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(gguf, hostile_headers_are_named) {
  auto bytes = valid_file();
  bytes[0] = 'X';
  EXPECT_EQ(error_of(bytes), "bad.gguf: magic at byte 0: not a GGUF file (the first bytes are not \"GGUF\")");

  EXPECT_EQ(error_of(gguf_writer{}.header(0, 0, 1).bytes), "bad.gguf: version at byte 4: GGUF version 1 is not supported (2 and 3 are)");
  EXPECT_EQ(error_of(gguf_writer{}.header(0, 1ull << 60).bytes),
            "bad.gguf: kv_count at byte 16: 1152921504606846976 key/values cannot fit in a file of 24 bytes");
  EXPECT_EQ(error_of(gguf_writer{}.header(1ull << 62, 0).bytes),
            "bad.gguf: tensor_count at byte 8: 4611686018427387904 tensor infos cannot fit in a file of 24 bytes");
  EXPECT_EQ(error_of(gguf_writer{}.header(0, 1).raw<std::uint64_t>(1ull << 63).raw<std::uint64_t>(0).bytes),
            "bad.gguf: metadata key at byte 32: string length 9223372036854775808 is larger than the 8 bytes left");
}

// A path that is no file is named before anything is read: a directory used to open as a stream
// of 2^63 - 1 bytes and end in std::bad_alloc.
TEST(gguf, a_directory_or_a_missing_path_is_named) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const auto message_of = [](const std::filesystem::path& path) -> std::string {
    try {
      (void)gguf_file::open(path);
    } catch (const load_error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message_of(dir), dir.string() + ": open: is a directory, not a file");
  EXPECT_EQ(message_of(dir / "no-such.gguf"), (dir / "no-such.gguf").string() + ": open: no such file");
}

TEST(gguf, hostile_metadata_is_named) {
  EXPECT_EQ(error_of(gguf_writer{}.header(0, 1).string("k").raw<std::uint32_t>(13).raw<std::uint32_t>(0).bytes),
            "bad.gguf: metadata 'k' at byte 33: unknown value type 13");
  EXPECT_EQ(error_of(gguf_writer{}.header(0, 1).string("k").raw<std::uint32_t>(9).raw<std::uint32_t>(4).raw<std::uint64_t>(1ull << 40).bytes),
            "bad.gguf: metadata 'k' at byte 49: array of 1099511627776 uint32 values cannot fit in the 0 bytes left");
  EXPECT_EQ(error_of(gguf_writer{}.header(0, 1).string("k").raw<std::uint32_t>(7).raw<std::uint8_t>(2).bytes),
            "bad.gguf: metadata 'k' at byte 38: boolean byte is 2, not 0 or 1");
  EXPECT_EQ(error_of(gguf_writer{}.header(0, 2).kv_u32("k", 1).kv_u32("k", 2).bytes),
            "bad.gguf: metadata 'k' at byte 41: the key appears twice");
  EXPECT_EQ(error_of(gguf_writer{}.header(0, 1).kv_u32("general.alignment", 48).bytes),
            "bad.gguf: metadata 'general.alignment' at byte 24: alignment 48 is not a power of two");
  // Arrays of arrays nested past the cap.
  gguf_writer nested;
  nested.header(0, 1).string("k").raw<std::uint32_t>(9);
  for (int i = 0; i < 9; ++i) nested.raw<std::uint32_t>(9).raw<std::uint64_t>(1);
  EXPECT_NE(error_of(nested.bytes).find("arrays nested deeper than 8"), std::string::npos);
}

TEST(gguf, hostile_tensor_infos_are_named) {
  EXPECT_EQ(error_of(gguf_writer{}.header(1, 0).tensor_info("t", {1, 1, 1, 1, 1}, 0, 0).align().data(std::vector<float>(8)).bytes),
            "bad.gguf: tensor 't' n_dims at byte 37: has 5 dimensions (1 to 4 allowed)");
  EXPECT_EQ(error_of(gguf_writer{}.header(1, 0).tensor_info("t", {4}, 14, 0).align().data(std::vector<float>(8)).bytes),
            "bad.gguf: tensor 't' type at byte 45: ggml type 14 (Q6_K) is not supported: the runner reads F32, F16, BF16, Q4_0, Q4_1 and Q8_0");
  EXPECT_EQ(error_of(gguf_writer{}.header(1, 0).tensor_info("t", {16}, 8, 0).align().data(std::vector<float>(8)).bytes),
            "bad.gguf: tensor 't' dims at byte 45: the row length 16 is not a multiple of the Q8_0 block of 32");
  EXPECT_EQ(error_of(gguf_writer{}.header(1, 0).tensor_info("t", {4}, 0, 8).align().data(std::vector<float>(8)).bytes),
            "bad.gguf: tensor 't' offset at byte 49: data offset 8 is not a multiple of the alignment 32");
  EXPECT_EQ(error_of(gguf_writer{}.header(1, 0).tensor_info("t", {100}, 0, 0).align().data(std::vector<float>(8)).bytes),
            "bad.gguf: tensor 't' data at byte 64: needs 400 bytes at data offset 0 but the data section holds 32");
  EXPECT_EQ(error_of(gguf_writer{}.header(1, 0).tensor_info("t", {1ull << 30, 1ull << 30}, 0, 0).bytes),
            "bad.gguf: tensor 't' dims at byte 45: dimension 1 is 1073741824, which gives an empty or impossibly large tensor");
  EXPECT_EQ(error_of(gguf_writer{}.header(2, 0).tensor_info("t", {4}, 0, 0).tensor_info("t", {4}, 0, 0).align().data(std::vector<float>(8)).bytes),
            "bad.gguf: tensor 't' at byte 57: the tensor name appears twice");
}

TEST(dequantize, half_precision_edge_cases) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xC0A0), -5.0f);
}

// One block of each quantized format, built by hand from ggml's layout, against values computed here.
TEST(dequantize, q4_0_q4_1_q8_0_blocks) {
  std::vector<std::uint8_t> q4_0{0, 0};
  const auto d = half_bits(0.5f);
  q4_0[0] = static_cast<std::uint8_t>(d);
  q4_0[1] = static_cast<std::uint8_t>(d >> 8);
  for (int j = 0; j < 16; ++j) q4_0.push_back(static_cast<std::uint8_t>(j | ((15 - j) << 4)));
  std::vector<float> out(32);
  dequantize(ggml_type::q4_0, q4_0, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(out[j + 16], (15 - j - 8) * 0.5f) << j;
  }

  std::vector<std::uint8_t> q4_1 = {q4_0[0], q4_0[1]};
  const auto m = half_bits(-3.0f);
  q4_1.push_back(static_cast<std::uint8_t>(m));
  q4_1.push_back(static_cast<std::uint8_t>(m >> 8));
  q4_1.insert(q4_1.end(), q4_0.begin() + 2, q4_0.end());
  dequantize(ggml_type::q4_1, q4_1, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], j * 0.5f - 3.0f) << j;
    EXPECT_EQ(out[j + 16], (15 - j) * 0.5f - 3.0f) << j;
  }

  std::vector<std::uint8_t> q8_0 = {q4_0[0], q4_0[1]};
  for (int j = 0; j < 32; ++j) q8_0.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(j * 8 - 128)));
  dequantize(ggml_type::q8_0, q8_0, out);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], (j * 8 - 128) * 0.5f) << j;
}

}  // namespace
}  // namespace pagedkv::llama

namespace pagedkv::llama {
namespace {

// The fuzz seeds (tools/make_fuzz_seeds.py) must be files that parse all the way, or fuzzing would
// start from inputs rejected at the first check.
TEST(gguf, fuzz_seeds_parse_fully) {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(PAGEDKV_GOLDEN_DIR) + "/../../fuzz/corpus/gguf")) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().string());
    const auto file = gguf_file::open(entry.path());
    EXPECT_EQ(file.tensors().size(), 6u);
    for (const auto& tensor : file.tensors()) {
      const auto values = file.dequantize(tensor);
      // Every tensor holds the same 2 x 64 standard-normal values at its type's precision.
      EXPECT_EQ(values.size() % 64, 0u);
      EXPECT_LT(std::abs(values[1] - file.dequantize("output_norm.weight")[1]), 0.3f) << tensor.name;
    }
    EXPECT_EQ(config_from_gguf(file).num_kv_heads, 2);
    EXPECT_FALSE(tokenizer::from_gguf(file).encode("Hello world").empty());
    ++seen;
  }
  EXPECT_EQ(seen, 2);
}

}  // namespace
}  // namespace pagedkv::llama
