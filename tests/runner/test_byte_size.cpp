// parse_byte_size (--kv-cache-memory) and the KV cache sizing it feeds: units, case, overflow at
// 2^64, zero and garbage; blocks from bytes against the layout's own byte count.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "byte_size.hpp"
#include "model.hpp"
#include "model_backend.hpp"
#include "tiny_llama.hpp"

namespace {

using namespace pagedkv::llama;

TEST(byte_size, plain_numbers_are_bytes) {
  EXPECT_EQ(parse_byte_size("1000000"), 1000000u);
  EXPECT_EQ(parse_byte_size("1"), 1u);
  EXPECT_EQ(parse_byte_size("7B"), 7u);
  EXPECT_EQ(parse_byte_size("007"), 7u);
}

TEST(byte_size, decimal_and_binary_units_in_any_case) {
  EXPECT_EQ(parse_byte_size("3kB"), 3000u);
  EXPECT_EQ(parse_byte_size("3KB"), 3000u);
  EXPECT_EQ(parse_byte_size("5MB"), 5000000u);
  EXPECT_EQ(parse_byte_size("2GB"), 2000000000u);
  EXPECT_EQ(parse_byte_size("1TB"), 1000000000000u);
  EXPECT_EQ(parse_byte_size("3KiB"), 3u * 1024);
  EXPECT_EQ(parse_byte_size("512MiB"), 512u << 20);
  EXPECT_EQ(parse_byte_size("512mib"), 512u << 20);
  EXPECT_EQ(parse_byte_size("512 MiB"), 512u << 20);
  EXPECT_EQ(parse_byte_size("2GiB"), std::uint64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("3TiB"), std::uint64_t{3} << 40);
}

TEST(byte_size, the_largest_size_parses_and_one_more_overflows) {
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(parse_byte_size(std::to_string(max)), max);
  EXPECT_THROW(parse_byte_size("18446744073709551616"), std::invalid_argument);  // 2^64
  EXPECT_THROW(parse_byte_size("99999999999999999999999"), std::invalid_argument);
  EXPECT_EQ(parse_byte_size("16777215TiB"), max - (std::uint64_t{1} << 40) + 1);  // (2^24 - 1) * 2^40
  EXPECT_THROW(parse_byte_size("16777216TiB"), std::invalid_argument);  // exactly 2^64
  EXPECT_THROW(parse_byte_size("18446744073709551615kB"), std::invalid_argument);
}

TEST(byte_size, zero_and_garbage_are_rejected_with_the_text_quoted) {
  for (const char* text : {"0", "0GiB", "", " ", "GiB", "-1", "+1", "1.5GiB", "1e9", "12XB", "1 G", "1K", "1GiBs",
                           "0x10", " 1MiB", "1MiB 2"}) {
    try {
      parse_byte_size(text);
      ADD_FAILURE() << "'" << text << "' parsed";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("'" + std::string(text) + "'"), std::string::npos) << error.what();
    }
  }
}

TEST(byte_size, format_uses_binary_units) {
  EXPECT_EQ(format_byte_size(512), "512 B");
  EXPECT_EQ(format_byte_size(1536), "1.5 KiB");
  EXPECT_EQ(format_byte_size(720u << 20), "720.0 MiB");
  EXPECT_EQ(format_byte_size(std::uint64_t{3} << 40), "3.0 TiB");
}

TEST(kv_cache_sizing, blocks_for_bytes_match_the_cache_the_engine_allocates) {
  const test::tiny_model& model = test::shared_tiny_model();  // 2 layers, 2 KV heads, head_dim 8
  const std::unique_ptr<model_backend> cpu = make_model_backend(model.config, model.weights, {.device = "cpu"});
  for (const std::int32_t block_size : {1, 3, 16, 17}) {
    const std::size_t per_block = kv_bytes_per_block(*cpu, block_size);
    EXPECT_EQ(per_block, std::size_t(2 * 2 * 2 * 8) * sizeof(float) * std::size_t(block_size));
    EXPECT_EQ(kv_blocks_for_bytes(*cpu, block_size, per_block - 1), 0);
    EXPECT_EQ(kv_blocks_for_bytes(*cpu, block_size, per_block), 1);
    EXPECT_EQ(kv_blocks_for_bytes(*cpu, block_size, 37 * per_block + per_block - 1), 37);
    const paged_kv_cache cache = make_paged_kv_cache(model.config, 37, block_size);
    EXPECT_EQ(cache.data.size() * sizeof(float), 37 * per_block);
  }
  EXPECT_EQ(kv_blocks_for_bytes(*cpu, 16, std::numeric_limits<std::uint64_t>::max()), pagedkv::max_num_blocks);
}

}  // namespace
