// Host conversions of the 16- and 8-bit element types: exhaustive round trips and rounding.
#include <gtest/gtest.h>

#include <cmath>

#include <pagedkv/kv_dtype.hpp>

namespace pk = pagedkv::kernels;
namespace host = pk::host;

TEST(KvDtype, F16RoundTripsEveryFiniteCode) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const host::f16 h{std::uint16_t(bits)};
    const float x = host::to_float(h);
    if (std::isnan(x)) continue;
    ASSERT_EQ(host::to_f16(x).bits, h.bits) << std::hex << bits;
  }
  EXPECT_EQ(host::to_f16(1.0f + 1.0f / 2048).bits, 0x3c00);          // tie to even
  EXPECT_EQ(host::to_f16(1.0f + 3.0f / 2048).bits, 0x3c02);          // tie to even, upward
  EXPECT_EQ(host::to_f16(65520.0f).bits, 0x7c00);                    // rounds to infinity
  EXPECT_EQ(host::to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);       // half the smallest subnormal, tie to 0
  EXPECT_EQ(host::to_f16(std::ldexp(1.5f, -24)).bits, 0x0002);
}

TEST(KvDtype, Bf16RoundTripsAndRoundsToEven) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const host::bf16 b{std::uint16_t(bits)};
    const float x = host::to_float(b);
    if (std::isnan(x)) continue;
    ASSERT_EQ(host::to_bf16(x).bits, b.bits);
  }
  EXPECT_EQ(host::to_bf16(1.0f + 1.0f / 256).bits, 0x3f80);
  EXPECT_EQ(host::to_bf16(1.0f + 3.0f / 256).bits, 0x3f82);
}

TEST(KvDtype, Fp8E4m3RoundTripsSaturatesAndRounds) {
  for (std::uint32_t bits = 0; bits < 0x100; ++bits) {
    const host::fp8_e4m3 e{std::uint8_t(bits)};
    const float x = host::to_float(e);
    if (std::isnan(x)) {
      EXPECT_EQ(bits & 0x7f, 0x7fu);
      continue;
    }
    ASSERT_EQ(host::to_fp8_e4m3(x).bits, e.bits) << bits;
  }
  EXPECT_EQ(host::to_float(host::fp8_e4m3{0x7e}), 448.0f);
  EXPECT_EQ(host::to_fp8_e4m3(1000.0f).bits, 0x7e);
  EXPECT_EQ(host::to_fp8_e4m3(-1e9f).bits, 0xfe);
  EXPECT_EQ(host::to_fp8_e4m3(INFINITY).bits, 0x7e);
  EXPECT_EQ(host::to_fp8_e4m3(1.0625f).bits, 0x38);  // 1 + 1/16: tie to even (1.0)
  EXPECT_EQ(host::to_fp8_e4m3(1.1875f).bits, 0x3a);  // 1 + 3/16: tie to even (1.25)
  EXPECT_EQ(host::to_float(host::fp8_e4m3{0x01}), std::ldexp(1.0f, -9));
}
