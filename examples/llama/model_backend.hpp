// The seam between the engine and a model: the engine plans each step with pagedkv::scheduler and
// hands the plan to a backend, which owns the weights on its device, the KV pools (device, and
// host for swap), its scratch state and threads, and turns the plan into a forward. The engine
// never knows which backend runs; the backend is chosen at run time by name.
//
//   std::unique_ptr<model_backend> b = make_model_backend(config, weights, {.device = "cpu"});
//   options.num_blocks = kv_blocks_for_bytes(*b, options.block_size, 512 << 20);
//   engine e(std::move(b), &tok, options);  // allocates the pools: allocate_kv_cache
//
// A backend executes a step_plan in the order it states: swap_out copies (device -> host),
// swap_in copies (host -> device), copy-on-write copies (device -> device), then the forward of
// plan.batch, which writes each input token's K/V at its slot and reads each sequence's K/V
// through its row of plan.block_tables, up to plan.kv_lens. It returns one row of logits for each
// scheduled sequence that produces_logits, in batch order (execute), or what sampling those rows
// chooses (execute_sampled: sampling.hpp), so that no logits cross from a device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pagedkv/kv_cache_manager.hpp>
#include <pagedkv/kv_cache_spec.hpp>
#include <pagedkv/kv_dtype.hpp>
#include <pagedkv/kv_layout.hpp>
#include <pagedkv/scheduler.hpp>

#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "sampling.hpp"

namespace pagedkv::llama {

class model_backend {
 public:
  virtual ~model_backend() = default;

  /// Rows of logits are this long.
  [[nodiscard]] virtual std::int64_t vocab_size() const noexcept = 0;

  /// The model's KV cache groups, which the engine's manager keeps a block table each for: one
  /// full-attention group unless some layers have a sliding window (attention_groups_of). The
  /// plan's num_groups equals their count.
  [[nodiscard]] virtual std::vector<kv_cache_spec> kv_cache_groups() const { return {kv_cache_spec::full_attention()}; }

  /// The layout of this backend's KV pools for num_blocks blocks of block_size tokens: shape,
  /// element order and KV dtype. KV sizing follows from it (kv_bytes_per_block below).
  /// Errors: pagedkv::error (invalid_argument) for a block size the backend cannot hold.
  [[nodiscard]] virtual kernels::kv_cache_layout kv_layout(std::int32_t num_blocks, std::int32_t block_size) const = 0;

  /// Allocates (or reallocates, zeroed) the KV pools the scheduler's manager addresses: the
  /// manager's options are the one source of the block size and both pools' block counts.
  /// Errors: pagedkv::error (invalid_argument) for sizes the backend cannot hold; what the
  /// allocation throws when memory is short.
  virtual void allocate_kv_cache(const kv_cache_options& kv) = 0;

  /// The largest steps the engine will plan: at most max_tokens tokens of at most max_seqs
  /// sequences, before or after allocate_kv_cache. A backend may size its step buffers here once,
  /// so that no step has to grow them (on a GPU a growth frees memory, which waits for the device,
  /// and under tensor parallelism may stall a peer mid-collective); this default only checks the
  /// sizes. Steps larger than this still run. Errors: pagedkv::error (invalid_argument) for a size
  /// below 1, before anything changes (check_reserve_steps); what the allocation throws when
  /// memory is short.
  virtual void reserve_steps(std::int32_t max_tokens, std::int32_t max_seqs);

  /// Runs one step: the plan's block moves, then its forward. Returns logits
  /// [number of plan.batch entries that produce_logits, vocab_size()], valid until the next call.
  /// Errors: pagedkv::error (invalid_argument) for a plan before allocate_kv_cache or one that
  /// does not fit the pools.
  virtual std::span<const float> execute(const step_plan& plan) = 0;

  /// Runs the step as execute does, then samples its logits rows as `sampling` says (sampling.hpp's
  /// definition): each draw's token and log-probability, each row's candidates. This default runs
  /// sample_rows() over execute()'s rows; a device backend samples where the rows are.
  /// Errors: as execute; pagedkv::error (invalid_argument) for a batch that check_sampling_batch
  /// refuses, before anything runs.
  virtual step_samples execute_sampled(const step_plan& plan, const sampling_batch& sampling);

  /// Starts the step as execute_sampled runs it, returning before its results are known, so that
  /// the host can plan the next step meanwhile (asynchronous scheduling); collect_sampled()
  /// returns them, in launch order, with at most two launched steps uncollected.
  /// `token_sources` is empty, or has one entry per plan.input_tokens: an entry i >= 0 says that
  /// this input token is draw i of the previously launched step (kept where it was drawn: no round
  /// trip to the host), and plan.input_tokens holds a stand-in there.
  /// This default runs execute_sampled at once and keeps copies of its results; a device backend
  /// enqueues the step and returns.
  /// Errors: as execute_sampled; pagedkv::error (invalid_argument) for a third uncollected step,
  /// token_sources of another length, or a source that is not a draw of the previous step.
  virtual void launch_sampled(const step_plan& plan, const sampling_batch& sampling,
                              std::span<const std::int32_t> token_sources = {});
  /// The oldest uncollected launched step's results, waiting for them; views valid until the
  /// next call. Errors: pagedkv::error (invalid_argument) when no step is uncollected.
  virtual step_samples collect_sampled();

 protected:
  std::vector<sampled_token> draws_, candidates_;  ///< execute_sampled's results, valid until the next call

 private:
  struct launched_samples {
    std::vector<sampled_token> draws, candidates;
  };
  std::vector<launched_samples> launched_;  ///< launch_sampled's results, oldest first (the default's)
  std::vector<sampled_token> previous_draws_;
  launched_samples collected_;
};

/// Checks reserve_steps's sizes: pagedkv::error (invalid_argument) naming both where either is
/// below 1.
void check_reserve_steps(std::int32_t max_tokens, std::int32_t max_seqs);

/// Checks launch_sampled's token_sources against the plan and the previous step's draw count.
/// Errors: pagedkv::error (invalid_argument) naming the entry.
void check_token_sources(const step_plan& plan, std::span<const std::int32_t> token_sources,
                         std::size_t previous_draws);

/// Bytes one block of block_size tokens takes in the backend's device pool: every layer's K and V.
std::size_t kv_bytes_per_block(const model_backend& backend, std::int32_t block_size);

/// The most blocks of block_size tokens the backend's device pool can have within budget_bytes
/// (kernels::blocks_for_budget): 0 when not even one fits, never more than max_num_blocks.
std::int32_t kv_blocks_for_bytes(const model_backend& backend, std::int32_t block_size, std::uint64_t budget_bytes);

struct backend_options {
  std::string device = "cpu";                  ///< one of model_backend_devices()
  std::optional<kernels::dtype> kv_dtype{};    ///< element type of the KV pools; by default the
                                               ///< device's own: f32 on the cpu, bf16 on cuda
  bool enforce_eager = false;                  ///< cuda: launch every step's kernels, replaying no
                                               ///< captured decode graphs (vLLM's --enforce-eager)
};

/// The names make_model_backend accepts.
std::span<const std::string_view> model_backend_devices() noexcept;

/// The backend named by options.device for this model; config and weights must outlive it.
/// Errors: pagedkv::error (invalid_argument) naming an unknown device, or a KV dtype the device's
/// backend does not store.
std::unique_ptr<model_backend> make_model_backend(const llama_config& config, const llama_weights& weights,
                                                  const backend_options& options = {});

}  // namespace pagedkv::llama
