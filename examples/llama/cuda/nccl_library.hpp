// NCCL, opened at run time (dlopen) rather than linked: the build machines have it in the CUDA
// toolkit, the GPU machines in a Python wheel's folder, and a binary built on the first must run
// on the second and, without NCCL, still run on one GPU. The header's types come from nccl.h at
// build time; the library is found by the dynamic loader's search (LD_LIBRARY_PATH) as
// libnccl.so.2, or at the path in PAGEDKV_NCCL_LIBRARY.
#pragma once

#include <stdexcept>
#include <string>

#include <nccl.h>

namespace pagedkv::llama::cuda {

/// A failed NCCL call: what() names the call, NCCL's error string and the communicator's last error.
class nccl_error : public std::runtime_error {
 public:
  nccl_error(ncclResult_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  [[nodiscard]] ncclResult_t code() const noexcept { return code_; }

 private:
  ncclResult_t code_;
};

/// The NCCL entry points the tensor-parallel backend calls.
struct nccl_library {
  ncclResult_t (*get_version)(int*);
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
  const char* (*get_error_string)(ncclResult_t);
  const char* (*get_last_error)(ncclComm_t);
  int version = 0;  ///< NCCL_VERSION_CODE of the loaded library
};

/// The loaded library, opened on first use. Sets NCCL_NVLS_ENABLE=0 before NCCL reads its
/// environment (NVLink multicast is off on the machines this runs on), and, unless set,
/// NCCL_RUNTIME_CONNECT=0 and NCCL_PROTO=^Simple (nccl_library.cpp says why). Errors: pagedkv::error
/// (invalid_argument) naming what was tried when NCCL cannot be opened or lacks an entry point.
const nccl_library& nccl();

/// Whether NCCL can be opened; `why` says what failed.
bool nccl_available(std::string* why = nullptr);

/// Throws nccl_error naming `call`, NCCL's error string and the communicator's last error
/// when result is not ncclSuccess.
void check_nccl(ncclResult_t result, const char* call, ncclComm_t comm = nullptr);

}  // namespace pagedkv::llama::cuda

#define PAGEDKV_NCCL_CHECK(call, comm) ::pagedkv::llama::cuda::check_nccl((call), #call, (comm))
