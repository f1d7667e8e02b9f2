// commdist_c10d::TorchStore: the c10d::Store that torch.distributed hands a
// backend's creator, seen as a comm::Store, so that libcomm's process group
// meets its peers through the store torch already set up (env://, tcp://,
// file://, or any Store object given to init_process_group).
//
// The adapter keeps c10d's semantics: keys, values and counters are the
// ones torch's own stores hold, so a job may mix libcomm and gloo groups
// over one store. What c10d's 1.13 Store interface lacks is built from what
// it has: get with a timeout is a wait then a get, multi_get and multi_set
// are one call per key, and append is a compare-and-set retried while other
// ranks append to the same key. c10d's errors (c10::Error) are rethrown as
// comm::BackendError with c10d's message without its C++ backtrace; a wait that
// runs out of time is a comm::TimeoutError naming the missing keys.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "store/store.h"

namespace commdist_c10d {

class TorchStore final : public comm::Store {
 public:
  // Calls without a timeout of their own use `timeout`.
  TorchStore(c10::intrusive_ptr<c10d::Store> store, Duration timeout);
  ~TorchStore() override;

  const c10::intrusive_ptr<c10d::Store>& underlying() const { return store_; }

 private:
  void do_set(const std::string& key, const comm::Bytes& value) override;
  comm::Bytes do_get(const std::string& key, Duration timeout) override;
  bool do_resumes_after_timeout() override { return false; }
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;
  comm::Bytes do_compare_set(const std::string& key,
                             const comm::Bytes& expected,
                             const comm::Bytes& desired) override;
  void do_wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool do_check(const std::vector<std::string>& keys) override;
  bool do_delete_key(const std::string& key) override;
  std::int64_t do_num_keys() override;
  std::vector<comm::Bytes> do_multi_get(const std::vector<std::string>& keys,
                                        Duration timeout) override;
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<comm::Bytes>& values) override;
  void do_append(const std::string& key, const comm::Bytes& value) override;

  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace commdist_c10d
