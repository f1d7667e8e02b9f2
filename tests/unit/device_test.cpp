#include <catch2/catch.hpp>

#include "libcomm/device.h"
#include "libcomm/error.h"

TEST_CASE("devices print and parse", "[device]") {
  CHECK(comm::Device::cpu().str() == "cpu");
  CHECK(comm::Device::cuda(3).str() == "cuda:3");
  CHECK(comm::Device::parse("cuda:3") == comm::Device::cuda(3));
  CHECK(comm::Device::parse("cuda") == comm::Device::cuda(0));
  CHECK(comm::Device::parse("cpu") == comm::Device::cpu());
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", ""}) {
    CHECK_THROWS_AS(comm::Device::parse(bad), comm::InvalidArgument);
  }
}
