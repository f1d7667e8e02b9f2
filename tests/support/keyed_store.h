// A Store that forwards every call to another one but derives its keys from
// a secret of its own, for tests of what a backend does with
// Store::derive_key: ranks with the same secret over one HashStore behave
// as ranks of a TCPStore with a token, ranks with different secrets as
// ranks that do not share the token.
#pragma once

#include <string>
#include <utility>

#include "libcomm/detail/crypto.h"
#include "support/forwarding_store.h"

namespace comm::testing {

class KeyedStore final : public ForwardingStore {
 public:
  KeyedStore(Store& inner, std::string secret)
      : ForwardingStore(inner), secret_(std::move(secret)) {}

 private:
  Bytes do_derive_key(const std::string& purpose) override {
    const auto key = detail::derive_key(secret_, purpose);
    return Bytes(key.begin(), key.end());
  }

  std::string secret_;
};

}  // namespace comm::testing
