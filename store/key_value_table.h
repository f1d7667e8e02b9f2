// The data and semantics every store shares: a map of keys to byte values
// with c10d's add, compare_set and append rules. Not thread-safe: HashStore
// guards it with a mutex, the TCPStore server touches it only from its event
// loop, and FileStore rebuilds it from its file under a lock.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/store.h"

namespace comm {

class KeyValueTable {
 public:
  void set(const std::string& key, Bytes value);
  // The value of `key`, or null when it is not set.
  const Bytes* find(const std::string& key) const;
  bool contains_all(const std::vector<std::string>& keys) const;
  // The keys of `keys` that are not set, in order.
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  // See Store::add. Throws InvalidArgument when the key holds something
  // other than a decimal integer; the table is then unchanged.
  std::int64_t add(const std::string& key, std::int64_t delta);
  // The value add(key, delta) would store, without storing it.
  std::int64_t sum_after_add(const std::string& key, std::int64_t delta) const;
  // See Store::compare_set. `*stored` says whether `desired` was stored.
  Bytes compare_set(const std::string& key, const Bytes& expected,
                    const Bytes& desired, bool* stored);
  // Whether compare_set(key, expected, ...) would store its value.
  bool compare_matches(const std::string& key, const Bytes& expected) const;
  // Appends `value` to the value of `key`. Throws InvalidArgument, leaving
  // the table unchanged, when the result would exceed Store::kMaxValueSize.
  void append(const std::string& key, const Bytes& value);
  // Throws what append(key, value) would throw, without appending.
  void check_append(const std::string& key, const Bytes& value) const;
  bool erase(const std::string& key);
  std::int64_t size() const { return static_cast<std::int64_t>(map_.size()); }

 private:
  std::unordered_map<std::string, Bytes> map_;
};

// The value `add` keeps: the decimal text of `number`.
Bytes encode_counter(std::int64_t number);

// Parses a counter value. Throws InvalidArgument naming the key otherwise.
std::int64_t decode_counter(const std::string& key, const Bytes& value);

}  // namespace comm
