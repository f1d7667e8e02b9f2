#include "store/store_barrier.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "libcomm/detail/log.h"
#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "store/watched_wait.h"

namespace comm {
namespace {

// The value of "complete": kJoined, or kFailed and the reason.
constexpr std::string_view kJoined = "ok";
constexpr std::string_view kFailed = "failed: ";

// The outcome that the value of "complete" stands for: "" or the reason.
std::string outcome_of(const std::string& complete) {
  if (complete == kJoined) return "";
  return complete.starts_with(kFailed) ? complete.substr(kFailed.size())
                                       : complete;
}

// "3 of 4 ranks arrived; missing rank 1", asked of the store, one request
// per rank.
std::string arrivals(const StoreBarrier& barrier) {
  std::vector<std::string> missing;
  for (int r = 0; r < barrier.size; ++r) {
    if (!barrier.store.check({barrier.prefix + "rank/" + std::to_string(r)})) {
      missing.push_back(std::to_string(r));
    }
  }
  std::string list;
  for (std::size_t i = 0; i < missing.size() && i < 32; ++i) {
    list += (i ? ", " : "") + missing[i];
  }
  if (missing.size() > 32) list += ", ...";
  return std::to_string(barrier.size - static_cast<int>(missing.size())) +
         " of " + std::to_string(barrier.size) +
         " ranks arrived; missing rank" + (missing.size() == 1 ? " " : "s ") +
         list;
}

// Counts `rank` out of a barrier that failed: itself, or, `on_behalf` of a
// dead rank, only where that rank was not counted out yet (it left before
// it died, or another rank reported it); the last rank out says so, for
// the lingering ones.
void leave_failed(const StoreBarrier& barrier, int rank, bool on_behalf) {
  Store& store = barrier.store;
  const bool first =
      store.add(barrier.prefix + "left/" + std::to_string(rank), 1) == 1;
  if (on_behalf && !first) return;
  if (store.add(barrier.prefix + "left", 1) == barrier.size) {
    store.set_string(barrier.prefix + "all_left", "yes");
  }
}

// Waits, up to `linger`, until every rank has left a failed barrier: one
// that hosts the store takes it down as it exits, and the others should
// have read why first. A store that a timed-out wait would leave unusable
// is asked rather than waited on (watched_wait.h): this rank has no more
// use for it, but its caller might. Never throws.
void linger_until_all_left(const StoreBarrier& barrier,
                           std::chrono::milliseconds linger) {
  try {
    multi_get_watched(barrier.store, {barrier.prefix + "all_left"},
                      detail::deadline_after(linger), [] {});
  } catch (const Error&) {
    // The store is gone, or some rank is not coming to read the news.
  }
}

// Decides the barrier's outcome once: the first value offered for
// "complete" wins. The winner is set again, unchanged, since c10d's
// TCPStore (1.13) wakes no waiter for a compare-and-set.
void settle(const StoreBarrier& barrier, const std::string& value) {
  const std::string complete_key = barrier.prefix + "complete";
  const Bytes winner =
      barrier.store.compare_set(complete_key, {}, to_bytes(value));
  barrier.store.set(complete_key, winner);
}

// The barrier's outcome, waited for until `deadline`. One blocking get
// rather than a wait and then a get: every waiting rank receives the
// outcome in the same answer that wakes it, so that a rank that fails and
// takes a store server down with it cannot cut anyone off between the
// two. It says for whom it waits after each tenth of the timeout (from 1
// to 30 s) rather than stay silent until the timeout, and with a watch it
// waits in shorter slices and asks `watch` after each. `ask` makes a
// store request, asking the watch where the store fails.
template <typename Watch, typename Ask>
std::string wait_for_outcome(const StoreBarrier& barrier,
                             std::chrono::milliseconds timeout,
                             detail::Clock::time_point deadline,
                             const Watch& watch, const Ask& ask) {
  Store& store = barrier.store;
  const std::string complete_key = barrier.prefix + "complete";
  const Store::Duration report_every =
      store.resumes_after_timeout()
          ? std::clamp<Store::Duration>(timeout / 10, std::chrono::seconds(1),
                                        std::chrono::seconds(30))
          : timeout;
  const bool watched =
      barrier.watch != nullptr && store.resumes_after_timeout();
  const Store::Duration slice =
      watched ? std::min(report_every, barrier.watch_every) : report_every;
  auto next_report = detail::Clock::now() + report_every;
  int reports = 0;
  // Bounded by the deadline: each round waits a slice or less.
  for (;;) {
    const auto left = std::chrono::duration_cast<Store::Duration>(
        deadline - detail::Clock::now());
    try {
      return ask([&] {
        return store.get_string(
            complete_key, std::max(Store::Duration(1), std::min(left, slice)));
      });
    } catch (const TimeoutError&) {
      if (left <= slice) {
        // The last rank may have arrived as the wait ran out; a store that
        // a timed-out wait leaves out of step cannot be asked that, nor
        // whom it waited for.
        if (store.resumes_after_timeout() && completed_outcome(barrier) == "") {
          return std::string(kJoined);
        }
        throw TimeoutError(barrier.what + " timed out after " +
                           format_duration(timeout) + ": " +
                           (store.resumes_after_timeout()
                                ? arrivals(barrier)
                                : std::string("some ranks did not arrive")));
      }
    }
    if (watched) watch();
    if (detail::Clock::now() < next_report) continue;
    next_report += report_every;
    // The missing ranks from rank 0 alone; the others say how many
    // arrived, in one request (every rank asking for every rank would
    // make N^2 requests of the store per slice).
    const std::string seen =
        barrier.rank == 0
            ? arrivals(barrier)
            : std::to_string(store.add(barrier.prefix + "arrived", 0)) +
                  " of " + std::to_string(barrier.size) + " ranks arrived";
    COMM_LOG_WARN("{}: rank {} has waited {} of its {}: {}", barrier.what,
                  barrier.rank, format_duration(++reports * report_every),
                  format_duration(timeout), seen);
  }
}

}  // namespace

std::string arrive_and_wait(const StoreBarrier& barrier,
                            std::chrono::milliseconds timeout, bool marked) {
  Store& store = barrier.store;
  const std::string complete_key = barrier.prefix + "complete";
  // The watch, believed only while the barrier is incomplete: a rank may
  // end as soon as it has read the outcome. Also asked where the store
  // fails, as its server may have gone with a rank that found a death
  // first.
  const auto watch = [&] {
    try {
      barrier.watch();
    } catch (const Error&) {
      bool complete = false;
      try {
        complete = store.check({complete_key});
      } catch (const Error&) {
        // The store is gone too: the watch's error is the one to report.
      }
      if (!complete) throw;
    }
  };
  // A store request, with the watch asked where the store fails.
  const auto ask = [&](auto&& request) {
    if (barrier.watch == nullptr) return request();
    return ask_store(watch, request);
  };
  ask([&] {
    if (!marked) {
      store.set_string(barrier.prefix + "rank/" + std::to_string(barrier.rank),
                       "arrived");
    }
    // The count says which rank is last, once; a failure posted first
    // stays.
    if (store.add(barrier.prefix + "arrived", 1) == barrier.size) {
      settle(barrier, std::string(kJoined));
    }
    return 0;
  });
  const auto deadline = detail::deadline_after(timeout);
  std::string outcome;
  if (barrier.watch != nullptr && !store.resumes_after_timeout()) {
    // A store that a timed-out wait would leave out of step is asked
    // whether the outcome is there instead (watched_wait.h).
    try {
      outcome = to_string(multi_get_watched(store, {complete_key}, deadline,
                                            watch, barrier.watch_every)
                              .at(0));
    } catch (const TimeoutError&) {
      // The last rank may have arrived as the wait ran out.
      if (const auto last = completed_outcome(barrier); last == "") return "";
      throw TimeoutError(barrier.what + " timed out after " +
                         format_duration(timeout) + ": " + arrivals(barrier));
    }
  } else {
    outcome = wait_for_outcome(barrier, timeout, deadline, watch, ask);
  }
  if (outcome == kJoined) return "";
  try {
    leave_failed(barrier, barrier.rank, false);
  } catch (const Error&) {
    // The store went with its host after the answer: the outcome stands,
    // and there is no one left to linger for.
    return outcome_of(outcome);
  }
  linger_until_all_left(barrier, kLingerAfterFailure);
  return outcome_of(outcome);
}

std::optional<std::string> completed_outcome(const StoreBarrier& barrier) {
  const std::string complete_key = barrier.prefix + "complete";
  if (!barrier.store.check({complete_key})) return std::nullopt;
  return outcome_of(barrier.store.get_string(complete_key));
}

void fail_barrier(const StoreBarrier& barrier, const std::string& problem,
                  std::chrono::milliseconds linger, int dead_rank) {
  try {
    settle(barrier, std::string(kFailed) + problem);
    if (dead_rank >= 0) leave_failed(barrier, dead_rank, true);
    leave_failed(barrier, barrier.rank, false);
  } catch (const Error&) {
    // The store is gone: no rank can read the news any more.
    return;
  }
  linger_until_all_left(barrier, linger);
}

}  // namespace comm
