#include "store/prefix_store.h"

#include "libcomm/error.h"

namespace comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store ? store->timeout() : kDefaultTimeout),
      prefix_(std::move(prefix)),
      store_(std::move(store)) {
  if (!store_) throw InvalidArgument("PrefixStore needs a store to wrap");
}

PrefixStore::~PrefixStore() = default;

std::string PrefixStore::scoped(const std::string& key) const {
  return prefix_ + "/" + key;
}

std::vector<std::string> PrefixStore::scoped(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> result;
  result.reserve(keys.size());
  for (const std::string& key : keys) result.push_back(scoped(key));
  return result;
}

void PrefixStore::do_set(const std::string& key, const Bytes& value) {
  store_->set(scoped(key), value);
}

Bytes PrefixStore::do_get(const std::string& key, Duration timeout) {
  return store_->get(scoped(key), timeout);
}

std::int64_t PrefixStore::do_add(const std::string& key, std::int64_t delta) {
  return store_->add(scoped(key), delta);
}

Bytes PrefixStore::do_compare_set(const std::string& key, const Bytes& expected,
                                  const Bytes& desired) {
  return store_->compare_set(scoped(key), expected, desired);
}

void PrefixStore::do_wait(const std::vector<std::string>& keys,
                          Duration timeout) {
  store_->wait(scoped(keys), timeout);
}

bool PrefixStore::do_check(const std::vector<std::string>& keys) {
  return store_->check(scoped(keys));
}

bool PrefixStore::do_delete_key(const std::string& key) {
  return store_->delete_key(scoped(key));
}

std::int64_t PrefixStore::do_num_keys() { return store_->num_keys(); }

std::vector<Bytes> PrefixStore::do_multi_get(
    const std::vector<std::string>& keys, Duration timeout) {
  return store_->multi_get(scoped(keys), timeout);
}

void PrefixStore::do_multi_set(const std::vector<std::string>& keys,
                               const std::vector<Bytes>& values) {
  store_->multi_set(scoped(keys), values);
}

void PrefixStore::do_append(const std::string& key, const Bytes& value) {
  store_->append(scoped(key), value);
}

Bytes PrefixStore::do_derive_key(const std::string& purpose) {
  return store_->derive_key(scoped(purpose));
}

}  // namespace comm
