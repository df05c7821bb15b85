// See first.cu.
#include <pagedkv/cuda.cuh>

int second_unit() { return 0; }
