// NCCL through dlopen (nccl_library.hpp).
#include "cuda/nccl_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include <pagedkv/error.hpp>

namespace pagedkv::llama::cuda {

namespace {

using pagedkv::detail::fail;

struct loaded {
  nccl_library library{};
  std::string error;  // empty when loaded
};

template <class F>
bool bind(void* handle, const char* name, F*& f, std::string& error) {
  f = reinterpret_cast<F*>(dlsym(handle, name));
  if (!f && error.empty()) error = std::string("the NCCL library has no ") + name;
  return f != nullptr;
}

loaded open_nccl() {
  loaded out;
  // Before NCCL reads its environment (at its first call): no NVLink multicast (NVLS); and every
  // connection made in ncclCommInitAll rather than inside a collective (NCCL's runtime connect),
  // so that a collective never waits on the host for a peer: a rank's abort would wait behind it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  // LL or LL128 at every size, unless set: NCCL's model picks Simple for 1.9-2.5 MiB all-reduces on
  // two NVLinked H100s, where LL/LL128 took 21-25 us against 28-29 (a decode step of 192-256
  // tokens); llama2-13b TP2 1.008x the output tokens/s, its all-reduces 6% shorter (2x H100,
  // 2026-11-26 09:29 UTC, bench/engine/results/2026-11-26-h100x2-tp-final.log). Prefill's 20 MiB
  // messages lose 10% for it (101.5 against 91.8 us), under 1% of such a step.
  setenv("NCCL_PROTO", "^Simple", 0);
  const char* env = std::getenv("PAGEDKV_NCCL_LIBRARY");
  const std::string name = env && *env ? env : "libnccl.so.2";
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    out.error = "cannot open NCCL (" + name + "): " + (why ? why : "unknown error") +
                "; put its folder on LD_LIBRARY_PATH or name the file in PAGEDKV_NCCL_LIBRARY";
    return out;
  }
  nccl_library& l = out.library;
  std::string& e = out.error;
  bind(handle, "ncclGetVersion", l.get_version, e);
  bind(handle, "ncclCommInitAll", l.comm_init_all, e);
  bind(handle, "ncclCommDestroy", l.comm_destroy, e);
  bind(handle, "ncclCommAbort", l.comm_abort, e);
  bind(handle, "ncclAllReduce", l.all_reduce, e);
  bind(handle, "ncclAllGather", l.all_gather, e);
  bind(handle, "ncclGroupStart", l.group_start, e);
  bind(handle, "ncclGroupEnd", l.group_end, e);
  bind(handle, "ncclGetErrorString", l.get_error_string, e);
  bind(handle, "ncclGetLastError", l.get_last_error, e);
  if (e.empty() && l.get_version(&l.version) != ncclSuccess) e = "ncclGetVersion failed";
  // bfloat16 reductions (ncclBfloat16) arrived in NCCL 2.10.
  if (e.empty() && l.version < 21000) e = "NCCL " + std::to_string(l.version) + " is older than 2.10 (no bfloat16)";
  return out;  // the handle stays open for the process's life: the communicators use it to the end
}

const loaded& library() {
  static const loaded l = open_nccl();
  return l;
}

}  // namespace

const nccl_library& nccl() {
  const loaded& l = library();
  if (!l.error.empty()) fail(errc::invalid_argument, l.error);
  return l.library;
}

bool nccl_available(std::string* why) {
  const loaded& l = library();
  if (why) *why = l.error;
  return l.error.empty();
}

void check_nccl(ncclResult_t result, const char* call, ncclComm_t comm) {
  if (result == ncclSuccess) return;
  const nccl_library& l = nccl();
  const char* last = l.get_last_error(comm);
  throw nccl_error(result, std::string("pagedkv: ") + call + " failed: " + l.get_error_string(result) +
                               (last && *last ? std::string(" (") + last + ")" : ""));
}

}  // namespace pagedkv::llama::cuda
