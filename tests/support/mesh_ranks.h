// Runs ranks of the TCP backend's connection mesh as threads of this
// process over one HashStore, for tests of the transport's own classes
// (Mesh, Exchange) below the ProcessGroup. The ranks may also share another
// Store, or each have a store of its own over shared keys (a KeyedStore, for
// the authentication tests).
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
    const std::function<Store&(int rank)>& store_of, int world,
    const std::vector<int>& ranks, std::chrono::milliseconds timeout,
    const std::function<void(tcp::Mesh&)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank : ranks) {
    threads.emplace_back([&, rank] {
      try {
        tcp::Mesh mesh(store_of(rank), rank, world, timeout);
        body(mesh);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

// The same with one store for every rank.
inline std::vector<std::string> run_meshes(
    Store& store, int world, const std::vector<int>& ranks,
    std::chrono::milliseconds timeout,
    const std::function<void(tcp::Mesh&)>& body) {
  return run_meshes([&store](int) -> Store& { return store; }, world, ranks,
                    timeout, body);
}

// The same for every rank of the group, all over a fresh HashStore.
inline std::vector<std::string> run_meshes(
    int world, std::chrono::milliseconds timeout,
    const std::function<void(tcp::Mesh&)>& body) {
  HashStore store(timeout);
  std::vector<int> ranks;
  for (int rank = 0; rank < world; ++rank) ranks.push_back(rank);
  return run_meshes(store, world, ranks, timeout, body);
}

}  // namespace comm::testing
