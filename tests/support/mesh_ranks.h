// Runs ranks of the TCP backend's connection mesh as threads of this
// process over one HashStore, for tests of the transport's own classes
// (Mesh, Exchange) below the ProcessGroup.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backends/tcp/mesh.h"
#include "store/hash_store.h"

namespace comm::testing {

// Builds a Mesh for each rank in `ranks` (of a group of `world`) on its own
// thread, calls body(mesh) there, and returns each rank's error message,
// indexed by rank ("" where it succeeded or did not run).
inline std::vector<std::string> run_meshes(
    HashStore& store, int world, const std::vector<int>& ranks,
    std::chrono::milliseconds timeout,
    const std::function<void(tcp::Mesh&)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank : ranks) {
    threads.emplace_back([&, rank] {
      try {
        tcp::Mesh mesh(store, rank, world, timeout);
        body(mesh);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

// The same for every rank of the group, each over a fresh HashStore.
inline std::vector<std::string> run_meshes(
    int world, std::chrono::milliseconds timeout,
    const std::function<void(tcp::Mesh&)>& body) {
  HashStore store(timeout);
  std::vector<int> ranks;
  for (int rank = 0; rank < world; ++rank) ranks.push_back(rank);
  return run_meshes(store, world, ranks, timeout, body);
}

}  // namespace comm::testing
