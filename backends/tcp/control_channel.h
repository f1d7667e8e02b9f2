// comm::tcp::ControlChannel: the TCP backend's control connections
// (Channel::kControl), owned by a thread of their own that keeps running
// while the rank computes.
//
// The thread reads every control message as it arrives and sends a
// heartbeat to every peer each heartbeat_interval() (a fifth of
// COMM_HEARTBEAT_TIMEOUT), whatever the rank is doing. So a peer that is
// alive but slow to reach a collective keeps beating and is waited for up
// to the operation's timeout, while a peer whose control connection stays
// silent for COMM_HEARTBEAT_TIMEOUT (a process stopped by SIGSTOP or a
// debugger, a host that hangs, a network cut) is declared silent: every
// collective running or started afterwards fails with a PeerError naming
// it. A peer that closes its control connection (it exited, or destroyed
// its group) is not an error by itself: whether that matters shows on the
// collective connections of a call that needs it.
//
// It also records the peers' failure reports (aborts) and answers their
// queries ("which call is your collective number S?") from the calls this
// rank has started (begin_call), and records their answers to this rank's
// queries. A step that waits watches alarm_fd(), which becomes readable
// when something was recorded or a peer's control connection closed, and
// then asks check() whether it fails the step's call. Between those, a
// collective costs one uncontended lock (begin_call) and one atomic load
// (check() when nothing was recorded).
//
// Writes to a peer are queued and sent without blocking, by whichever
// thread queues them or, when the socket is full, by the control thread,
// so that messages never interleave and a peer that does not read never
// blocks anyone.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/tcp/control_message.h"
#include "backends/tcp/mesh.h"
#include "libcomm/detail/socket.h"

namespace comm::tcp {

// COMM_HEARTBEAT_TIMEOUT: how long a peer's control connection may stay
// silent before the peer is declared frozen, dead or cut off.
std::chrono::milliseconds heartbeat_timeout();
// How often every rank sends a heartbeat: a fifth of the timeout, so that
// a peer is declared silent only after it missed four beats in a row, and
// a beat delayed by a loaded scheduler is no false alarm.
std::chrono::milliseconds heartbeat_interval();

class ControlChannel {
 public:
  // A peer's failure report, as it arrived.
  struct Report {
    int from = -1;
    ControlMessage message;
  };

  // Takes over the control sockets of `mesh` (nobody else may touch them
  // from now on) and starts the control thread.
  ControlChannel(Mesh& mesh, std::chrono::milliseconds timeout,
                 std::chrono::milliseconds interval);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Stops the control thread; queued messages that have not left are
  // dropped. Call before the mesh's sockets are shut down.
  void stop();

  // Queues `message` to every peer and waits up to `budget` for it to
  // leave this rank (best effort: a peer whose socket does not take it in
  // time misses it).
  void broadcast(const ControlMessage& message,
                 std::chrono::milliseconds budget);
  // Asks `peer` which call is its collective number `call.sequence`; its
  // answer is recorded and wakes alarm_fd().
  void query(int peer, const CallInfo& call);

  // Records that this rank starts `call` (collectives start in sequence
  // order), so that queries about it are answered, then does check(call).
  // Returns a peer's failure report that fails `call`, as check() does.
  std::optional<Report> begin_call(const CallInfo& call);

  // Readable when something was recorded since the last check(): a peer's
  // failure report, a peer found silent, an answer to a query.
  int alarm_fd() const { return alarm_fd_; }

  // What the channel knows that fails `call`: returns the first failure
  // report of a peer for `call` or an earlier collective (the caller raises
  // it as a Reported<E>); throws PeerError when a peer was found silent and
  // MismatchError when a peer answered that its collective of the same
  // number is another call. Reports of later collectives (a peer that went
  // ahead and failed there) do not fail `call`. Clears the alarm.
  std::optional<Report> check(const CallInfo& call) {
    // Inline, as every call asks at least twice and nothing is recorded
    // almost always.
    if (events_.load(std::memory_order_acquire) == 0) return std::nullopt;
    return check_recorded(call);
  }

  // Whether `peer`'s control connection has been read to its end (the
  // peer closed it: it exited or destroyed its group), or reading it
  // failed, and a poll round of the control thread has read every other
  // connection that was ready with it. By then every message the peer sent
  // before, and those of other peers that arrived before its end, a
  // failure report among them, are recorded. Becoming true wakes
  // alarm_fd(). A failed send to the peer stops sending, not reading.
  bool peer_closed(int peer);
  // How long a step that lost `peer`'s data connection waits for
  // peer_closed(peer), so that a report or departure the peer sent before
  // it went is read: at most kLastWordsWait, after which the loss is
  // named as the peer's own; and at least kLastWordsFloor even while the
  // group shuts down, as a peer that shut down with this rank has its
  // departure on the way.
  static constexpr std::chrono::milliseconds kLastWordsFloor{50};
  static constexpr std::chrono::milliseconds kLastWordsWait{500};

  // Records `message` (a kAbort) as a failure report of this rank's own,
  // so that this rank's collectives fail on it as the others' do: for a
  // failure found outside any collective (a point-to-point peer lost).
  void record_own_report(ControlMessage message);
  // The first report of a lost rank (kPeer, blaming a rank of the group
  // other than `peer` and this one) that `peer` sent, or else the first
  // any rank sent, this one included; nothing where none has been
  // recorded. A report that blames `peer` itself (another rank's of the
  // same loss) says nothing of why it went. Unlike check(), it leaves the
  // alarm as it is, for the steps that wait on it.
  std::optional<Report> death_report(int peer);

  // Tells every peer that this rank shuts its group down (kLeaving), after
  // the collectives it started and with `abandoned` more that it issued
  // but never ran, and waits up to `budget` for the news to leave this
  // rank. Best effort, as broadcast(). For a group that did not fail: a
  // failed one's peers have had its report.
  void announce_leaving(std::size_t abandoned,
                        std::chrono::milliseconds budget);
  // What `peer` said as it shut its group down ("after 3 collectives, the
  // last all_reduce #2 (...)"), where it did and that has been read: call
  // after peer_closed(), which makes sure it has. Raises no alarm: a peer
  // that leaves fails only what waits for it.
  std::optional<std::string> departure(int peer);

  // Whether `peer`'s last answer said it had not started collective
  // `sequence` yet.
  bool answered_not_reached(int peer, std::uint64_t sequence);

  // Every failure report received for collective `sequence`.
  std::vector<Report> reports_for(std::uint64_t sequence);

  std::chrono::milliseconds timeout() const { return timeout_; }

  // How many started calls are remembered to answer queries: more than a
  // rank reads confirmations late (Exchange::kConfirmationWindow and its
  // batch), so that a query about the oldest call it reads them for finds
  // that call on a peer that went on.
  static constexpr std::size_t kHistory = 1024;

 private:
  struct Peer {
    bool open = false;
    bool sending = true;   // false once a send failed; reading goes on
    bool closing = false;  // closed, not yet settled (settle_closed)
    bool gone = false;     // closed and settled (peer_closed)
    detail::Clock::time_point last_heard;
    std::vector<std::uint8_t> input;  // bytes of a message not yet whole
    std::deque<std::vector<std::uint8_t>> outbox;
    std::size_t sent = 0;  // bytes of outbox.front() already sent
    std::optional<ControlMessage> answer;
    std::optional<std::string> departure;  // its kLeaving's text
  };

  void run();
  // check() once something was recorded.
  std::optional<Report> check_recorded(const CallInfo& call);
  // All need mutex_.
  void queue(int peer, std::vector<std::uint8_t> bytes);
  void flush(int peer);
  void close_peer(int peer, const char* why);
  // After a poll round of the control thread: marks `peers`, which closed
  // before that poll, as gone, and raises the alarm.
  void settle_closed(const std::vector<int>& peers);
  void record_event();
  void dispatch(int peer, ControlMessage message);
  ControlMessage answer_for(const CallInfo& asked) const;
  // Reads what `peer` sent, outside the lock; dispatches whole messages.
  void read_from(int peer);

  Mesh& mesh_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds interval_;
  int alarm_fd_ = -1;
  int wake_fd_ = -1;  // wakes the control thread: stop, or a queue to send
  std::thread thread_;
  // Nonzero once anything that may fail a call was recorded, or a peer's
  // control connection closed.
  std::atomic<std::uint64_t> events_{0};

  std::mutex mutex_;
  std::condition_variable flushed_;
  bool stopping_ = false;
  std::vector<Peer> peers_;
  std::vector<Report> reports_;
  int silent_peer_ = -1;
  std::chrono::milliseconds silent_for_{0};
  // The calls started, by sequence number modulo kHistory.
  std::array<CallInfo, kHistory> history_{};
  std::uint64_t started_ = 0;  // the number of collectives started
};

// Whether the caller of the call that failed learns of it from the
// exception (kToCaller), or only from the log (kLogOnly: a failure found
// as the group shuts down, when no call is left to fail).
enum class FailureSeen { kToCaller, kLogOnly };

// Called in a catch block, for this rank's own failure of `call` (not a
// ReportedFailure): logs it (as an error where the log is the only place
// it shows, else at info, the exception carrying the same text) and tells
// the other ranks why, so that they fail now rather than at their
// timeouts. Best effort: a dead peer just misses it.
void report_failure(ControlChannel& control, const CallInfo& call, int rank,
                    FailureSeen seen = FailureSeen::kToCaller);

// The error text for `peer_name`, which left saying `departure`
// (ControlChannel::departure) while `waiting` ("rank 0 waited for it in
// all_reduce #3 (...)"): it names no cause, which the leaving rank's own
// output holds, but what to check, `check` ("every rank issues the same
// collectives in the same order").
std::string departure_error(const std::string& peer_name,
                            const std::string& departure,
                            const std::string& waiting,
                            const std::string& check);

// Throws a peer's failure report as the error of `call`, a Reported<E>.
[[noreturn]] void raise_report(const CallInfo& call,
                               const ControlChannel::Report& report);

}  // namespace comm::tcp
