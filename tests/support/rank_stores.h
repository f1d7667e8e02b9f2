// The stores of rank processes in tests of failures during a group's
// set-up: each rank's client of one TCPStore, kept as a program keeps it,
// and wrappers that make a rank die, or arrive late, at a chosen point.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "store/tcp_store.h"
#include "support/forwarding_store.h"

namespace comm::testing {

// Rank `rank`'s client of the TCPStore at host:port, which rank 0 hosts.
// It is kept until the process ends (rank processes end with _exit), so
// that rank 0's server goes only with its process, as in a program that
// keeps its store for its whole run: a test then sees what peers see when
// a rank that found a failure exits at once.
inline std::shared_ptr<Store> kept_rank_store(
    int rank, std::uint16_t port, const std::string& host = "127.0.0.1",
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  static std::shared_ptr<Store> kept;  // never destroyed: see above
  TCPStoreOptions options;
  options.host = host;
  options.port = port;
  options.is_server = rank == 0;
  options.timeout = timeout;
  kept = std::make_shared<TCPStore>(options);
  return kept;
}

// A rank's store that ends the rank's process with SIGKILL as soon as it
// has set a key ending in `fatal_key`: a rank that dies at that point of
// the group's set-up.
class DyingStore final : public ForwardingStore {
 public:
  DyingStore(Store& inner, std::string fatal_key)
      : ForwardingStore(inner), fatal_key_(std::move(fatal_key)) {}

 private:
  void do_set(const std::string& key, const Bytes& value) override {
    ForwardingStore::do_set(key, value);
    if (key.ends_with(fatal_key_)) raise(SIGKILL);
  }

  std::string fatal_key_;
};

// A rank's store that holds the rank for `delay` before it sets a key
// ending in `slow_key`: a rank that arrives late at that point.
class SlowStore final : public ForwardingStore {
 public:
  SlowStore(Store& inner, std::string slow_key, std::chrono::milliseconds delay)
      : ForwardingStore(inner), slow_key_(std::move(slow_key)), delay_(delay) {}

 private:
  void do_set(const std::string& key, const Bytes& value) override {
    if (key.ends_with(slow_key_)) std::this_thread::sleep_for(delay_);
    ForwardingStore::do_set(key, value);
  }

  std::string slow_key_;
  std::chrono::milliseconds delay_;
};

}  // namespace comm::testing
