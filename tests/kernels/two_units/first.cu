// With second.cu: two translation units that include the library's CUDA umbrella header link
// into one program (a kernel defined in a header but not a template would be defined twice).
#include <pagedkv/cuda.cuh>

int second_unit();

int main() { return second_unit(); }
