// A rank's store that ends the rank's process with SIGKILL as soon as it
// has set a key ending in `fatal_key`: a rank that dies at that point of
// the group's set-up.
#pragma once

#include <signal.h>

#include <string>

#include "support/forwarding_store.h"

namespace comm::testing {

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

}  // namespace comm::testing
