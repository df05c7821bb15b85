#include <pagedkv/error.hpp>

#include <gtest/gtest.h>

namespace pagedkv {
namespace {

TEST(Error, MessageNamesTheProblemAndCarriesTheCode) {
  try {
    detail::fail(errc::invalid_block, "release of block ", 42, ": capacity is ", 8);
    FAIL() << "fail() returned";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::invalid_block);
    EXPECT_STREQ(e.what(), "pagedkv: release of block 42: capacity is 8");
  }
}

TEST(Error, EveryCodeHasAName) {
  for (auto code : {errc::out_of_blocks, errc::invalid_argument, errc::invalid_block,
                    errc::no_references, errc::unknown_sequence, errc::duplicate_sequence,
                    errc::wrong_location, errc::buffer_too_small, errc::pin_budget_exceeded}) {
    EXPECT_NE(to_string(code), "unknown");
  }
}

}  // namespace
}  // namespace pagedkv
