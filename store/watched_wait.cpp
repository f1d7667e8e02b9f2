#include "store/watched_wait.h"

#include <algorithm>

#include "libcomm/error.h"

namespace comm {

std::vector<Bytes> multi_get_watched(Store& store,
                                     const std::vector<std::string>& keys,
                                     detail::Clock::time_point deadline,
                                     const std::function<void()>& watch,
                                     Store::Duration slice) {
  const auto start = detail::Clock::now();
  const bool sliced = store.resumes_after_timeout() && watch != nullptr;
  // Bounded by the deadline: each round waits a slice or less.
  for (;;) {
    const auto left =
        std::max<Store::Duration>(std::chrono::duration_cast<Store::Duration>(
                                      deadline - detail::Clock::now()),
                                  Store::Duration(1));
    const Store::Duration wait = sliced ? std::min(left, slice) : left;
    try {
      return store.multi_get(keys, wait);
    } catch (const TimeoutError&) {
      if (wait == left) {
        throw TimeoutError(
            "timed out after " +
            format_duration(
                std::chrono::duration_cast<std::chrono::milliseconds>(
                    detail::Clock::now() - start)) +
            " waiting for " + quote_keys(keys));
      }
    } catch (const Error&) {
      if (watch != nullptr) watch();
      throw;
    }
    watch();
  }
}

}  // namespace comm
