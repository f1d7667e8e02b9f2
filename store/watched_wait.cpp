#include "store/watched_wait.h"

#include <algorithm>
#include <thread>

#include "libcomm/error.h"

namespace comm {
namespace {

// What is left until `deadline`, at least a millisecond.
Store::Duration left_until(detail::Clock::time_point deadline) {
  return std::max<Store::Duration>(std::chrono::duration_cast<Store::Duration>(
                                       deadline - detail::Clock::now()),
                                   Store::Duration(1));
}

[[noreturn]] void throw_timeout(const std::vector<std::string>& keys,
                                detail::Clock::time_point start) {
  throw TimeoutError(
      "timed out after " +
      format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(
          detail::Clock::now() - start)) +
      " waiting for " + quote_keys(keys));
}

std::vector<Bytes> wait_in_slices(Store& store,
                                  const std::vector<std::string>& keys,
                                  detail::Clock::time_point deadline,
                                  const std::function<void()>& watch,
                                  Store::Duration slice) {
  const auto start = detail::Clock::now();
  // Bounded by the deadline: each round waits a slice or less.
  for (;;) {
    const Store::Duration left = left_until(deadline);
    const Store::Duration wait = std::min(left, slice);
    try {
      return ask_store(watch, [&] { return store.multi_get(keys, wait); });
    } catch (const TimeoutError&) {
      if (wait == left) throw_timeout(keys, start);
    }
    watch();
  }
}

std::vector<Bytes> wait_by_asking(Store& store,
                                  const std::vector<std::string>& keys,
                                  detail::Clock::time_point deadline,
                                  const std::function<void()>& watch,
                                  Store::Duration slice) {
  const auto start = detail::Clock::now();
  // Bounded by the deadline: each round asks once and pauses, from 1 ms
  // doubling up to a slice, so that a key set soon is seen soon.
  for (Store::Duration pause(1);; pause = std::min(2 * pause, slice)) {
    if (ask_store(watch, [&] { return store.check(keys); })) {
      return ask_store(
          watch, [&] { return store.multi_get(keys, left_until(deadline)); });
    }
    if (detail::Clock::now() >= deadline) throw_timeout(keys, start);
    watch();
    std::this_thread::sleep_for(std::min(pause, left_until(deadline)));
  }
}

}  // namespace

std::vector<Bytes> multi_get_watched(Store& store,
                                     const std::vector<std::string>& keys,
                                     detail::Clock::time_point deadline,
                                     const std::function<void()>& watch,
                                     Store::Duration slice) {
  if (watch == nullptr) return store.multi_get(keys, left_until(deadline));
  return store.resumes_after_timeout()
             ? wait_in_slices(store, keys, deadline, watch, slice)
             : wait_by_asking(store, keys, deadline, watch, slice);
}

}  // namespace comm
