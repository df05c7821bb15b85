// How a request samples: length, temperature, top-k/top-p, seed, n samples or a beam width, stop
// strings. The engine's sampler reads it; the scheduler sees only n, the beam width and the length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagedkv::llama {

struct sampling_params {
  std::int32_t max_tokens = 16;       ///< generated tokens per sample or beam
  float temperature = 0.0f;           ///< <= 0: greedy (argmax, lowest id on a tie)
  std::int32_t top_k = 0;             ///< keep the k most likely tokens; 0: all
  float top_p = 1.0f;                 ///< keep the smallest set whose probability reaches top_p
  std::uint64_t seed = 0;             ///< each request has its own generator seeded with this
  std::int32_t n = 1;                 ///< parallel samples sharing the prompt's blocks
  std::int32_t beam_width = 0;        ///< > 0: beam search of this width (n is ignored)
  std::vector<std::string> stop{};    ///< stop strings (need the engine's tokenizer); not in the text
  bool ignore_eos = false;
  /// > 0: record each generated token's top_logprobs most likely alternatives (completion::top_logprobs).
  /// The backend returns them as each row's candidates (execute_sampled): no logits cross.
  std::int32_t top_logprobs = 0;
};

}  // namespace pagedkv::llama
