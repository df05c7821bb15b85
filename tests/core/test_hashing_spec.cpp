// docs/hashing.md's test vectors (docs/hashing_vectors.json, made by tools/block_hash.py, an
// independent implementation over the Python xxhash package) against the C++ prefix cache's hashes.
#include <pagedkv/prefix_cache.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace pagedkv {
namespace {

std::string hex(block_hash h) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

TEST(HashingSpec, TheCppChainMatchesEveryPublishedVector) {
  std::ifstream file(PAGEDKV_HASHING_VECTORS);
  ASSERT_TRUE(file) << "cannot read " << PAGEDKV_HASHING_VECTORS;
  const nlohmann::json doc = nlohmann::json::parse(file);
  ASSERT_GE(doc.at("vectors").size(), 10U);
  for (const nlohmann::json& v : doc.at("vectors")) {
    SCOPED_TRACE(v.at("name").get<std::string>());
    const block_hash seed = std::stoull(v.at("seed").get<std::string>(), nullptr, 16);
    const prefix_cache<> cache(1, v.at("block_size").get<std::int32_t>(), seed);
    const std::string salt = v.at("cache_salt").get<std::string>();
    const prefix_key key{.adapter_id = v.at("adapter_id").get<std::int64_t>(), .cache_salt = salt};
    EXPECT_EQ(hex(cache.root_hash(key)), v.at("root_hash").get<std::string>());
    const std::vector<token_id> tokens = v.at("tokens").get<std::vector<token_id>>();
    std::vector<block_hash> hashes;
    cache.extend_hashes(tokens, key, hashes);
    std::vector<std::string> got;
    for (block_hash h : hashes) got.push_back(hex(h));
    EXPECT_EQ(got, v.at("hashes").get<std::vector<std::string>>());
  }
}

}  // namespace
}  // namespace pagedkv
