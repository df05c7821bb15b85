// RoPE tables (inverse frequencies and attention factor) against Hugging Face's formulas, and the
// rotation itself. The expected numbers come from tests/runner/tools/rope_reference.py, a numpy
// transcription of transformers 5.17's modeling_rope_utils.py in float32 as torch evaluates it,
// run on the configs of hf5_rope_configs.hpp (and two full-size ones built here).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hf5_rope_configs.hpp"
#include "llama_config.hpp"
#include "rope.hpp"

namespace pagedkv::llama {
namespace {

// powf may differ by an ulp between C libraries; the rest of the arithmetic is exact float32.
void expect_table(const rope_table& table, const std::vector<float>& inv_freq, float attention_factor) {
  ASSERT_EQ(table.inv_freq.size(), inv_freq.size());
  for (std::size_t i = 0; i < inv_freq.size(); ++i)
    EXPECT_NEAR(table.inv_freq[i], inv_freq[i], 2.5e-7f * inv_freq[i]) << "frequency " << i;
  EXPECT_FLOAT_EQ(table.attention_factor, attention_factor);
}

rope_table table_of(const char* json) { return make_rope_table(config_from_hf_json(json, "config.json")); }

TEST(rope_table, default_and_linear) {
  expect_table(table_of(test::hf5_default_config),
               {1.0f, 0.316227764f, 0.100000001f, 0.0316227786f, 0.00999999978f, 0.00316227786f, 0.00100000005f,
                0.000316227786f},
               1.0f);
  expect_table(table_of(test::hf5_linear_config),
               {0.5f, 0.158113882f, 0.0500000007f, 0.0158113893f, 0.00499999989f, 0.00158113893f, 0.000500000024f,
                0.000158113893f},
               1.0f);
}

TEST(rope_table, llama3) {
  // theta 500000, head_dim 16, factor 8, low/high 1/4, original 1024: three high frequencies kept,
  // one smoothed, four divided by 8
  expect_table(table_of(test::hf5_llama3_config),
               {1.0f, 0.193922758f, 0.0376060307f, 0.00131256948f, 0.000176776681f, 3.42810235e-05f, 6.64787058e-06f,
                1.28917316e-06f},
               1.0f);
  // Llama 3.1 8B: head_dim 128, theta 500000, factor 8, low/high 1/4, original 8192
  llama_config c = config_from_hf_json(test::hf5_llama3_config, "config.json");
  c.head_dim = c.rope_dim = 128;
  c.rope_scaling.original_context_length = 8192;
  expect_table(make_rope_table(c),
               {1.0f, 0.814617217f, 0.66360122f, 0.540580988f, 0.440366626f, 0.358730227f, 0.292227805f, 0.238053843f,
                0.193922758f, 0.157972813f, 0.128687382f, 0.10483095f, 0.0853971019f, 0.0695659518f, 0.0566696189f,
                0.046164047f, 0.0376060307f, 0.0306345206f, 0.0249554086f, 0.0203291047f, 0.0165604409f,
                0.0134904208f, 0.0109895291f, 0.00895225909f, 0.00729266508f, 0.00594072975f, 0.00483942125f,
                0.00394227589f, 0.00321144611f, 0.00216657063f, 0.00137189368f, 0.00085675146f, 0.000524846022f,
                0.00031269365f, 0.000178507791f, 9.5562129e-05f, 7.78465546e-05f, 6.34151438e-05f, 5.16590735e-05f,
                4.20823671e-05f, 3.42810235e-05f, 2.79259093e-05f, 2.27489272e-05f, 1.85316694e-05f, 1.50962178e-05f,
                1.22976389e-05f, 1.00178677e-05f, 8.1607277e-06f, 6.64787058e-06f, 5.41546933e-06f, 4.41153452e-06f,
                3.59371234e-06f, 2.92749974e-06f, 2.38479174e-06f, 1.94269251e-06f, 1.58255079e-06f, 1.28917316e-06f,
                1.05018262e-06f, 8.55496921e-07f, 6.96902532e-07f, 5.6770881e-07f, 4.6246538e-07f, 3.76732288e-07f,
                3.06892588e-07f},
               1.0f);
}

TEST(rope_table, yarn) {
  // factor 4, original 1024, beta 32/1, mscale 1 / mscale_all_dim 0.5, truncated ramp over dims 1..5
  expect_table(table_of(test::hf5_yarn_config),
               {1.0f, 0.316227764f, 0.0812500045f, 0.0197642371f, 0.00437500002f, 0.000790569466f, 0.000250000012f,
                7.90569466e-05f},
               1.0648216f);
  // explicit attention_factor 0.9, truncate false: the ramp runs over dims 1.41..4.42
  expect_table(table_of(test::hf5_yarn_attention_factor_config),
               {1.0f, 0.316227764f, 0.0853986368f, 0.0191267766f, 0.00355697144f, 0.000790569466f, 0.000250000012f,
                7.90569466e-05f},
               0.899999976f);
  // Qwen2.5-style: head_dim 128, theta 1e6, factor 4, original 32768, the rest defaults
  llama_config c = config_from_hf_json(test::hf5_yarn_config, "config.json");
  c.head_dim = c.rope_dim = 128;
  c.rope_theta = 1000000.0;
  c.rope_scaling = rope_scaling_config{};
  c.rope_scaling.type = rope_scaling_type::yarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_context_length = 32768;
  c.rope_scaling.attention_factor = 0.1 * std::log(4.0) + 1.0;  // get_mscale(4)
  expect_table(make_rope_table(c),
               {1.0f, 0.805842221f, 0.649381638f, 0.523299098f, 0.421696514f, 0.339820832f, 0.273841977f, 0.220673397f,
                0.177827939f, 0.143301263f, 0.115478203f, 0.0930572003f, 0.0749894157f, 0.0604296438f, 0.0486967526f,
                0.0392418988f, 0.0316227786f, 0.0254829675f, 0.0205352493f, 0.0165481716f, 0.0133352149f,
                0.0107460786f, 0.00865964312f, 0.00697830599f, 0.00537532149f, 0.0041317381f, 0.00316842273f,
                0.00242342241f, 0.00184827659f, 0.00140511245f, 0.00106436107f, 0.000802959781f, 0.000602941145f,
                0.000450323569f, 0.000334240554f, 0.000246258394f, 0.000179841183f, 0.00012993149f, 9.26230132e-05f,
                6.4903943e-05f, 4.44569851e-05f, 3.58253128e-05f, 2.88695519e-05f, 2.32642997e-05f, 1.87473561e-05f,
                1.51074091e-05f, 1.21741887e-05f, 9.81047469e-06f, 7.90569356e-06f, 6.37074254e-06f, 5.13381246e-06f,
                4.13704265e-06f, 3.33380399e-06f, 2.68651957e-06f, 2.16491071e-06f, 1.74457637e-06f, 1.40585337e-06f,
                1.13289593e-06f, 9.12935377e-07f, 7.35681851e-07f, 5.92843435e-07f, 4.7773824e-07f, 3.84981632e-07f,
                3.10234441e-07f},
               1.13862944f);
}

TEST(rope_table, gguf_frequency_divisors_divide_the_frequencies) {
  llama_config c = config_from_hf_json(test::hf5_default_config, "config.json");
  const rope_table plain = make_rope_table(c);
  c.rope_scaling.frequency_divisors = {1.0f, 1.0f, 1.0f, 2.5f, 8.0f, 8.0f, 8.0f, 8.0f};
  const rope_table divided = make_rope_table(c);
  for (std::size_t i = 0; i < plain.inv_freq.size(); ++i)
    EXPECT_EQ(divided.inv_freq[i], plain.inv_freq[i] / c.rope_scaling.frequency_divisors[i]);
}

TEST(rope, rotates_each_pair_by_its_angle_scaled_by_the_attention_factor) {
  const rope_table table{.inv_freq = {1.0f, 0.25f}, .attention_factor = 2.0f};
  const std::vector<std::int32_t> positions = {0, 3};
  rope_angles angles;
  compute_rope_angles(table, positions.data(), 2, angles);
  ASSERT_EQ(angles.half_dim, 2);
  // two tokens, two heads of head_dim 6 (rope_dim 4: the last two dimensions pass through)
  std::vector<float> x(2 * 2 * 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.5f + float(i);
  const std::vector<float> before = x;
  apply_rope(x.data(), 2, 2, 6, angles);
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h) {
      const std::size_t head = std::size_t((t * 2 + h) * 6);
      for (int i = 0; i < 2; ++i) {
        const double angle = double(table.inv_freq[std::size_t(i)] * float(positions[std::size_t(t)]));
        const double a = before[head + std::size_t(i)], b = before[head + std::size_t(i) + 2];
        EXPECT_NEAR(x[head + std::size_t(i)], 2.0 * (a * std::cos(angle) - b * std::sin(angle)), 1e-4);
        EXPECT_NEAR(x[head + std::size_t(i) + 2], 2.0 * (b * std::cos(angle) + a * std::sin(angle)), 1e-4);
      }
      EXPECT_EQ(x[head + 4], before[head + 4]);
      EXPECT_EQ(x[head + 5], before[head + 5]);
    }
}

}  // namespace
}  // namespace pagedkv::llama
