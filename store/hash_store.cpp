#include "store/hash_store.h"

namespace comm {

HashStore::HashStore(Duration timeout) : Store(timeout) {}
HashStore::~HashStore() = default;

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock,
                            const std::vector<std::string>& keys,
                            Duration timeout) {
  const bool ready = changed_.wait_for(
      lock, timeout, [&] { return table_.contains_all(keys); });
  if (!ready) throw_store_timeout("HashStore", table_.missing(keys), timeout);
}

void HashStore::do_set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    table_.set(key, value);
  }
  changed_.notify_all();
}

Bytes HashStore::do_get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, {key}, timeout);
  return *table_.find(key);
}

std::int64_t HashStore::do_add(const std::string& key, std::int64_t delta) {
  std::int64_t result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result = table_.add(key, delta);
  }
  changed_.notify_all();
  return result;
}

Bytes HashStore::do_compare_set(const std::string& key, const Bytes& expected,
                                const Bytes& desired) {
  bool stored = false;
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    result = table_.compare_set(key, expected, desired, &stored);
  }
  if (stored) changed_.notify_all();
  return result;
}

void HashStore::do_wait(const std::vector<std::string>& keys,
                        Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, keys, timeout);
}

bool HashStore::do_check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.contains_all(keys);
}

bool HashStore::do_delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.erase(key);
}

std::int64_t HashStore::do_num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.size();
}

std::vector<Bytes> HashStore::do_multi_get(const std::vector<std::string>& keys,
                                           Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, keys, timeout);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(*table_.find(key));
  return values;
}

void HashStore::do_multi_set(const std::vector<std::string>& keys,
                             const std::vector<Bytes>& values) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 0; i < keys.size(); ++i)
      table_.set(keys[i], values[i]);
  }
  changed_.notify_all();
}

void HashStore::do_append(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    table_.append(key, value);
  }
  changed_.notify_all();
}

}  // namespace comm
