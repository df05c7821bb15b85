// The CUDA cache operations against their host references, byte for byte: write_kv (every
// dtype pair, padding slots, both layouts, strided rows, geometries from one head to 32 of
// head_dim 256), copy_blocks (every layer, pairs read on the device, block sizes 1 to 64, both
// layouts and layer orders), swap_blocks (device <-> pinned host, runs merged) and staged_swap
// (layer-major device pool <-> block-major pinned host through staging buffers, shuffled ids, odd
// sizes, buffers reused within a call, and captured into a CUDA graph).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include <pagedkv/cuda/cache_ops.cuh>
#include <pagedkv/cuda/staged_swap.cuh>
#include <pagedkv/reference/cache_ops.hpp>

#include "attention_case.hpp"
#include "gpu_test.cuh"

namespace pk = pagedkv::kernels;
using pk::cuda::device_buffer;

namespace {

class CacheOpsCuda : public ::testing::Test {
 protected:
  void SetUp() override { PAGEDKV_SKIP_WITHOUT_GPU(); }
  std::mt19937_64 rng{std::random_device{}()};
};

std::vector<unsigned char> random_bytes_of(pk::dtype t, std::size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> v(n * pk::size_of(t));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (std::size_t i = 0; i < n; ++i) pk::testing::store_as(t, v.data(), i, normal(rng));
  return v;
}

}  // namespace

// Geometries of the sweeps: (KV heads, head_dim). A write_kv thread handles 16-byte chunks in
// rounds of four of K and of V: 4 x 128 is one chunk a thread, 32 x 128 four (one round), 32 x
// 256 eight (two rounds), 5 x 80 and 1 x 64 leave threads idle. A copy_blocks CTA copies 32 KiB
// of a block: the larger blocks below take several CTAs, the last one partly.
constexpr std::pair<int, int> geometries[] = {{4, 128}, {32, 128}, {32, 256}, {5, 80}, {1, 64}};

TEST_F(CacheOpsCuda, WriteKvMatchesTheReferenceBitForBit) {
  int cases = 0;
  for (auto [heads, head_dim] : geometries)
    for (auto kind : {pk::kv_layout::nhd, pk::kv_layout::hnd})
      for (auto [src_t, pool_t] : {std::pair{pk::dtype::f32, pk::dtype::f32}, std::pair{pk::dtype::f16, pk::dtype::f16},
                                   std::pair{pk::dtype::bf16, pk::dtype::bf16}, std::pair{pk::dtype::bf16, pk::dtype::fp8_e4m3},
                                   std::pair{pk::dtype::f16, pk::dtype::fp8_e4m3}, std::pair{pk::dtype::f32, pk::dtype::fp8_e4m3}})
        for (int bs : {1, 16, 17}) {
          // Every other case reads rows with a pitch past the row (as from a fused QKV tensor)
          // and writes the second layer.
          const bool strided = ++cases % 2 == 0;
          const std::int32_t layer = strided ? 1 : 0;
          SCOPED_TRACE(std::string(pk::to_string(src_t)) + "->" + std::string(pk::to_string(pool_t)) + " bs=" +
                       std::to_string(bs) + " heads=" + std::to_string(heads) + " head_dim=" + std::to_string(head_dim) +
                       (kind == pk::kv_layout::hnd ? " HND" : " NHD") + (strided ? " strided" : ""));
          const auto layout = pk::make_kv_cache_layout({2, (40 + bs - 1) / bs + 2, bs, heads, head_dim}, kind, pool_t,
                                                       pk::layer_order::layer_major);
          std::vector<unsigned char> pool(layout.size_bytes(), 0x5a);
          const int n = 37;
          std::vector<pagedkv::slot_id> slots(std::size_t(layout.shape.num_blocks) * bs);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng);
          slots.resize(n);
          slots[3] = slots[20] = -1;
          const std::int64_t pitch = std::int64_t(heads) * head_dim + (strided ? 3 * head_dim : 0);
          const auto k = random_bytes_of(src_t, std::size_t(n * pitch), rng);
          const auto v = random_bytes_of(src_t, std::size_t(n * pitch), rng);
          const auto d_pool = pk::testing::device_pool_of(layout, pool);
          const device_buffer d_k = device_buffer::from(k), d_v = device_buffer::from(v),
                              d_slots = device_buffer::from(slots);
          const std::int64_t stride = strided ? pitch : 0;
          pk::write_kv_params p{k.data(), v.data(), slots.data(), pool.data(), layout, stride, n, layer, src_t, 0.5f, 2.0f};
          pk::reference::write_kv(p);
          pk::write_kv_params dp{d_k.get(), d_v.get(), d_slots.as<pagedkv::slot_id>(), d_pool.data(), layout, stride, n, layer,
                                 src_t, 0.5f, 2.0f};
          pk::cuda::write_kv(dp);
          PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
          ASSERT_EQ(pk::testing::host_bytes_of(d_pool), pool);
        }
}

TEST_F(CacheOpsCuda, CopyBlocksMatchesTheReference) {
  for (auto [heads, head_dim] : geometries)
    for (auto t : {pk::dtype::bf16, pk::dtype::fp8_e4m3, pk::dtype::f32})
      for (auto kind : {pk::kv_layout::nhd, pk::kv_layout::hnd})
        for (auto order : {pk::layer_order::layer_major, pk::layer_order::block_major})
          for (int bs : {1, 16, 17, 64})
            for (int num_pairs : {1, 20}) {
              const auto layout = pk::make_kv_cache_layout({2, 42, bs, heads, head_dim}, kind, t, order);
              if (layout.size_bytes() > (std::size_t(16) << 20)) continue;  // seconds, also under compute-sanitizer
              SCOPED_TRACE(std::string(pk::to_string(t)) + " bs=" + std::to_string(bs) + " heads=" + std::to_string(heads) +
                           " head_dim=" + std::to_string(head_dim) + (kind == pk::kv_layout::hnd ? " HND" : " NHD") +
                           (order == pk::layer_order::block_major ? " block-major" : " layer-major") +
                           " pairs=" + std::to_string(num_pairs));
              std::vector<unsigned char> pool(layout.size_bytes());  // any bits: the copy moves bytes
              for (std::size_t i = 0; i < pool.size(); i += 8) {
                const std::uint64_t bits = rng();
                std::memcpy(pool.data() + i, &bits, std::min<std::size_t>(8, pool.size() - i));
              }
              std::vector<pagedkv::block_id> ids(42);
              std::iota(ids.begin(), ids.end(), 0);
              std::shuffle(ids.begin(), ids.end(), rng);
              std::vector<pagedkv::block_id> pairs;
              for (int i = 0; i < num_pairs; ++i) {  // sources from the first 20, destinations from the next 20
                pairs.push_back(ids[std::size_t(i)]);
                pairs.push_back(ids[std::size_t(20 + i)]);
              }
              const auto d_pool = pk::testing::device_pool_of(layout, pool);
              const device_buffer d_pairs = device_buffer::from(pairs);
              pk::reference::copy_blocks({pairs.data(), pool.data(), layout, num_pairs});
              pk::cuda::copy_blocks({d_pairs.as<pagedkv::block_id>(), d_pool.data(), layout, num_pairs});
              PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
              ASSERT_EQ(pk::testing::host_bytes_of(d_pool), pool);
            }
}

TEST_F(CacheOpsCuda, SwapBlocksRoundTripsThroughPinnedHost) {
  for (auto order : {pk::layer_order::layer_major, pk::layer_order::block_major}) {
    const auto dev_layout = pk::make_kv_cache_layout({4, 32, 16, 2, 128}, pk::kv_layout::nhd, pk::dtype::f16, order);
    const auto host_layout = pk::make_kv_cache_layout({4, 12, 16, 2, 128}, pk::kv_layout::nhd, pk::dtype::f16, order);
    auto pool = random_bytes_of(pk::dtype::f16, std::size_t(dev_layout.size()), rng);
    const auto d_pool = pk::testing::device_pool_of(dev_layout, pool);
    pk::cuda::pinned_host_kv_pool pinned(host_layout);
    pinned.fill(0);
    const auto* pinned_bytes = static_cast<const unsigned char*>(pinned.data());
    const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> out = {{5, 0}, {6, 1}, {7, 2}, {30, 9}, {2, 4}};
    const std::size_t copies = pk::cuda::swap_blocks(dev_layout, d_pool.data(), host_layout, pinned.data(), out);
    EXPECT_EQ(copies, order == pk::layer_order::block_major ? 3u : 3u * 8);
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned char> want(host_layout.size_bytes(), 0);
    pk::reference::swap_blocks(dev_layout, pool.data(), host_layout, want.data(), out);
    ASSERT_EQ(std::vector<unsigned char>(pinned_bytes, pinned_bytes + pinned.size_bytes()), want);
    // And back, into other blocks of the device pool.
    const std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> in = {{0, 10}, {1, 11}, {2, 12}, {9, 13}, {4, 20}};
    pk::cuda::swap_blocks(host_layout, pinned.data(), dev_layout, d_pool.data(), in);
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    pk::reference::swap_blocks(host_layout, want.data(), dev_layout, pool.data(), in);
    ASSERT_EQ(pk::testing::host_bytes_of(d_pool), pool);
  }
}

// Odd geometries (block sizes 1 and 7, 5 heads of head_dim 40 in f16; 3 layers), staging
// buffers of 3 blocks, 2 of them: a batch of 23 blocks is 8 chunks, each buffer reused 4 times in
// a call. Each way against reference::swap_blocks (between the layer orders), byte for byte.
TEST_F(CacheOpsCuda, StagedSwapMovesTheRightBytesBothWays) {
  for (int bs : {1, 7})
    for (auto order : {pk::layer_order::layer_major, pk::layer_order::block_major}) {
      SCOPED_TRACE("bs " + std::to_string(bs) + (order == pk::layer_order::block_major ? " block_major" : " layer_major"));
      const auto dev_layout = pk::make_kv_cache_layout({3, 53, bs, 5, 40}, pk::kv_layout::nhd, pk::dtype::f16, order);
      const auto host_layout = pk::make_kv_cache_layout({3, 31, bs, 5, 40}, pk::kv_layout::nhd, pk::dtype::f16,
                                                        pk::layer_order::block_major);
      auto pool = random_bytes_of(pk::dtype::f16, std::size_t(dev_layout.size()), rng);
      const auto d_pool = pk::testing::device_pool_of(dev_layout, pool);
      pk::cuda::pinned_host_kv_pool pinned(host_layout);
      pinned.fill(0x77);
      const auto* pinned_bytes = static_cast<const unsigned char*>(pinned.data());
      std::vector<pagedkv::block_id> device_ids(53), host_ids(31);
      std::iota(device_ids.begin(), device_ids.end(), 0);
      std::iota(host_ids.begin(), host_ids.end(), 0);
      std::shuffle(device_ids.begin(), device_ids.end(), rng);
      std::shuffle(host_ids.begin(), host_ids.end(), rng);
      std::vector<std::pair<pagedkv::block_id, pagedkv::block_id>> out, in;
      for (std::size_t i = 0; i < 23; ++i) {
        out.emplace_back(device_ids[i], host_ids[i]);
        in.emplace_back(host_ids[i], device_ids[52 - i]);
      }
      pk::cuda::staged_swap swap(3 * dev_layout.bytes_per_block() + 16, 2);
      cudaStream_t stream = nullptr;
      PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      EXPECT_EQ(swap.blocks_per_chunk(dev_layout), 3);
      const std::size_t copies = swap.to_host(dev_layout, d_pool.data(), host_layout, pinned.data(), out, stream);
      EXPECT_GE(copies, 8u);
      EXPECT_LE(copies, 23u);
      PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<unsigned char> want(host_layout.size_bytes(), 0x77);
      pk::reference::swap_blocks(dev_layout, pool.data(), host_layout, want.data(), out);
      ASSERT_EQ(std::vector<unsigned char>(pinned_bytes, pinned_bytes + pinned.size_bytes()), want);
      swap.to_device(host_layout, pinned.data(), dev_layout, d_pool.data(), in, stream);
      PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
      pk::reference::swap_blocks(host_layout, want.data(), dev_layout, pool.data(), in);
      ASSERT_EQ(pk::testing::host_bytes_of(d_pool), pool);

      // The same offload and load captured into one graph and replayed: the copy stream joins
      // the capture through the swap's own events. Fresh bytes in the pool first.
      pool = random_bytes_of(pk::dtype::f16, std::size_t(dev_layout.size()), rng);
      PAGEDKV_CUDA_CHECK(cudaMemcpy(d_pool.data(), pool.data(), pool.size(), cudaMemcpyHostToDevice));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      swap.to_host(dev_layout, d_pool.data(), host_layout, pinned.data(), out, stream);
      swap.to_device(host_layout, pinned.data(), dev_layout, d_pool.data(), in, stream);
      PAGEDKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
      pk::reference::swap_blocks(dev_layout, pool.data(), host_layout, want.data(), out);
      pk::reference::swap_blocks(host_layout, want.data(), dev_layout, pool.data(), in);
      EXPECT_EQ(std::vector<unsigned char>(pinned_bytes, pinned_bytes + pinned.size_bytes()), want);
      EXPECT_EQ(pk::testing::host_bytes_of(d_pool), pool);
      PAGEDKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
      PAGEDKV_CUDA_CHECK(cudaGraphDestroy(graph));
      PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
    }
}

TEST(CacheOpsCudaErrors, NameTheProblem) {
  // The checks run before any device call, so this test needs no GPU.
  const auto message_of = [](const auto& call) {
    try {
      call();
    } catch (const pagedkv::error& e) {
      EXPECT_EQ(e.code(), pagedkv::errc::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  alignas(16) static unsigned char pool[1 << 16], rows[1 << 10];
  static const pagedkv::slot_id slots[1] = {0};
  pk::write_kv_params w;
  w.k_new = rows; w.v_new = rows; w.slot_mapping = slots;
  w.pool = pool + 8;  // rows are stored 16 bytes at a time
  w.layout = pk::make_kv_cache_layout({1, 4, 16, 1, 64}, pk::kv_layout::nhd, pk::dtype::bf16);
  w.num_tokens = 1;
  w.src_dtype = pk::dtype::bf16;
  EXPECT_NE(message_of([&] { pk::cuda::write_kv(w); }).find("pool must be 16-byte aligned"), std::string::npos);
  static const pagedkv::block_id pairs[2] = {0, 1};
  // grid.y is 2 x num_layers: 65535 at most.
  const auto deep = pk::make_kv_cache_layout({40000, 2, 16, 1, 64}, pk::kv_layout::nhd, pk::dtype::bf16);
  const std::string deep_message = message_of([&] { pk::cuda::copy_blocks({pairs, pool, deep, 1}); });
  EXPECT_NE(deep_message.find("num_layers 40000 over 32767"), std::string::npos) << deep_message;
}
