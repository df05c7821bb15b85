// Host reference of merge_states. Same params as the CUDA version, host pointers.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../kv_dtype.hpp"
#include "../merge_params.hpp"

namespace pagedkv::kernels::reference {

/// o and lse of each row from its num_states states (merge_states_params), in fp32 as the kernel
/// computes them; a row is read whole before it is written, so o and lse may be state 0's.
/// Throws errc::invalid_argument on bad params.
inline void merge_states(const merge_states_params& p) {
  check(p);
  host::visit_dtype(p.o_dtype, [&]<class T>() {
    const auto* in = static_cast<const T*>(p.o_in);
    auto* out = static_cast<T*>(p.o);
    std::vector<float> weight(std::size_t(p.num_states)), row(std::size_t(p.head_dim));
    for (std::int64_t r = 0; r < p.num_rows; ++r) {
      float m = -std::numeric_limits<float>::infinity();
      for (std::int32_t s = 0; s < p.num_states; ++s) m = std::fmax(m, p.lse_in[s * p.lse_stride() + r]);
      float sum = 0.0f;
      for (std::int32_t s = 0; s < p.num_states; ++s) {
        const float lse = p.lse_in[s * p.lse_stride() + r];
        weight[std::size_t(s)] = std::isinf(lse) && lse < 0 ? 0.0f : std::exp(lse - m);
        sum += weight[std::size_t(s)];
      }
      for (std::int32_t d = 0; d < p.head_dim; ++d) {
        float acc = 0.0f;
        for (std::int32_t s = 0; s < p.num_states; ++s)
          acc += weight[std::size_t(s)] * host::to_float(in[s * p.o_stride() + r * p.head_dim + d]);
        row[std::size_t(d)] = sum > 0.0f ? acc / sum : 0.0f;
      }
      for (std::int32_t d = 0; d < p.head_dim; ++d) out[r * p.head_dim + d] = host::from_float<T>(row[std::size_t(d)]);
      if (p.lse) p.lse[r] = sum > 0.0f ? m + std::log(sum) : -std::numeric_limits<float>::infinity();
    }
  });
}

}  // namespace pagedkv::kernels::reference
