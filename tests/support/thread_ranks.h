// Runs the ranks of a group as threads of this process over one HashStore:
// the fast way to test collectives at many world sizes.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/distributed/process_group.h"
#include "store/hash_store.h"

namespace comm::testing {

// Calls body(group) on `world` threads, each with its own ProcessGroup of
// rank r; returns each rank's error message ("" where it succeeded).
inline std::vector<std::string> run_ranks(
    int world, const std::function<void(ProcessGroup&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = std::make_shared<HashStore>(timeout);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ProcessGroup group(store, rank, world, "tcp", timeout);
        body(group);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

}  // namespace comm::testing
