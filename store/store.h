// comm::Store: the key-value store through which ranks find each other.
//
// The interface and semantics follow c10d's Store, so that code written
// against torch.distributed's stores reads the same here. Values are bytes.
// Every blocking call has a timeout: the per-call one where a call takes one,
// else the store's default (kDefaultTimeout unless set_timeout changed it).
// A timeout throws TimeoutError naming the keys and how long it waited.
//
// The public calls check their arguments (key and value sizes) and resolve
// timeouts, then call the private virtual do_* functions that each store
// implements, so that every store enforces the same limits.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "libcomm/export.h"

namespace comm {

using Bytes = std::vector<std::uint8_t>;

class COMM_API Store {
 public:
  using Duration = std::chrono::milliseconds;
  static constexpr Duration kDefaultTimeout = std::chrono::seconds(300);
  // Larger keys and values are InvalidArgument on every store, so that code
  // that works on one store works on all.
  static constexpr std::size_t kMaxKeySize = 8 << 10;
  static constexpr std::size_t kMaxValueSize = 64 << 20;

  explicit Store(Duration timeout = kDefaultTimeout);
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Stores `value` under `key`, replacing any value there, and wakes every
  // waiter on the key.
  void set(const std::string& key, const Bytes& value);

  // The value of `key`, waiting until it is set or the timeout passes.
  Bytes get(const std::string& key) { return get(key, timeout_); }
  Bytes get(const std::string& key, Duration timeout);

  // Adds `delta` to the integer stored under `key` (a missing key counts as
  // 0) atomically and returns the new value. The value is kept as decimal
  // text, as in c10d; a key holding anything else is InvalidArgument.
  std::int64_t add(const std::string& key, std::int64_t delta);

  // c10d's compare-and-set: when `key` holds `expected`, or is missing and
  // `expected` is empty, stores `desired` and returns it. Otherwise returns
  // the current value, or `expected` when the key is missing.
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired);

  // Waits until every key in `keys` is set. An empty list of keys (here and
  // in check, multi_get and multi_set) returns at once, on every store,
  // without reaching a server.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, Duration timeout);

  // True when every key in `keys` is set; never waits.
  bool check(const std::vector<std::string>& keys);

  // Removes `key`; returns whether it was there.
  bool delete_key(const std::string& key);

  // The number of keys set.
  std::int64_t num_keys();

  // The values of `keys`, in order, waiting until all are set.
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) {
    return multi_get(keys, timeout_);
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               Duration timeout);

  // Sets each key to the value at the same position, atomically with respect
  // to other calls on the store. The two vectors must have equal lengths.
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<Bytes>& values);

  // Appends `value` to the value of `key` (a missing key counts as empty).
  void append(const std::string& key, const Bytes& value);

  // Text conveniences over set and get.
  void set_string(const std::string& key, std::string_view value);
  std::string get_string(const std::string& key) {
    return get_string(key, timeout_);
  }
  std::string get_string(const std::string& key, Duration timeout);

  Duration timeout() const { return timeout_; }
  void set_timeout(Duration timeout) { timeout_ = timeout; }

  // A 32-byte key for `purpose`, derived (HKDF-SHA256) from the secret that
  // this store's clients share, so that a backend can authenticate its own
  // connections between ranks without another secret: the TCP backend's
  // rank connections do. Empty when the store has no secret (a TCPStore
  // without a token, HashStore, FileStore): then those connections are not
  // authenticated either. A PrefixStore's keys differ from its underlying
  // store's and from every other prefix's.
  Bytes derive_key(const std::string& purpose) {
    return do_derive_key(purpose);
  }

  // Whether a get or wait that timed out leaves the store usable, so that a
  // caller may wait in slices and report between them. True but for stores
  // over PyTorch's: the answer to a timed-out wait of c10d's TCPStore
  // (1.13) arrives later and is read as the answer to the next request.
  bool resumes_after_timeout() { return do_resumes_after_timeout(); }

 private:
  virtual void do_set(const std::string& key, const Bytes& value) = 0;
  virtual Bytes do_get(const std::string& key, Duration timeout) = 0;
  virtual std::int64_t do_add(const std::string& key, std::int64_t delta) = 0;
  virtual Bytes do_compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) = 0;
  virtual void do_wait(const std::vector<std::string>& keys,
                       Duration timeout) = 0;
  virtual bool do_check(const std::vector<std::string>& keys) = 0;
  virtual bool do_delete_key(const std::string& key) = 0;
  virtual std::int64_t do_num_keys() = 0;
  virtual std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                          Duration timeout) = 0;
  virtual void do_multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) = 0;
  virtual void do_append(const std::string& key, const Bytes& value) = 0;
  // Stores without a secret keep this default, which returns no key.
  virtual Bytes do_derive_key(const std::string& purpose);
  virtual bool do_resumes_after_timeout() { return true; }

  Duration timeout_;
};

COMM_API Bytes to_bytes(std::string_view text);
COMM_API std::string to_string(const Bytes& bytes);

// "'a', 'b'" for messages that name keys; long lists are cut after a few.
COMM_API std::string quote_keys(const std::vector<std::string>& keys);

// The TimeoutError a store throws when `keys` were not all set after
// `waited`; `store_name` says which store ("TCPStore 10.0.0.1:29500").
[[noreturn]] COMM_API void throw_store_timeout(
    const std::string& store_name, const std::vector<std::string>& keys,
    std::chrono::milliseconds waited);

}  // namespace comm
