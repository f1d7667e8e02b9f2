// A Store that forwards every call to another one, for tests to derive from
// and change one behaviour: the keys it derives (KeyedStore), or when its
// gets answer.
#pragma once

#include <string>
#include <vector>

#include "store/store.h"

namespace comm::testing {

class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(Store& inner)
      : Store(inner.timeout()), inner_(inner) {}

 protected:
  void do_set(const std::string& key, const Bytes& value) override {
    inner_.set(key, value);
  }
  Bytes do_get(const std::string& key, Duration timeout) override {
    return inner_.get(key, timeout);
  }
  std::int64_t do_add(const std::string& key, std::int64_t delta) override {
    return inner_.add(key, delta);
  }
  Bytes do_compare_set(const std::string& key, const Bytes& expected,
                       const Bytes& desired) override {
    return inner_.compare_set(key, expected, desired);
  }
  void do_wait(const std::vector<std::string>& keys,
               Duration timeout) override {
    inner_.wait(keys, timeout);
  }
  bool do_check(const std::vector<std::string>& keys) override {
    return inner_.check(keys);
  }
  bool do_delete_key(const std::string& key) override {
    return inner_.delete_key(key);
  }
  std::int64_t do_num_keys() override { return inner_.num_keys(); }
  std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                  Duration timeout) override {
    return inner_.multi_get(keys, timeout);
  }
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<Bytes>& values) override {
    inner_.multi_set(keys, values);
  }
  void do_append(const std::string& key, const Bytes& value) override {
    inner_.append(key, value);
  }
  Bytes do_derive_key(const std::string& purpose) override {
    return inner_.derive_key(purpose);
  }
  bool do_resumes_after_timeout() override {
    return inner_.resumes_after_timeout();
  }

  Store& inner_;
};

}  // namespace comm::testing
