// comm::PrefixStore: another store seen through a key prefix, so that
// subgroups and independent components share one store without their keys
// colliding. Key "k" becomes "prefix/k" in the underlying store.
#pragma once

#include <memory>

#include "store/store.h"

namespace comm {

class COMM_API PrefixStore final : public Store {
 public:
  // The timeout is the underlying store's at the time of construction.
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  ~PrefixStore() override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying() const { return store_; }

 private:
  std::string scoped(const std::string& key) const;
  std::vector<std::string> scoped(const std::vector<std::string>& keys) const;

  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, Duration timeout) override;
  std::int64_t do_add(const std::string& key, std::int64_t delta) override;
  Bytes do_compare_set(const std::string& key, const Bytes& expected,
                       const Bytes& desired) override;
  void do_wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool do_check(const std::vector<std::string>& keys) override;
  bool do_delete_key(const std::string& key) override;
  // The underlying store's count: keys outside the prefix included, as in
  // c10d, since counting only ours would need a scan no store supports.
  std::int64_t do_num_keys() override;
  std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                  Duration timeout) override;
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<Bytes>& values) override;
  void do_append(const std::string& key, const Bytes& value) override;
  // The underlying store's key for the purpose scoped by the prefix.
  Bytes do_derive_key(const std::string& purpose) override;
  bool do_resumes_after_timeout() override {
    return store_->resumes_after_timeout();
  }

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace comm
