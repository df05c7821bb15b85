#include "model_backend.hpp"

#include <algorithm>
#include <array>

#include <pagedkv/error.hpp>

#include "cpu_backend.hpp"

namespace pagedkv::llama {

std::size_t kv_bytes_per_block(const model_backend& backend, std::int32_t block_size) {
  return backend.kv_layout(1, block_size).bytes_per_block();
}

std::int32_t kv_blocks_for_bytes(const model_backend& backend, std::int32_t block_size, std::uint64_t budget_bytes) {
  const kernels::kv_cache_layout layout = backend.kv_layout(1, block_size);  // the count is ignored
  return kernels::blocks_for_budget(std::size_t(budget_bytes), layout.shape, layout.kv_dtype);
}

namespace {
constexpr std::array<std::string_view, 1> devices = {"cpu"};
}  // namespace

std::span<const std::string_view> model_backend_devices() noexcept { return devices; }

std::unique_ptr<model_backend> make_model_backend(const llama_config& config, const llama_weights& weights,
                                                  const backend_options& options) {
  if (options.device == "cpu") return std::make_unique<cpu_backend>(config, weights, options.kv_dtype);
  std::string known;
  for (const std::string_view d : devices) known += (known.empty() ? "" : ", ") + std::string(d);
  detail::fail(errc::invalid_argument, "no model backend for device '", options.device, "' (this build has: ", known,
               ")");
}

}  // namespace pagedkv::llama
