// Error reporting for the C ABI: functions return 0 or a nonzero code; the message is kept
// per thread and read with mok_last_error().
#pragma once
#include <cstdarg>
#include <cstdio>

namespace mok {
int set_error(const char* fmt, ...);
}
#define MOK_CHECK_LAUNCH(name)                                                  \
  do {                                                                          \
    cudaError_t e_ = cudaGetLastError();                                        \
    if (e_ != cudaSuccess) return mok::set_error("%s: %s", name, cudaGetErrorString(e_)); \
  } while (0)
