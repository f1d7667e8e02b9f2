// Waiting on a store while watching what the store cannot see. A set-up
// waits for keys that its peers publish, and a peer that dies before it
// publishes one looks to the store like a slow peer: its waiters would
// learn of it only at their deadline. A watched wait asks the caller, in
// between slices of the wait, whether to go on (whether the peers it waits
// for still live, say).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "store/store.h"

namespace comm {

// What `request`, a call to a store, returns. Where the store fails, but
// for a timeout, `watch` is called before the failure is passed on: the
// store's server may have gone with a rank that found the death first, and
// the watch names that death.
template <typename Watch, typename Request>
auto ask_store(const Watch& watch, Request&& request) {
  try {
    return request();
  } catch (const TimeoutError&) {
    throw;
  } catch (const Error&) {
    watch();
    throw;
  }
}

// How long each slice of a watched wait lasts: a dead peer is noticed
// within about this, at the cost of one request to the store per slice.
inline constexpr Store::Duration kWatchEvery = std::chrono::milliseconds(200);

// The values of `keys`, as Store::multi_get gives them, waiting until
// `deadline` and calling `watch` every `slice` or so while a key is
// missing; `watch` ends the wait by throwing. Where the store resumes
// after a timed-out wait (Store::resumes_after_timeout) it waits in slices;
// on another store, where a timed-out wait would leave it out of step, it
// asks whether the keys are set (Store::check), pausing between asks from
// 1 ms, doubled each time, up to `slice`. Throws TimeoutError, naming the
// keys and the whole wait, at the deadline. Where the store fails (its
// server went away, say), `watch` is called before the failure is passed
// on, so that a store that a dead peer's process took down with it is
// reported as that death. Without a watch, one multi_get.
std::vector<Bytes> multi_get_watched(Store& store,
                                     const std::vector<std::string>& keys,
                                     detail::Clock::time_point deadline,
                                     const std::function<void()>& watch,
                                     Store::Duration slice = kWatchEvery);

}  // namespace comm
