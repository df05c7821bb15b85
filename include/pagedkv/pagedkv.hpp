// Umbrella header: everything in include/pagedkv/.
#pragma once

#include <pagedkv/error.hpp>
#include <pagedkv/types.hpp>
