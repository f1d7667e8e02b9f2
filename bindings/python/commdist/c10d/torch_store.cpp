#include "torch_store.h"

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <utility>

#include "libcomm/error.h"

namespace commdist_c10d {
namespace {

constexpr const char* kName = "torch.distributed store";

// Runs one call of the c10d store, rethrowing its error as a comm::Error
// that says which call failed. c10d's stores throw c10::Error, and their
// sockets std::system_error where the connection fails (a store server
// gone with its process): both are the store's failure.
template <typename Call>
auto translate(const char* what, const std::string& key, Call&& call) {
  const auto failed = [&](const char* why) {
    return comm::BackendError(std::string(kName) + ": " + what + " of key '" +
                              key + "' failed: " + why);
  };
  try {
    return call();
  } catch (const c10::Error& error) {
    throw failed(error.what_without_backtrace());
  } catch (const std::exception& error) {
    throw failed(error.what());
  }
}

// The longest a c10d wait is asked for, so that a comm timeout of "forever"
// (Duration::max()) does not overflow inside the store; c10d's own kNoTimeout
// (zero) would mean the store's default instead.
constexpr comm::Store::Duration kLongestWait = std::chrono::hours(24 * 365);

}  // namespace

TorchStore::TorchStore(c10::intrusive_ptr<c10d::Store> store, Duration timeout)
    : comm::Store(timeout), store_(std::move(store)) {
  if (!store_)
    throw comm::InvalidArgument("TorchStore: the c10d store is null");
}

TorchStore::~TorchStore() = default;

void TorchStore::do_set(const std::string& key, const comm::Bytes& value) {
  translate("set", key, [&] { store_->set(key, value); });
}

comm::Bytes TorchStore::do_get(const std::string& key, Duration timeout) {
  do_wait({key}, timeout);
  return translate("get", key, [&] { return store_->get(key); });
}

std::int64_t TorchStore::do_add(const std::string& key, std::int64_t delta) {
  return translate("add", key, [&] { return store_->add(key, delta); });
}

comm::Bytes TorchStore::do_compare_set(const std::string& key,
                                       const comm::Bytes& expected,
                                       const comm::Bytes& desired) {
  return translate("compare_set", key,
                   [&] { return store_->compareSet(key, expected, desired); });
}

void TorchStore::do_wait(const std::vector<std::string>& keys,
                         Duration timeout) {
  const Duration bounded =
      std::min(std::max(timeout, Duration(1)), kLongestWait);
  try {
    store_->wait(keys, bounded);
  } catch (const c10::Error& error) {
    // c10d's stores report a timeout as a plain c10::Error ("Socket
    // Timeout", "Wait timeout"): when a key is still missing, that is what
    // happened, and the comm error names the keys.
    bool present = false;
    try {
      present = store_->check(keys);
    } catch (const std::exception&) {
      // Not known to be there: the timeout is the error to report.
    }
    if (!present) comm::throw_store_timeout(kName, keys, bounded);
    throw comm::BackendError(std::string(kName) + ": wait for " +
                             comm::quote_keys(keys) +
                             " failed: " + error.what_without_backtrace());
  } catch (const std::exception& error) {
    throw comm::BackendError(std::string(kName) + ": wait for " +
                             comm::quote_keys(keys) +
                             " failed: " + error.what());
  }
}

bool TorchStore::do_check(const std::vector<std::string>& keys) {
  return translate("check", keys.empty() ? std::string() : keys.front(),
                   [&] { return store_->check(keys); });
}

bool TorchStore::do_delete_key(const std::string& key) {
  return translate("delete_key", key, [&] { return store_->deleteKey(key); });
}

std::int64_t TorchStore::do_num_keys() {
  return translate("num_keys", "", [&] { return store_->getNumKeys(); });
}

std::vector<comm::Bytes> TorchStore::do_multi_get(
    const std::vector<std::string>& keys, Duration timeout) {
  do_wait(keys, timeout);
  std::vector<comm::Bytes> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    values.push_back(translate("get", key, [&] { return store_->get(key); }));
  }
  return values;
}

void TorchStore::do_multi_set(const std::vector<std::string>& keys,
                              const std::vector<comm::Bytes>& values) {
  for (std::size_t i = 0; i < keys.size(); ++i) do_set(keys[i], values[i]);
}

void TorchStore::do_append(const std::string& key, const comm::Bytes& value) {
  // Each failed compare-and-set means another rank appended in between, so
  // the loop ends after at most as many rounds as there are concurrent
  // appenders; the bound only turns a store that never agrees into an error.
  constexpr int kMaxRounds = 1 << 16;
  comm::Bytes current;
  if (do_check({key})) {
    current = translate("get", key, [&] { return store_->get(key); });
  }
  for (int round = 0; round < kMaxRounds; ++round) {
    comm::Bytes desired = current;
    desired.insert(desired.end(), value.begin(), value.end());
    comm::Bytes now = do_compare_set(key, current, desired);
    if (now == desired) return;
    current = std::move(now);
  }
  throw comm::BackendError(std::string(kName) + ": append to key '" + key +
                           "' lost the compare-and-set race " +
                           std::to_string(kMaxRounds) + " times");
}

}  // namespace commdist_c10d
