#include "backends/tcp/control_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <system_error>

#include "backends/tcp/reported_failure.h"
#include "libcomm/detail/log.h"
#include "libcomm/error.h"
#include "libcomm/int_param.h"

namespace comm::tcp {
namespace {

const IntParam kHeartbeatTimeout{
    "COMM_HEARTBEAT_TIMEOUT", 15, 1, 86400,
    "seconds a TCP peer may stay silent before it is declared frozen, dead "
    "or cut off"};

// The most a peer's queue of unsent control messages may hold; beyond, new
// ones are dropped (the peer has not read for a long time, and will be
// found silent or closed).
constexpr std::size_t kMaxQueued = 256;

int ms_until(detail::Clock::time_point when) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      when - detail::Clock::now());
  // Round up, so that poll does not return a millisecond early forever.
  return static_cast<int>(
      std::clamp<std::int64_t>(left.count() + 1, 0, 1 << 30));
}

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s",
                static_cast<double>(duration.count()) / 1000.0);
  return text;
}

}  // namespace

std::chrono::milliseconds heartbeat_timeout() {
  return std::chrono::seconds(kHeartbeatTimeout.get());
}

std::chrono::milliseconds heartbeat_interval() {
  return heartbeat_timeout() / 5;
}

ControlChannel::ControlChannel(Mesh& mesh, std::chrono::milliseconds timeout,
                               std::chrono::milliseconds interval)
    : mesh_(mesh),
      timeout_(timeout),
      interval_(interval),
      peers_(static_cast<std::size_t>(mesh.size())) {
  alarm_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (alarm_fd_ < 0 || wake_fd_ < 0) {
    const int error = errno;
    if (alarm_fd_ >= 0) close(alarm_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    throw SystemError(error, "eventfd");
  }
  const auto now = detail::Clock::now();
  for (int peer = 0; peer < mesh.size(); ++peer) {
    if (peer == mesh.rank()) continue;
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    p.open = mesh.socket(peer, Channel::kControl).valid();
    p.last_heard = now;
  }
  thread_ = std::thread([this] { run(); });
}

ControlChannel::~ControlChannel() {
  stop();
  close(alarm_fd_);
  close(wake_fd_);
}

void ControlChannel::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    flushed_.notify_all();
  }
  const std::uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void ControlChannel::queue(int peer, std::vector<std::uint8_t> bytes) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (!p.open || !p.sending || stopping_ || p.outbox.size() >= kMaxQueued) {
    return;
  }
  p.outbox.push_back(std::move(bytes));
  flush(peer);
  if (!p.outbox.empty()) {
    // The control thread sends the rest once the socket takes it.
    const std::uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

void ControlChannel::flush(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  const int fd = mesh_.socket(peer, Channel::kControl).fd();
  // Bounded: every round sends bytes or returns.
  while (p.open && p.sending && !p.outbox.empty()) {
    const std::vector<std::uint8_t>& front = p.outbox.front();
    const ssize_t n = ::send(fd, front.data() + p.sent, front.size() - p.sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // What the peer sent before it went is still read: its failure
      // report may be there (peer_closed).
      COMM_LOG_DEBUG(
          "TCP backend: sending to {} on its control connection "
          "failed: {}",
          mesh_.peer_name(peer), std::system_category().message(errno));
      p.sending = false;
      p.outbox.clear();
      p.sent = 0;
      break;
    }
    p.sent += static_cast<std::size_t>(n);
    if (p.sent == front.size()) {
      p.outbox.pop_front();
      p.sent = 0;
    }
  }
  flushed_.notify_all();
}

void ControlChannel::close_peer(int peer, const char* why) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  if (!p.open) return;
  COMM_LOG_DEBUG("TCP backend: {}'s control connection closed ({})",
                 mesh_.peer_name(peer), why);
  // The descriptor stays open until the mesh closes it, so that no thread
  // ever uses a number the system gave to another file meanwhile; it is
  // just no longer read or written.
  p.open = false;
  p.outbox.clear();
  p.sent = 0;
  flushed_.notify_all();
  // Settled after the control thread's next poll round (run).
  p.closing = true;
}

void ControlChannel::settle_closed(const std::vector<int>& peers) {
  if (peers.empty()) return;
  for (int peer : peers) peers_[static_cast<std::size_t>(peer)].gone = true;
  record_event();
}

bool ControlChannel::peer_closed(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  return peers_[static_cast<std::size_t>(peer)].gone;
}

void ControlChannel::record_own_report(ControlMessage message) {
  std::lock_guard<std::mutex> lock(mutex_);
  reports_.push_back({mesh_.rank(), std::move(message)});
  record_event();
}

std::optional<ControlChannel::Report> ControlChannel::death_report(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<Report> first;
  for (const Report& report : reports_) {
    const int blamed = report.message.blamed;
    if (report.message.error != ErrorKind::kPeer || blamed < 0 ||
        blamed >= mesh_.size() || blamed == peer || blamed == mesh_.rank()) {
      continue;
    }
    if (report.from == peer) return report;
    if (!first) first = report;
  }
  return first;
}

void ControlChannel::announce_leaving(std::size_t abandoned,
                                      std::chrono::milliseconds budget) {
  ControlMessage message;
  message.kind = ControlKind::kLeaving;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (started_ == 0) {
      message.text = "before any collective";
    } else {
      message.call = history_[(started_ - 1) % kHistory];
      message.text = "after " + std::to_string(started_) + " collective" +
                     (started_ == 1 ? "" : "s") + ", the last " +
                     message.call.describe();
    }
  }
  if (abandoned > 0) {
    message.text += ", dropping " + std::to_string(abandoned) +
                    " more it had issued but not run";
  }
  broadcast(message, budget);
}

std::optional<std::string> ControlChannel::departure(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  return peers_[static_cast<std::size_t>(peer)].departure;
}

void ControlChannel::record_event() {
  events_.fetch_add(1, std::memory_order_release);
  const std::uint64_t one = 1;
  (void)!write(alarm_fd_, &one, sizeof(one));
}

void ControlChannel::broadcast(const ControlMessage& message,
                               std::chrono::milliseconds budget) {
  const std::vector<std::uint8_t> bytes = message.encode();
  std::unique_lock<std::mutex> lock(mutex_);
  for (int peer = 0; peer < mesh_.size(); ++peer) {
    if (peer != mesh_.rank()) queue(peer, bytes);
  }
  flushed_.wait_for(lock, budget, [&] {
    return stopping_ ||
           std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) {
             return !p.open || p.outbox.empty();
           });
  });
}

void ControlChannel::query(int peer, const CallInfo& call) {
  ControlMessage message;
  message.kind = ControlKind::kQuery;
  message.call = call;
  std::lock_guard<std::mutex> lock(mutex_);
  queue(peer, message.encode());
}

std::optional<ControlChannel::Report> ControlChannel::begin_call(
    const CallInfo& call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    history_[call.sequence % kHistory] = call;
    started_ = std::max(started_, call.sequence + 1);
  }
  return check(call);
}

std::optional<ControlChannel::Report> ControlChannel::check_recorded(
    const CallInfo& call) {
  std::uint64_t drained;
  (void)!read(alarm_fd_, &drained, sizeof(drained));
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Report& report : reports_) {
    if (report.message.call.sequence <= call.sequence) return report;
  }
  if (silent_peer_ >= 0) {
    throw PeerError(
        silent_peer_,
        call.describe() + " failed on rank " + std::to_string(mesh_.rank()) +
            ": " + mesh_.peer_name(silent_peer_) +
            " sent nothing on its control connection for " +
            seconds_text(silent_for_) + ", though every live rank sends a " +
            "heartbeat every " + seconds_text(interval_) +
            ": it is stopped (SIGSTOP, a debugger), hung, or cut off from "
            "this rank by the network. COMM_HEARTBEAT_TIMEOUT (now " +
            seconds_text(timeout_) +
            ") sets how long a silent peer is waited "
            "for");
  }
  for (int peer = 0; peer < mesh_.size(); ++peer) {
    const auto& answer = peers_[static_cast<std::size_t>(peer)].answer;
    if (answer && answer->state == CallState::kStarted &&
        answer->call.sequence == call.sequence && !(answer->call == call)) {
      throw MismatchError(
          "rank " + std::to_string(mesh_.rank()) + " called " +
          call.describe() + " but rank " + std::to_string(peer) + " called " +
          answer->call.describe() +
          " (found by asking it, as no message of it had come); every rank "
          "must issue the same collectives in the same order with the same "
          "dtype, count, op and root");
    }
  }
  return std::nullopt;
}

std::vector<ControlChannel::Report> ControlChannel::reports_for(
    std::uint64_t sequence) {
  std::uint64_t drained;
  (void)!read(alarm_fd_, &drained, sizeof(drained));
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Report> found;
  for (const Report& report : reports_) {
    if (report.message.call.sequence == sequence) found.push_back(report);
  }
  return found;
}

bool ControlChannel::answered_not_reached(int peer, std::uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto& answer = peers_[static_cast<std::size_t>(peer)].answer;
  return answer && answer->state == CallState::kNotReached &&
         answer->call.sequence == sequence;
}

ControlMessage ControlChannel::answer_for(const CallInfo& asked) const {
  ControlMessage answer;
  answer.kind = ControlKind::kAnswer;
  answer.call.sequence = asked.sequence;
  if (asked.sequence >= started_) {
    answer.state = CallState::kNotReached;
  } else if (started_ - asked.sequence > kHistory) {
    answer.state = CallState::kForgotten;
  } else {
    answer.state = CallState::kStarted;
    answer.call = history_[asked.sequence % kHistory];
  }
  return answer;
}

void ControlChannel::dispatch(int peer, ControlMessage message) {
  switch (message.kind) {
    case ControlKind::kHeartbeat: return;
    case ControlKind::kAbort:
      reports_.push_back({peer, std::move(message)});
      record_event();
      return;
    case ControlKind::kQuery:
      queue(peer, answer_for(message.call).encode());
      return;
    case ControlKind::kAnswer:
      peers_[static_cast<std::size_t>(peer)].answer = std::move(message);
      record_event();
      return;
    case ControlKind::kLeaving:
      peers_[static_cast<std::size_t>(peer)].departure =
          std::move(message.text);
      return;
  }
}

void ControlChannel::read_from(int peer) {
  Peer& p = peers_[static_cast<std::size_t>(peer)];
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!p.open) return;
  }
  const int fd = mesh_.socket(peer, Channel::kControl).fd();
  std::uint8_t buffer[16384];
  // Bounded: at most a few reads per wake-up, so that a flood from one
  // peer does not starve the heartbeats.
  for (int round = 0; round < 16; ++round) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      close_peer(peer, n == 0 ? "closed by the peer" : "receiving failed");
      return;
    }
    p.last_heard = detail::Clock::now();
    p.input.insert(p.input.end(), buffer, buffer + n);
    std::size_t at = 0;
    std::lock_guard<std::mutex> lock(mutex_);
    while (p.input.size() - at >= ControlMessage::kPrefixSize) {
      const std::optional<std::size_t> body =
          ControlMessage::body_size(p.input.data() + at);
      std::optional<ControlMessage> message;
      if (body && p.input.size() - at < ControlMessage::kPrefixSize + *body) {
        break;  // the rest has not arrived yet
      }
      if (body) {
        message = ControlMessage::decode(p.input.data() + at,
                                         ControlMessage::kPrefixSize + *body);
      }
      if (!message) {
        // Not the control protocol: nothing more on this channel can be
        // trusted.
        COMM_LOG_WARN(
            "TCP backend: {} sent a malformed control message; ignoring "
            "its control connection from now on",
            mesh_.peer_name(peer));
        close_peer(peer, "malformed message");
        p.input.clear();
        return;
      }
      at += ControlMessage::kPrefixSize + *body;
      dispatch(peer, std::move(*message));
    }
    p.input.erase(p.input.begin(),
                  p.input.begin() + static_cast<std::ptrdiff_t>(at));
  }
}

void ControlChannel::run() {
  auto next_beat = detail::Clock::now();
  const std::vector<std::uint8_t> beat = [] {
    ControlMessage message;
    message.kind = ControlKind::kHeartbeat;
    return message.encode();
  }();
  std::vector<pollfd> fds;
  std::vector<int> owners;
  std::vector<int> settling;
  // Runs until stop(); each round sleeps in poll until a message arrives, a
  // queue can move, the next beat is due or a peer's silence runs out.
  while (true) {
    fds.clear();
    owners.clear();
    auto wake_at = detail::Clock::time_point::max();
    std::vector<int> overdue;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      const auto now = detail::Clock::now();
      if (now >= next_beat) {
        for (int peer = 0; peer < mesh_.size(); ++peer) {
          // A beat behind unsent messages would add nothing.
          if (peer != mesh_.rank() &&
              peers_[static_cast<std::size_t>(peer)].outbox.empty()) {
            queue(peer, beat);
          }
        }
        next_beat = now + interval_;
      }
      wake_at = next_beat;
      for (int peer = 0; peer < mesh_.size(); ++peer) {
        Peer& p = peers_[static_cast<std::size_t>(peer)];
        if (peer == mesh_.rank() || !p.open) continue;
        if (silent_peer_ < 0) {
          if (now - p.last_heard >= timeout_) {
            overdue.push_back(peer);
          } else {
            wake_at = std::min(wake_at, p.last_heard + timeout_);
          }
        }
        fds.push_back(
            {mesh_.socket(peer, Channel::kControl).fd(),
             static_cast<short>(POLLIN | (p.outbox.empty() ? 0 : POLLOUT)), 0});
        owners.push_back(peer);
      }
    }
    // A peer looks silent: read what it sent first. When this process was
    // the one stopped (or the whole job was, and goes on), the peer's beats
    // are waiting in the socket, and it is not silent.
    for (int peer : overdue) read_from(peer);
    if (!overdue.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto now = detail::Clock::now();
      for (int peer : overdue) {
        const Peer& p = peers_[static_cast<std::size_t>(peer)];
        const auto silent = now - p.last_heard;
        if (silent_peer_ >= 0 || !p.open || silent < timeout_) continue;
        silent_peer_ = peer;
        silent_for_ =
            std::chrono::duration_cast<std::chrono::milliseconds>(silent);
        COMM_LOG_ERROR(
            "TCP backend: {} has sent nothing for {} (heartbeat timeout "
            "COMM_HEARTBEAT_TIMEOUT={} s)",
            mesh_.peer_name(peer), seconds_text(silent_for_),
            timeout_.count() / 1000);
        record_event();
      }
      continue;  // the next round computes when to wake
    }
    // The peers whose connection closed before this poll are settled after
    // it, once every socket that was ready with them is read (peer_closed);
    // the poll then does not sleep.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      settling.clear();
      for (int peer = 0; peer < mesh_.size(); ++peer) {
        Peer& p = peers_[static_cast<std::size_t>(peer)];
        if (p.closing) {
          p.closing = false;
          settling.push_back(peer);
        }
      }
    }
    fds.push_back({wake_fd_, POLLIN, 0});
    owners.push_back(-1);
    const int ready = ::poll(fds.data(), fds.size(),
                             settling.empty() ? ms_until(wake_at) : 0);
    if (ready < 0 && errno != EINTR) {
      COMM_LOG_ERROR("TCP backend: the control thread's poll failed: {}",
                     std::system_category().message(errno));
      return;
    }
    for (std::size_t k = 0; ready > 0 && k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      if (owners[k] < 0) {
        std::uint64_t drained;
        (void)!read(wake_fd_, &drained, sizeof(drained));
        continue;
      }
      if (fds[k].revents & POLLOUT) {
        std::lock_guard<std::mutex> lock(mutex_);
        flush(owners[k]);
      }
      if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) read_from(owners[k]);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    settle_closed(settling);
  }
}

void report_failure(ControlChannel& control, const CallInfo& call, int rank,
                    FailureSeen seen) {
  ControlMessage abort;
  abort.call = call;
  abort.blamed = rank;
  abort.text = "unknown error";
  try {
    throw;
  } catch (const PeerError& e) {
    abort.error = e.kind();
    abort.blamed = e.peer_rank();
    abort.text = e.what();
  } catch (const Error& e) {
    abort.error = e.kind();
    abort.text = e.what();
  } catch (const std::exception& e) {
    abort.text = e.what();
  } catch (...) {
  }
  if (seen == FailureSeen::kLogOnly) {
    COMM_LOG_ERROR("{} failed: {}", call.describe(), abort.text);
  } else {
    COMM_LOG_INFO("{} failed: {}", call.describe(), abort.text);
  }
  control.broadcast(abort, std::chrono::milliseconds(200));
}

std::string departure_error(const std::string& peer_name,
                            const std::string& departure,
                            const std::string& waiting,
                            const std::string& check) {
  return peer_name + " shut its process group down (" + departure + ") while " +
         waiting +
         ": its program ended (returned, or raised an error) or destroyed its "
         "group before the others were done with it; see its output, and "
         "check that " +
         check;
}

void raise_report(const CallInfo& call, const ControlChannel::Report& report) {
  const std::string text = call.describe() + " failed: rank " +
                           std::to_string(report.from) +
                           " reported: " + report.message.text;
  switch (report.message.error) {
    case ErrorKind::kPeer:
      throw Reported<PeerError>(report.message.blamed, text);
    case ErrorKind::kMismatch: throw Reported<MismatchError>(text);
    case ErrorKind::kTimeout: throw Reported<TimeoutError>(text);
    default: throw Reported<BackendError>(text);
  }
}

}  // namespace comm::tcp
