#include "store/store.h"

#include <cstdio>

#include "libcomm/error.h"

namespace comm {
namespace {

void check_key(const std::string& key) {
  if (key.size() > Store::kMaxKeySize) {
    throw InvalidArgument("store key of " + std::to_string(key.size()) +
                          " bytes is longer than the limit of " +
                          std::to_string(Store::kMaxKeySize) + " bytes");
  }
}

void check_keys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) check_key(key);
}

void check_value(const std::string& key, std::size_t size) {
  if (size > Store::kMaxValueSize) {
    throw InvalidArgument("store value of " + std::to_string(size) +
                          " bytes for key '" + key.substr(0, 64) +
                          "' is larger than the limit of " +
                          std::to_string(Store::kMaxValueSize) + " bytes");
  }
}

}  // namespace

Store::Store(Duration timeout) : timeout_(timeout) {}
Store::~Store() = default;

Bytes Store::do_derive_key(const std::string&) { return {}; }

void Store::set(const std::string& key, const Bytes& value) {
  check_key(key);
  check_value(key, value.size());
  do_set(key, value);
}

Bytes Store::get(const std::string& key, Duration timeout) {
  check_key(key);
  return do_get(key, timeout);
}

std::int64_t Store::add(const std::string& key, std::int64_t delta) {
  check_key(key);
  return do_add(key, delta);
}

Bytes Store::compare_set(const std::string& key, const Bytes& expected,
                         const Bytes& desired) {
  check_key(key);
  check_value(key, expected.size());
  check_value(key, desired.size());
  return do_compare_set(key, expected, desired);
}

void Store::wait(const std::vector<std::string>& keys, Duration timeout) {
  check_keys(keys);
  if (keys.empty()) return;
  do_wait(keys, timeout);
}

bool Store::check(const std::vector<std::string>& keys) {
  check_keys(keys);
  if (keys.empty()) return true;
  return do_check(keys);
}

bool Store::delete_key(const std::string& key) {
  check_key(key);
  return do_delete_key(key);
}

std::int64_t Store::num_keys() { return do_num_keys(); }

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys,
                                    Duration timeout) {
  check_keys(keys);
  if (keys.empty()) return {};
  return do_multi_get(keys, timeout);
}

void Store::multi_set(const std::vector<std::string>& keys,
                      const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument("multi_set got " + std::to_string(keys.size()) +
                          " keys but " + std::to_string(values.size()) +
                          " values; pass one value per key");
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i]);
    check_value(keys[i], values[i].size());
  }
  if (keys.empty()) return;
  do_multi_set(keys, values);
}

void Store::append(const std::string& key, const Bytes& value) {
  check_key(key);
  check_value(key, value.size());
  do_append(key, value);
}

void Store::set_string(const std::string& key, std::string_view value) {
  set(key, to_bytes(value));
}

std::string Store::get_string(const std::string& key, Duration timeout) {
  return to_string(get(key, timeout));
}

Bytes to_bytes(std::string_view text) {
  return Bytes(text.begin(), text.end());
}

std::string to_string(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::string quote_keys(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 8;
  std::string text;
  for (std::size_t i = 0; i < keys.size() && i < kShown; ++i) {
    if (i > 0) text += ", ";
    text += "'" + keys[i] + "'";
  }
  if (keys.size() > kShown) {
    text += " and " + std::to_string(keys.size() - kShown) + " more";
  }
  return text;
}

void throw_store_timeout(const std::string& store_name,
                         const std::vector<std::string>& keys,
                         std::chrono::milliseconds waited) {
  throw TimeoutError(
      store_name + ": timed out after " + format_duration(waited) +
      " waiting for key" + (keys.size() == 1 ? " " : "s ") + quote_keys(keys) +
      "; the rank that should set " + (keys.size() == 1 ? "it" : "them") +
      " may have failed or not started");
}

}  // namespace comm
