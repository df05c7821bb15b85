// libFuzzer target: any bytes as a safetensors file, and (the same bytes) as a config.json.
// Parsing and converting every tensor must either work or throw load_error.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "llama_config.hpp"
#include "load_error.hpp"
#include "safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pagedkv::llama;
  try {
    const auto file = safetensors_file::parse(std::vector<std::uint8_t>(data, data + size), "fuzz.safetensors");
    for (const auto& tensor : file.tensors()) {
      if (tensor.dtype == safetensors_dtype::f32 || tensor.dtype == safetensors_dtype::f16 || tensor.dtype == safetensors_dtype::bf16)
        (void)file.to_float(tensor);
    }
  } catch (const load_error&) {
  }
  try {
    (void)config_from_hf_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const load_error&) {
  }
  return 0;
}
