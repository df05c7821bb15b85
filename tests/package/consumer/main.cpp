// A separate project that uses pagedkv the way an engine would.
#include <pagedkv/pagedkv.hpp>

#include <cstdio>

int main() {
  try {
    pagedkv::detail::fail(pagedkv::errc::invalid_argument, "consumer check");
  } catch (const pagedkv::error& e) {
    std::printf("consumer: %s\n", e.what());
    return e.code() == pagedkv::errc::invalid_argument ? 0 : 1;
  }
  return 1;
}
