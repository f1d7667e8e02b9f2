#include "store/key_value_table.h"

#include <charconv>

#include "libcomm/error.h"

namespace comm {

Bytes encode_counter(std::int64_t number) {
  return to_bytes(std::to_string(number));
}

std::int64_t decode_counter(const std::string& key, const Bytes& value) {
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  std::int64_t number = 0;
  auto [stop, ec] = std::from_chars(begin, end, number);
  if (value.empty() || ec != std::errc() || stop != end) {
    throw InvalidArgument("add on key '" + key +
                          "', which holds a value that is not a decimal "
                          "integer (" +
                          std::to_string(value.size()) +
                          " bytes); use add only on keys that add created");
  }
  return number;
}

void KeyValueTable::set(const std::string& key, Bytes value) {
  map_[key] = std::move(value);
}

const Bytes* KeyValueTable::find(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

bool KeyValueTable::contains_all(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (map_.find(key) == map_.end()) return false;
  }
  return true;
}

std::vector<std::string> KeyValueTable::missing(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> result;
  for (const std::string& key : keys) {
    if (map_.find(key) == map_.end()) result.push_back(key);
  }
  return result;
}

std::int64_t KeyValueTable::sum_after_add(const std::string& key,
                                          std::int64_t delta) const {
  const Bytes* value = find(key);
  const std::int64_t current = value ? decode_counter(key, *value) : 0;
  // Wrap like the reduction kernels rather than overflow.
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(current) +
                                   static_cast<std::uint64_t>(delta));
}

std::int64_t KeyValueTable::add(const std::string& key, std::int64_t delta) {
  const std::int64_t sum = sum_after_add(key, delta);
  map_[key] = encode_counter(sum);
  return sum;
}

bool KeyValueTable::compare_matches(const std::string& key,
                                    const Bytes& expected) const {
  const Bytes* value = find(key);
  return value == nullptr ? expected.empty() : *value == expected;
}

Bytes KeyValueTable::compare_set(const std::string& key, const Bytes& expected,
                                 const Bytes& desired, bool* stored) {
  *stored = compare_matches(key, expected);
  if (*stored) {
    map_[key] = desired;
    return desired;
  }
  const Bytes* value = find(key);
  return value == nullptr ? expected : *value;
}

void KeyValueTable::check_append(const std::string& key,
                                 const Bytes& value) const {
  const Bytes* now = find(key);
  const std::size_t before = now == nullptr ? 0 : now->size();
  if (value.size() > Store::kMaxValueSize - before) {
    throw InvalidArgument("append to '" + key + "' would make its value " +
                          std::to_string(before + value.size()) +
                          " bytes, over the limit of " +
                          std::to_string(Store::kMaxValueSize) +
                          " bytes per value; the value was left as it was");
  }
}

void KeyValueTable::append(const std::string& key, const Bytes& value) {
  check_append(key, value);
  Bytes& slot = map_[key];
  slot.insert(slot.end(), value.begin(), value.end());
}

bool KeyValueTable::erase(const std::string& key) {
  return map_.erase(key) > 0;
}

}  // namespace comm
