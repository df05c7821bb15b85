// Read-stream patterns on one GPU: what moves HBM fastest, and how close the decode's paged copy
// patterns come. Copies only, no math: each kernel streams bytes into shared memory (or
// registers) the way a decode kernel would and drops them. Written to find where the decode's
// copies lost 3% against a plain stream; it found it (the padded shared rows, see `pitch272`).
// The orders show what random block order costs: crossing a 2 MiB page at every block.
//
//   ld       16-byte loads into registers, persistent grid-stride (bench_decode's ceiling)
//   cp       16-byte cp.async, a warp pipeline over contiguous 8 KiB slices
//   bulk     cp.async.bulk of a contiguous piece a stage (TMA, one thread issues)
//   paged    the decode's unit, (sequence, KV head): K and V of its 2048 tokens through a block
//            table of 16-token blocks, NHD ([block][token][head][128]) or HND
//            ([block][head][token][128]), bf16, MHA (32 heads, batch 64) or GQA (8 KV heads,
//            batch 256), through tables in one of four orders: `shuffled` (random block order),
//            `identity`, `pages` (the 2 MiB pages of the pool in random order, the blocks of a page
//            in order) and `in-page` (the pages in order, the blocks of each shuffled), the last
//            two NHD and the main rows only. 2 GiB, the whole of both pools (`512 units`: the
//            first 512 units only, 1.94 waves of two CTAs an SM, as the decode of GQA batch 64 or
//            MHA batch 16 at ctx 2048 has). Copied
//              cp    by 16-byte cp.async rows as the decode does (4 warps, 16 rows each a tile),
//                    into 256-byte shared rows, or 272-byte ones (`pitch272`, 16 bytes of padding),
//                    with the zero-fill operand (`zfill`), or timed as a CUDA graph of 8 (`graph8`);
//              tma   one TMA tensor copy per block, head and K/V (16 rows of 256 B);
//              bulk  one cp.async.bulk per block, head and K/V (HND: 4 KiB contiguous);
//              ours  pagedkv's decode itself, math included, on the same pools and table.
//
// Usage: bench_stream [reps]. Prints `pattern,GBps`: the median over reps launches.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <pagedkv/cuda/device_buffer.cuh>
#include <pagedkv/cuda/dispatch.cuh>

#include "read_stream.cuh"

namespace pk = pagedkv::kernels;
using pk::cuda::device_buffer;
using pagedkv::errc;

namespace {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void mbar_init(std::uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk(void* dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void tma3(void* dst, const CUtensorMap* map, int c0, int c1, int c2, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

/// One thread a CTA streams Bytes-sized pieces through Stages stages; piece s to CTA s % grid.
template <int Stages, int Bytes>
__global__ void bulk_stream(const char* data, std::size_t pieces) {
  extern __shared__ __align__(128) char smem[];
  __shared__ std::uint64_t bars[Stages];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < Stages; ++s) mbar_init(&bars[s]);
  const std::size_t first = blockIdx.x, step = gridDim.x;
  const std::size_t mine = first < pieces ? (pieces - first + step - 1) / step : 0;
  auto issue = [&](std::size_t i) {
    const int s = int(i % Stages);
    mbar_expect(&bars[s], Bytes);
    bulk(smem + s * Bytes, data + (first + i * step) * Bytes, Bytes, &bars[s]);
  };
  for (int i = 0; i < Stages; ++i)
    if (std::size_t(i) < mine) issue(i);
  for (std::size_t i = 0; i < mine; ++i) {
    mbar_wait(&bars[i % Stages], unsigned(i / Stages) & 1u);
    if (i + Stages < mine) issue(i + Stages);
  }
}

struct paged {
  const char* k;
  const char* v;
  const int* table;  // [batch][blocks_per_seq]
  int blocks_per_seq, heads;
  bool hnd;
  // byte offset of token t (within block) of head h in block b; a block is 16 * heads * 256 bytes
  __device__ std::size_t row(int b, int t, int h) const {
    const std::size_t block = std::size_t(b) * 16 * heads * 256;
    return block + (hnd ? (std::size_t(h) * 16 + t) * 256 : (std::size_t(t) * heads + h) * 256);
  }
};

/// The decode's copies: CTA = (sequence, head), Warps warps, tiles of Warps * 16 tokens; warp w
/// copies rows w*16.. of each tile (K and V), two rows an instruction, Stages stages.
template <int Warps, int Stages, bool Zfill = false, int Pitch = 256>
__global__ void paged_cp(paged p) {
  extern __shared__ __align__(128) char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int seq = blockIdx.x / p.heads, head = blockIdx.x % p.heads;
  char* ring = smem + warp * Stages * 32 * Pitch;  // per stage 16 rows of K then 16 of V
  const int tiles = p.blocks_per_seq * 16 / (Warps * 16);
  auto issue = [&](int t) {
    const int token = t * Warps * 16 + warp * 16 + (lane % 16);
    const int b = p.table[seq * p.blocks_per_seq + token / 16];
    const std::size_t my_row = p.row(b, token % 16, head);
    char* dst = ring + (t % Stages) * 32 * Pitch;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = 2 * i + lane / 16;
      const std::size_t off = __shfl_sync(0xffffffffu, my_row, r) + (lane % 16) * 16;
      if constexpr (Zfill) {  // the library's copy: the source size in a register (0: zeros)
        const bool valid = token < 1 << 30;
        pk::cuda::cp_async_16(dst + r * Pitch + (lane % 16) * 16, p.k + off, valid);
        pk::cuda::cp_async_16(dst + (16 + r) * Pitch + (lane % 16) * 16, p.v + off, valid);
      } else {
        cp16(dst + r * Pitch + (lane % 16) * 16, p.k + off);
        cp16(dst + (16 + r) * Pitch + (lane % 16) * 16, p.v + off);
      }
    }
  };
  for (int t = 0; t < Stages - 1; ++t) {
    if (t < tiles) issue(t);
    cp_commit();
  }
  for (int t = 0; t < tiles; ++t) {
    __syncwarp();
    if (t + Stages - 1 < tiles) issue(t + Stages - 1);
    cp_commit();
    cp_wait<Stages - 1>();
  }
  cp_wait<0>();
}

/// CTA = (sequence, head); Warps independent pipelines, lane 0 of warp w copies blocks w, w +
/// Warps, ...: K and V of a block and head by one cp.async.bulk each (HND: 4 KiB contiguous) or
/// one TMA tensor copy each (NHD or HND through the maps), Stages stages a warp.
template <int Warps, int Stages, bool Tensor>
__global__ void paged_bulk(paged p, const __grid_constant__ CUtensorMap kmap,
                           const __grid_constant__ CUtensorMap vmap) {
  extern __shared__ __align__(128) char smem[];
  __shared__ std::uint64_t bars[Warps * Stages];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane != 0) return;
  const int seq = blockIdx.x / p.heads, head = blockIdx.x % p.heads;
  char* ring = smem + warp * Stages * 8192;
  std::uint64_t* bar = bars + warp * Stages;
  for (int s = 0; s < Stages; ++s) mbar_init(&bar[s]);
  const int mine = (p.blocks_per_seq - warp + Warps - 1) / Warps;
  auto issue = [&](int i) {
    const int s = i % Stages, j = warp + i * Warps;
    const int b = p.table[seq * p.blocks_per_seq + j];
    mbar_expect(&bar[s], 8192);
    if constexpr (Tensor) {
      // NHD maps: dims {128 elems, heads, tokens}; HND maps: {128, tokens-in-block, heads * blocks}
      if (!p.hnd) {
        tma3(ring + s * 8192, &kmap, 0, head, b * 16, &bar[s]);
        tma3(ring + s * 8192 + 4096, &vmap, 0, head, b * 16, &bar[s]);
      } else {
        tma3(ring + s * 8192, &kmap, 0, 0, b * p.heads + head, &bar[s]);
        tma3(ring + s * 8192 + 4096, &vmap, 0, 0, b * p.heads + head, &bar[s]);
      }
    } else {
      const std::size_t off = p.row(b, 0, head);  // HND only: the block's head is 4 KiB contiguous
      bulk(ring + s * 8192, p.k + off, 4096, &bar[s]);
      bulk(ring + s * 8192 + 4096, p.v + off, 4096, &bar[s]);
    }
  };
  for (int i = 0; i < Stages && i < mine; ++i) issue(i);
  for (int i = 0; i < mine; ++i) {
    mbar_wait(&bar[i % Stages], unsigned(i / Stages) & 1u);
    if (i + Stages < mine) issue(i + Stages);
  }
}

cudaStream_t g_stream;

struct timer {
  cudaEvent_t a, b;
  timer() {
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&a));
    PAGEDKV_CUDA_CHECK(cudaEventCreate(&b));
  }
  /// Median over reps of one launch (graph_of == 0) or of a CUDA graph of graph_of launches.
  template <class F>
  double median_gbps(double bytes, int reps, F&& launch, int graph_of = 0) {
    launch();  // warm-up
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    cudaGraphExec_t exec = nullptr;
    if (graph_of > 0) {
      cudaGraph_t graph;
      PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < graph_of; ++i) launch();
      PAGEDKV_CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
      PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      PAGEDKV_CUDA_CHECK(cudaGraphDestroy(graph));
      PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
    }
    std::vector<double> v;
    for (int r = 0; r < reps; ++r) {
      PAGEDKV_CUDA_CHECK(cudaEventRecord(a, g_stream));
      if (exec) PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
      else launch();
      PAGEDKV_CUDA_CHECK(cudaEventRecord(b, g_stream));
      PAGEDKV_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      PAGEDKV_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      v.push_back(bytes * (graph_of > 0 ? graph_of : 1) / (double(ms) * 1e-3) / 1e9);
    }
    PAGEDKV_CUDA_CHECK(cudaGetLastError());
    if (exec) PAGEDKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  PAGEDKV_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !fn) {
    pagedkv::detail::fail(errc::invalid_argument, "bench_stream: the driver has no cuTensorMapEncodeTiled");
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

CUtensorMap make_map(const char* base, int heads, int blocks, bool hnd) {
  CUtensorMap map{};
  cuuint64_t dims[3], strides[2];
  cuuint32_t box[3], estr[3] = {1, 1, 1};
  if (!hnd) {  // {dim, head, token}
    dims[0] = 128, dims[1] = cuuint64_t(heads), dims[2] = cuuint64_t(blocks) * 16;
    strides[0] = 256, strides[1] = cuuint64_t(heads) * 256;
    box[0] = 128, box[1] = 1, box[2] = 16;
  } else {  // {dim, token in block, block * heads + head}
    dims[0] = 128, dims[1] = 16, dims[2] = cuuint64_t(blocks) * heads;
    strides[0] = 256, strides[1] = 16 * 256;
    box[0] = 128, box[1] = 16, box[2] = 1;
  }
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<char*>(base), dims, strides,
                                 box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    pagedkv::detail::fail(errc::invalid_argument, "bench_stream: cuTensorMapEncodeTiled failed: ", int(r));
  }
  return map;
}

/// Prints `name,GBps` for a launch moving `bytes`: the median of reps launches, or of reps CUDA
/// graphs of graph_of launches. The kernel gets smem_bytes of dynamic shared memory.
template <class Kernel, class Launch>
void report(timer& t, const char* name, Kernel kernel, int smem_bytes, double bytes, int reps, Launch&& launch,
            int graph_of = 0) {
  PAGEDKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  std::printf("%s,%.0f\n", name, t.median_gbps(bytes, reps, launch, graph_of));
}

/// bulk_stream<Stages, Bytes> over the whole buffer, per_sm CTAs (of one working thread) an SM.
template <int Stages, int Bytes>
void report_bulk(timer& t, const char* data, std::size_t bytes, int sms, int per_sm, int reps) {
  const std::string name = "bulk " + std::to_string(Stages) + " stages x " + std::to_string(Bytes) + " B, " +
                           std::to_string(per_sm) + "/SM";
  report(t, name.c_str(), bulk_stream<Stages, Bytes>, Stages * Bytes, double(bytes), reps,
         [&] { bulk_stream<Stages, Bytes><<<sms * per_sm, 32, Stages * Bytes, g_stream>>>(data, bytes / Bytes); });
}

/// The library's decode (bf16, 32 query heads of head_dim 128, block 16) over the pools and table
/// the paged patterns read, so that its bandwidth compares with theirs.
void report_ours(timer& t, const std::string& name, const paged& p, int batch, int ctx, int reps) {
  const int blocks = int((std::size_t(2) << 30) / 2 / (std::size_t(16) * p.heads * 256));
  const auto layout = pk::make_kv_cache_layout({1, blocks, 16, p.heads, 128},
                                               p.hnd ? pk::kv_layout::hnd : pk::kv_layout::nhd, pk::dtype::bf16);
  if (static_cast<const char*>(p.v) - static_cast<const char*>(p.k) != layout.kv_stride * 2)
    pagedkv::detail::fail(errc::invalid_argument, "bench_stream: the decode's layout is not the pools'");
  const std::size_t q_elems = std::size_t(batch) * 32 * 128;
  std::vector<__nv_bfloat16> q_host(q_elems);
  for (std::size_t i = 0; i < q_elems; ++i) q_host[i] = __float2bfloat16(float(int(i % 17) - 8) / 8.0f);
  const device_buffer q = device_buffer::from(q_host), o(q_elems * 2),
                      lens = device_buffer::from(std::vector<std::int32_t>(std::size_t(batch), ctx));
  pk::attention_params ap;
  ap.set_kv(layout, p.k, 0);
  ap.q = q.get();
  ap.o = o.get();
  ap.q_dtype = pk::dtype::bf16;
  ap.num_seqs = batch;
  ap.num_qo_heads = 32;
  ap.table.kv_lens = lens.as<std::int32_t>();
  ap.table.max_blocks_per_seq = p.blocks_per_seq;
  ap.table.indices = p.table;
  ap.max_kv_len = ctx;
  ap.sm_scale = 1.0f / std::sqrt(128.0f);
  const auto plan = pk::cuda::plan_decode(ap);
  const device_buffer workspace(plan.workspace_bytes);
  const double bytes = double(batch) * p.heads * ctx * 256 * 2;
  for (const int graph_of : {0, 8}) {
    const std::string label = name + " (splits " + std::to_string(plan.num_splits) + ", cta " +
                              std::to_string(int(plan.cta)) + ")" + (graph_of ? " graph8" : "");
    std::printf("%s,%.0f\n", label.c_str(), t.median_gbps(bytes, reps, [&] {
      pk::cuda::decode(ap, workspace.get(), workspace.bytes(), g_stream);
    }, graph_of));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  int sms = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  const std::size_t bytes = std::size_t(2) << 30;
  const device_buffer buffer(bytes, 0x5a), sink(4);
  char* const data = buffer.as<char>();
  const double all = double(bytes);
  timer t;
  std::printf("pattern,GBps\n");
  const auto loads = [&](int ctas_per_sm) {
    read_stream_kernel<<<sms * ctas_per_sm, 256, 0, g_stream>>>(buffer.as<uint4>(), bytes / 16, sink.as<unsigned>());
  };
  report(t, "ld grid=4x/SM x256", read_stream_kernel, 0, all, reps, [&] { loads(4); });
  report(t, "ld grid=8x/SM x256", read_stream_kernel, 0, all, reps, [&] { loads(8); });

  const auto copies = [&](auto kernel, int stages, int per_sm) {
    kernel<<<sms * per_sm, 128, 4 * stages * 8192, g_stream>>>(data, bytes / 8192);
  };
  report(t, "cp 4 warps x3 stages x8KiB, 2/SM", copy_stream_kernel<3>, 4 * 3 * 8192, all, reps,
         [&] { copies(copy_stream_kernel<3>, 3, 2); });
  report(t, "cp 4 warps x3 stages x8KiB, 1/SM", copy_stream_kernel<3>, 4 * 3 * 8192, all, reps,
         [&] { copies(copy_stream_kernel<3>, 3, 1); });
  report(t, "cp 4 warps x2 stages x8KiB, 3/SM", copy_stream_kernel<2>, 4 * 2 * 8192, all, reps,
         [&] { copies(copy_stream_kernel<2>, 2, 3); });

  report_bulk<4, 4096>(t, data, bytes, sms, 8, reps);
  report_bulk<8, 4096>(t, data, bytes, sms, 4, reps);
  report_bulk<4, 8192>(t, data, bytes, sms, 6, reps);
  report_bulk<4, 16384>(t, data, bytes, sms, 3, reps);
  report_bulk<6, 16384>(t, data, bytes, sms, 2, reps);
  report_bulk<2, 32768>(t, data, bytes, sms, 3, reps);

  // Paged: K and V pools of 1 GiB each (the two halves of the buffer), MHA (32 heads, batch 64)
  // or GQA (8 KV heads, batch 256), ctx 2048: the whole of both pools; and the first 512 units
  // of them, two waves of one-unit CTAs.
  std::mt19937 rng(1);
  enum class order { shuffled, identity, pages, in_page };
  const char* const order_names[] = {"shuffled", "identity", "pages", "in-page"};
  for (const int heads : {32, 8}) {
    const int block_bytes = 16 * heads * 256, blocks = int((bytes / 2) / block_bytes);
    const int ctx = 2048, bps = ctx / 16, batch = blocks / bps;
    const double kv_bytes = double(batch) * heads * ctx * 256 * 2;
    const int page_blocks = (2 << 20) / block_bytes;  // blocks of one 2 MiB page
    for (const order o : {order::shuffled, order::identity, order::pages, order::in_page}) {
      std::vector<int> ids(static_cast<std::size_t>(blocks));
      std::iota(ids.begin(), ids.end(), 0);
      if (o == order::shuffled) std::shuffle(ids.begin(), ids.end(), rng);
      if (o == order::pages || o == order::in_page) {
        std::vector<int> pages(std::size_t(blocks / page_blocks));
        std::iota(pages.begin(), pages.end(), 0);
        if (o == order::pages) std::shuffle(pages.begin(), pages.end(), rng);
        for (std::size_t g = 0; g < pages.size(); ++g) {
          auto first = ids.begin() + std::ptrdiff_t(g * page_blocks);
          std::iota(first, first + page_blocks, pages[g] * page_blocks);
          if (o == order::in_page) std::shuffle(first, first + page_blocks, rng);
        }
      }
      const bool full = o == order::shuffled || o == order::identity;
      const device_buffer table = device_buffer::from(ids);
      for (const bool hnd : {false, true}) {
        if (!full && hnd) continue;
        const paged p{data, data + bytes / 2, table.as<int>(), bps, heads, hnd};
        const CUtensorMap km = make_map(data, heads, blocks, hnd), vm = make_map(data + bytes / 2, heads, blocks, hnd);
        const int units = batch * heads;
        const std::string suffix = " h" + std::to_string(heads) + (hnd ? " HND" : " NHD") +
                                   " " + order_names[int(o)];
        // The first `ctas` units (one a CTA; 0: all of them) of the pools, `bytes` of K and V.
        const auto rows = [&](const std::string& label, auto kernel, int smem, int graph_of = 0, int ctas = 0,
                              double bytes = 0) {
          const int grid = ctas ? ctas : units;
          report(t, ("paged " + label + suffix).c_str(), kernel, smem, ctas ? bytes : kv_bytes, reps,
                 [&] { kernel<<<grid, 128, smem, g_stream>>>(p); }, graph_of);
        };
        const auto tensor = [&](const char* label, auto kernel) {
          report(t, ("paged " + std::string(label) + suffix).c_str(), kernel, 4 * 3 * 8192, kv_bytes, reps,
                 [&] { kernel<<<units, 128, 4 * 3 * 8192, g_stream>>>(p, km, vm); });
        };
        rows("cp 4w x3", paged_cp<4, 3>, 4 * 3 * 8192);
        rows("cp 4w x3 graph8", paged_cp<4, 3>, 4 * 3 * 8192, 8);
        if (full) {
        rows("cp 4w x2", paged_cp<4, 2>, 4 * 2 * 8192);
        rows("cp 4w x2 graph8", paged_cp<4, 2>, 4 * 2 * 8192, 8);
        rows("cp 4w x2 zfill", paged_cp<4, 2, true>, 4 * 2 * 8192);
        rows("cp 4w x2 pitch272", paged_cp<4, 2, false, 272>, 4 * 2 * 32 * 272);
        rows("cp 4w x2 zfill pitch272", paged_cp<4, 2, true, 272>, 4 * 2 * 32 * 272);
        tensor("tma 4w x3", paged_bulk<4, 3, true>);
        if (hnd) tensor("bulk 4w x3", paged_bulk<4, 3, false>);
        }
        report_ours(t, "paged ours" + suffix, p, batch, ctx, reps);
        if (!hnd) {  // 512 one-unit CTAs, 1.94 waves of two an SM: the decode of GQA 32/8 batch 64 (MHA batch 16)
          const int seqs = 512 / heads;
          const double seqs_bytes = double(seqs) * heads * ctx * 256 * 2;
          for (const int graph_of : {0, 8})
            rows(std::string("cp 4w x3 512 units") + (graph_of ? " graph8" : ""), paged_cp<4, 3>, 4 * 3 * 8192,
                 graph_of, 512, seqs_bytes);
          report_ours(t, "paged ours 512 units" + suffix, p, seqs, ctx, reps);
        }
      }
    }
  }
  report(t, "ld grid=8x/SM x256 (again: drift)", read_stream_kernel, 0, all, reps, [&] { loads(8); });
  return 0;
}
