#include "rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pagedkv::llama {
namespace {

// Python scalars meet float32 tensors in these formulas. torch casts the scalar to float32 first,
// and evaluates `scalar / tensor` as reciprocal(tensor) * scalar (Tensor.__rtruediv__): two
// roundings, which these helpers keep.
float f32(double scalar) { return static_cast<float>(scalar); }
float rdiv(double scalar, float tensor) { return (1.0f / tensor) * f32(scalar); }

// base ** (arange(0, dim, 2).float() / dim) of every formula: [dim / 2] float32.
std::vector<float> base_powers(double base, std::int64_t dim) {
  std::vector<float> powers(static_cast<std::size_t>(dim / 2));
  for (std::size_t i = 0; i < powers.size(); ++i)
    powers[i] = std::pow(f32(base), static_cast<float>(2 * i) / static_cast<float>(dim));
  return powers;
}

// _compute_llama3_parameters: low frequencies divided by factor, high ones kept, a smooth blend
// between the two wavelengths.
std::vector<float> llama3_inv_freq(const llama_config& c) {
  const rope_scaling_config& r = c.rope_scaling;
  const double old_context = double(r.original_context_length);
  const float low_freq_wavelen = f32(old_context / r.low_freq_factor);
  const float high_freq_wavelen = f32(old_context / r.high_freq_factor);
  std::vector<float> inv_freq = base_powers(c.rope_theta, c.rope_dim);
  for (float& f : inv_freq) {
    f = 1.0f / f;
    const float wavelen = rdiv(2.0 * std::numbers::pi, f);
    const float llama = wavelen > low_freq_wavelen ? f / f32(r.factor) : f;
    const float smooth = (rdiv(old_context, wavelen) - f32(r.low_freq_factor)) / f32(r.high_freq_factor - r.low_freq_factor);
    const float smoothed = (1.0f - smooth) * llama / f32(r.factor) + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv_freq;
}

// _compute_yarn_parameters: dimensions that turn fewer than beta_slow times over the original
// context interpolate (divide by factor), those past beta_fast extrapolate (keep), a linear ramp
// between. The correction range is Python double arithmetic.
std::vector<float> yarn_inv_freq(const llama_config& c) {
  const rope_scaling_config& r = c.rope_scaling;
  const double dim = double(c.rope_dim);
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(double(r.original_context_length) / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(c.rope_theta));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // Hugging Face's guard against a zero-width ramp

  std::vector<float> inv_freq = base_powers(c.rope_theta, c.rope_dim);
  for (std::size_t i = 0; i < inv_freq.size(); ++i) {
    const float pos_freq = inv_freq[i];
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (f32(r.factor) * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - f32(low)) / f32(high - low), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv_freq;
}

}  // namespace

rope_table make_rope_table(const llama_config& config) {
  rope_table table;
  switch (config.rope_scaling.type) {
    case rope_scaling_type::none:
    case rope_scaling_type::linear:
      table.inv_freq = base_powers(config.rope_theta, config.rope_dim);
      for (float& f : table.inv_freq) f = 1.0f / f;
      if (config.rope_scaling.type == rope_scaling_type::linear)
        for (float& f : table.inv_freq) f /= f32(config.rope_scaling.factor);
      for (std::size_t i = 0; i < std::min(table.inv_freq.size(), config.rope_scaling.frequency_divisors.size()); ++i)
        table.inv_freq[i] /= config.rope_scaling.frequency_divisors[i];
      break;
    case rope_scaling_type::llama3: table.inv_freq = llama3_inv_freq(config); break;
    case rope_scaling_type::yarn:
      table.inv_freq = yarn_inv_freq(config);
      table.attention_factor = f32(config.rope_scaling.attention_factor);
      break;
  }
  return table;
}

void compute_rope_angles(const rope_table& table, const std::int32_t* positions, std::int64_t num_tokens,
                         rope_angles& out) {
  const auto half = static_cast<std::int64_t>(table.inv_freq.size());
  out.half_dim = half;
  out.cos.resize(static_cast<std::size_t>(num_tokens * half));
  out.sin.resize(static_cast<std::size_t>(num_tokens * half));
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const auto position = static_cast<float>(positions[t]);
    for (std::int64_t i = 0; i < half; ++i) {
      const float angle = table.inv_freq[std::size_t(i)] * position;
      // cos and sin of the float32 angle, rounded once; then `* attention_scaling` in float32.
      out.cos[std::size_t(t * half + i)] = static_cast<float>(std::cos(double(angle))) * table.attention_factor;
      out.sin[std::size_t(t * half + i)] = static_cast<float>(std::sin(double(angle))) * table.attention_factor;
    }
  }
}

void apply_rope(float* x, std::int64_t num_tokens, std::int64_t num_heads, std::int64_t head_dim,
                const rope_angles& angles) {
  const std::int64_t half = angles.half_dim;
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const float* cos = angles.cos.data() + t * half;
    const float* sin = angles.sin.data() + t * half;
    for (std::int64_t h = 0; h < num_heads; ++h) {
      float* head = x + (t * num_heads + h) * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        // q * cos + rotate_half(q) * sin, each product rounded before the sum as torch does
        const float a = head[i], b = head[i + half];
        head[i] = a * cos[i] - b * sin[i];
        head[i + half] = b * cos[i] + a * sin[i];
      }
    }
  }
}

}  // namespace pagedkv::llama
