// Checks for tests whose ranks run as threads of one process
// (thread_ranks.h, mesh_ranks.h): a rank's body stops at its first failed
// expectation, which becomes that rank's error message, and the test then
// asserts that every rank came back without one.
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace comm::testing {

// Throws std::runtime_error(what) unless `condition` holds. Catch2's
// assertions are not thread-safe, so a rank's body reports this way.
inline void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

// Asserts that each rank's error message (run_ranks' result) is empty,
// naming the rank of one that is not.
inline void check_all_ok(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

}  // namespace comm::testing
