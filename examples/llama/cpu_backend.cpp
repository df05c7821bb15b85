#include "cpu_backend.hpp"

#include <utility>
#include <vector>

#include <pagedkv/error.hpp>
#include <pagedkv/reference/cache_ops.hpp>

namespace pagedkv::llama {

using pagedkv::detail::fail;

cpu_backend::cpu_backend(const llama_config& config, const llama_weights& weights, kernels::dtype kv_dtype)
    : config_(config), weights_(weights) {
  if (kv_dtype != kernels::dtype::f32)
    fail(errc::invalid_argument, "the cpu backend stores its KV cache in f32, not ", kernels::to_string(kv_dtype));
}

kernels::kv_cache_layout cpu_backend::kv_layout(std::int32_t num_blocks, std::int32_t block_size) const {
  return paged_kv_cache_layout(config_, num_blocks, block_size);
}

void cpu_backend::allocate_kv_cache(const kv_cache_options& kv) {
  device_cache_ = make_paged_kv_cache(config_, kv.num_device_blocks, kv.block_size);
  host_cache_ = kv.num_host_blocks > 0 ? make_paged_kv_cache(config_, kv.num_host_blocks, kv.block_size) : paged_kv_cache{};
}

std::span<const float> cpu_backend::execute(const step_plan& plan) {
  if (device_cache_.data.empty()) fail(errc::invalid_argument, "cpu_backend::execute before allocate_kv_cache");
  move_blocks(plan);
  prepare(plan);
  return forward(config_, weights_, device_cache_, batch_, state_);
}

/// The plan's block moves, in its order: swap out, swap in, copy-on-write.
void cpu_backend::move_blocks(const step_plan& plan) {
  const auto pairs = [](const std::vector<block_copy>& copies) {
    std::vector<std::pair<block_id, block_id>> out;
    for (const block_copy& c : copies) out.emplace_back(c.src, c.dst);
    return out;
  };
  if ((!plan.swap_out.empty() || !plan.swap_in.empty()) && host_cache_.data.empty())
    fail(errc::invalid_argument, "cpu_backend: the plan swaps, but the KV cache has no host pool");
  if (!plan.swap_out.empty())
    kernels::reference::swap_blocks(device_cache_.layout, device_cache_.data.data(), host_cache_.layout,
                                    host_cache_.data.data(), pairs(plan.swap_out));
  if (!plan.swap_in.empty())
    kernels::reference::swap_blocks(host_cache_.layout, host_cache_.data.data(), device_cache_.layout,
                                    device_cache_.data.data(), pairs(plan.swap_in));
  if (!plan.copies.empty()) {
    std::vector<block_id> flat;
    for (const block_copy& c : plan.copies) flat.insert(flat.end(), {c.src, c.dst});
    kernels::reference::copy_blocks({.pairs = flat.data(), .pool = device_cache_.data.data(),
                                     .layout = device_cache_.layout, .num_pairs = std::int32_t(plan.copies.size())});
  }
}

/// The forward batch of the plan: each chunk's tokens, positions and slots, its row of the
/// plan's tables and, where it produces logits, its last token's row.
void cpu_backend::prepare(const step_plan& plan) {
  forward_batch& b = batch_;
  b = forward_batch{};
  for (const scheduled_sequence& q : plan.batch) {
    for (std::int32_t i = 0; i < q.num_tokens; ++i) {
      b.tokens.push_back(plan.input_tokens[q.slot_offset + std::size_t(i)]);
      b.positions.push_back(q.first_position + i);
    }
    b.q_indptr.push_back(b.num_tokens());
    if (q.produces_logits) b.logit_rows.push_back(b.num_tokens() - 1);
  }
  // Each KV cache group's slots and tables, group after group, as the plan holds them.
  b.num_groups = plan.num_groups;
  for (std::int32_t g = 0; g < plan.num_groups; ++g) {
    const std::span<const slot_id> slots = plan.group_slots(g);
    for (const scheduled_sequence& q : plan.batch)
      b.slot_mapping.insert(b.slot_mapping.end(), slots.begin() + std::ptrdiff_t(q.slot_offset),
                            slots.begin() + std::ptrdiff_t(q.slot_offset) + q.num_tokens);
  }
  b.kv_lens = plan.kv_lens;
  b.block_table = plan.block_tables;
  b.max_blocks_per_seq = plan.max_blocks_per_seq;
}

}  // namespace pagedkv::llama
