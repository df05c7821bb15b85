// The --bench report of a tensor-parallel run: its communication against NCCL's own time for the
// same messages, measured on the same GPUs right after.
#pragma once

#include <ostream>

#include "model_backend.hpp"

namespace pagedkv::llama {

/// Writes the all-reduce and gather times of a tensor-parallel backend's steps so far, their share
/// of its GPU time, and NCCL's time for the same all-reduces (each message size timed now: the
/// ceiling), also as the rank that arrived last saw each (without the wait for a slower rank);
/// nothing for another backend.
void print_tensor_parallel_report(std::ostream& out, const model_backend& backend);

}  // namespace pagedkv::llama
