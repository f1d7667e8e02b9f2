// comm::HashStore: an in-process, thread-safe store. It is the store of
// multi-rank tests that run ranks as threads of one process.
#pragma once

#include <condition_variable>
#include <mutex>

#include "store/key_value_table.h"
#include "store/store.h"

namespace comm {

class COMM_API HashStore final : public Store {
 public:
  explicit HashStore(Duration timeout = kDefaultTimeout);
  ~HashStore() override;

 private:
  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, Duration timeout) override;
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;
  Bytes do_compare_set(const std::string& key, const Bytes& expected,
                       const Bytes& desired) override;
  void do_wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool do_check(const std::vector<std::string>& keys) override;
  bool do_delete_key(const std::string& key) override;
  std::int64_t do_num_keys() override;
  std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                  Duration timeout) override;
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<Bytes>& values) override;
  void do_append(const std::string& key, const Bytes& value) override;

  // Blocks until all `keys` are set; the caller holds `lock`.
  void wait_locked(std::unique_lock<std::mutex>& lock,
                   const std::vector<std::string>& keys, Duration timeout);

  std::mutex mutex_;
  std::condition_variable changed_;  // notified whenever a key is set
  KeyValueTable table_;
};

}  // namespace comm
