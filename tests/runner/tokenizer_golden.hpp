// Reads tests/runner/golden/tokenizer_cases.json (written by tools/make_golden.py) and checks a
// tokenizer against one of its sections: ids equal to Hugging Face tokenizers' on every string,
// and decode() equal to HF's decode.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer.hpp"

namespace pagedkv::llama::testing {

inline const nlohmann::json& tokenizer_golden() {
  static const nlohmann::json golden = [] {
    std::ifstream in(std::string(PAGEDKV_GOLDEN_DIR) + "/tokenizer_cases.json");
    if (!in) throw std::runtime_error("missing tests/runner/golden/tokenizer_cases.json");
    return nlohmann::json::parse(in);
  }();
  return golden;
}

/// Returns how many cases matched; every mismatch is a test failure naming the string.
inline int expect_golden_ids(const tokenizer& tok, const std::string& section) {
  const auto& cases = tokenizer_golden().at(section);
  EXPECT_GE(cases.size(), 40u);
  int matched = 0;
  for (const auto& c : cases) {
    const auto text = c.at("text").get<std::string>();
    SCOPED_TRACE(section + ": " + nlohmann::json(text).dump());
    const auto expected = c.at("ids").get<std::vector<token_id>>();
    const auto ids = tok.encode(text);
    EXPECT_EQ(ids, expected);
    // HF decodes to a Rust String, replacing invalid UTF-8 (a multi-byte character cut by a
    // dropped byte) with U+FFFD; ours returns the bytes. Compare where HF did not replace.
    const auto decoded = c.at("decoded").get<std::string>();
    if (decoded.find("\xEF\xBF\xBD") == std::string::npos || text.find("\xEF\xBF\xBD") != std::string::npos) {
      EXPECT_EQ(tok.decode(expected), decoded);
    }
    matched += ids == expected;
  }
  return matched;
}

}  // namespace pagedkv::llama::testing
