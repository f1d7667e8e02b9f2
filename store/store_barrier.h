// A barrier of a group's ranks through their store: it says whom it waits
// for while it waits, and a rank that cannot go on ends it for every rank
// with its reason, so that no rank waits out its timeout for one that has
// already failed. Under `prefix` it keeps "rank/R" for each rank that
// arrived, "arrived" counting them, and "complete" with the outcome; after
// a failure, "left" counting the ranks that have read it (or were counted
// out as dead), "left/R" for each rank counted out, and "all_left" once
// every rank has left.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "store/store.h"
#include "store/watched_wait.h"

namespace comm {

struct StoreBarrier {
  Store& store;
  std::string prefix;  // keys of this barrier alone, ending in '/'
  int rank = 0;
  int size = 1;
  std::string what;  // "rendezvous": how log lines and errors name it
  // Where set, called every `watch_every` or so while the
  // barrier is incomplete; it ends the wait by throwing (a peer that died:
  // it will never arrive). A store that a timed-out wait would leave out
  // of step is then asked whether the barrier is complete rather than
  // waited on. What the watch throws once the barrier has completed is
  // ignored, since a rank may end as soon as it has seen the outcome. It
  // is also called where the store fails, before that failure is passed
  // on: the store's server may have gone with a rank that found the death
  // first.
  std::function<void()> watch = nullptr;
  // How often the watch is called: each call costs the store a request.
  Store::Duration watch_every = kWatchEvery;
};

// How long a rank that fails a barrier, or reads its failure, waits for
// the others to read it before it goes on (fail_barrier, arrive_and_wait).
inline constexpr std::chrono::milliseconds kLingerAfterFailure{2000};

// Marks `barrier.rank` arrived (its "rank/R" key too, unless `marked`: the
// caller set it itself) and waits until every rank has, or one failed the
// barrier. The outcome is decided once: whichever of the last arrival and
// a failure (fail_barrier) comes first stands for every rank. Returns ""
// when all arrived, or the failing rank's reason. A rank that reads a
// failure first waits, up to kLingerAfterFailure beyond `timeout`, until
// every rank has read it, failed the barrier too or been counted out as
// dead, as fail_barrier does: whichever rank hosts the store takes it down
// as it exits, however it learnt of the failure. A
// wait that runs out as the last rank arrives returns "" too (where the store
// can still be asked then: one that resumes after a timeout, or a watched
// barrier), and one that runs out as a failure is posted throws TimeoutError.
// Logs a warning after each tenth of `timeout` (1 to 30 s) that it waits, rank
// 0 naming the missing ranks and the others counting them (where the store
// resumes after a timeout), and throws TimeoutError naming them at
// `timeout`.
std::string arrive_and_wait(const StoreBarrier& barrier,
                            std::chrono::milliseconds timeout,
                            bool marked = false);

// The outcome of `barrier` where it has completed, as arrive_and_wait
// returns it ("" when all arrived, or the failing rank's reason), without
// waiting and without counting this rank in or out; nullopt while it has
// not. One or two store requests.
std::optional<std::string> completed_outcome(const StoreBarrier& barrier);

// Ends `barrier` for every rank waiting at it or still to come, which
// returns `problem` from arrive_and_wait (an outcome already set stays), and
// then waits, up to `linger`, until every rank has left it (returned the
// failure from arrive_and_wait, or failed it too): a rank that hosts the
// store takes it down as it exits, and the others should have read why
// first. `dead_rank`, where the problem is that rank's death, will never
// leave, and is counted out on its behalf, once however many report it,
// and not where it had left by itself first, so that the others need not
// linger for it. A rank's own leaving counts each time: two processes
// that claim one rank both leave. Never throws for a store that is gone
// already.
void fail_barrier(const StoreBarrier& barrier, const std::string& problem,
                  std::chrono::milliseconds linger = kLingerAfterFailure,
                  int dead_rank = -1);

}  // namespace comm
