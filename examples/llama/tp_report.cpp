// The tensor-parallel --bench report (tp_report.hpp).
#include "tp_report.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/tp_backend.hpp"

namespace pagedkv::llama {

void print_tensor_parallel_report(std::ostream& out, const model_backend& backend) {
  const tensor_parallel_stats s = tensor_parallel_stats_of(backend);
  if (s.ranks <= 1 || s.steps == 0) return;
  std::vector<std::int64_t> counts;  // bf16 elements of each message size
  for (const auto& [bytes, calls] : s.all_reduce_sizes) counts.push_back(bytes / 2);
  const std::vector<double> nccl_seconds = nccl_all_reduce_seconds(backend, counts);
  double ceiling_s = 0.0;
  for (std::size_t i = 0; i < nccl_seconds.size(); ++i) ceiling_s += nccl_seconds[i] * double(s.all_reduce_sizes[i].second);
  // Steps replayed as untimed decode graphs (without --tensor-parallel-timed-graphs) count in no figure.
  const auto timed_steps = double(std::max<std::int64_t>(s.steps - s.untimed_replays, 1));
  const double per_step_ms = 1e3 * s.all_reduce_seconds / timed_steps;
  if (s.untimed_replays > 0)
    out << "tensor parallel: " << s.untimed_replays << " decode graph replays untimed (--tensor-parallel-timed-graphs times them): "
        << "the all-reduce figures below are the other " << s.steps - s.untimed_replays
        << " steps' and their share is of all steps' GPU time\n";
  out << "tensor parallel: O's and down's all-reduces "
      << (s.peer_reduce ? "fused with the add and RMSNorm after them over NVLink peer access (each timed with them; "
                          "--tensor-parallel-nccl-all-reduce for NCCL's)"
                        : "by NCCL; the peer reduce is " + s.peer_reduce_off)
      << "\n";
  out << "tensor parallel: " << s.ranks << " GPUs; " << s.all_reduces << " all-reduces in " << s.steps << " steps, "
      << s.all_reduce_bytes / double(s.all_reduces) / 1024.0 << " KiB mean message; all-reduce "
      << s.all_reduce_seconds << " s (" << per_step_ms << " ms a step, "
      << (s.busy_seconds > 0 ? 100.0 * s.all_reduce_seconds / s.busy_seconds : 0.0) << "% of rank 0's GPU time "
      << s.busy_seconds << " s); logits gathers " << s.gather_seconds << " s; rank 0's buffer growths in steps "
      << s.buffer_growths << "\n"
      << "tensor parallel: NCCL's own all-reduce time for the same " << s.all_reduce_sizes.size()
      << " message sizes (20 each, timed now) " << ceiling_s << " s: the run's all-reduces took "
      << (ceiling_s > 0 ? s.all_reduce_seconds / ceiling_s : 0.0) << "x that\n"
      << "tensor parallel: the same all-reduces as the rank that arrived last saw each (no wait for the other rank) "
      << s.all_reduce_alone_seconds << " s (" << 1e3 * s.all_reduce_alone_seconds / timed_steps
      << " ms a step): " << (ceiling_s > 0 ? s.all_reduce_alone_seconds / ceiling_s : 0.0)
      << "x NCCL's own; rank 0 waited for the other " << s.all_reduce_seconds - s.all_reduce_alone_seconds << " s\n";
}

}  // namespace pagedkv::llama
