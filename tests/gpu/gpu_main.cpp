// main() of the gpu suite: runs the Catch2 session only where a CUDA device
// is visible, and otherwise tells meson to report SKIP (exit code 77) with
// the reason on stdout.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "libcomm/cuda.h"

int main(int argc, char** argv) {
  if (!comm::built_with_cuda()) {
    std::printf(
        "SKIP: libcomm was built without CUDA (see the GPU support "
        "section of the meson summary)\n");
    return 77;
  }
  if (comm::cuda_device_count() == 0) {
    std::printf("SKIP: no CUDA device is visible to this process\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
