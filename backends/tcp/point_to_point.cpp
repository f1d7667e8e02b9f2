#include "backends/tcp/point_to_point.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

#include "backends/tcp/exchange.h"
#include "libcomm/detail/copy_bytes.h"
#include "libcomm/detail/log.h"
#include "libcomm/error.h"
#include "libcomm/options.h"

namespace comm::tcp {
namespace {

bool would_block(int error) {
  return error == EAGAIN || error == EWOULDBLOCK || error == EINTR;
}

// Whether a socket or ring error says that the peer's end is gone (it
// exited, or the network between cut it off), rather than a fault of this
// rank's own (a bad buffer, no memory), which says nothing of the peer.
bool peer_end_gone(int error) {
  return error == EPIPE || error == ECONNRESET || error == ENOTCONN ||
         error == ETIMEDOUT || error == EHOSTUNREACH || error == ENETUNREACH;
}

}  // namespace

PointToPoint::PointToPoint(Mesh& mesh, ControlChannel& control)
    : mesh_(mesh),
      control_(control),
      sends_(static_cast<std::size_t>(mesh.size())),
      incoming_(static_cast<std::size_t>(mesh.size())),
      broken_(static_cast<std::size_t>(mesh.size())),
      settling_(static_cast<std::size_t>(mesh.size()), 0) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw SystemError(errno, "eventfd");
  thread_ = std::thread([this] { loop(); });
}

PointToPoint::~PointToPoint() {
  stop(std::make_exception_ptr(BackendError(
      "the process group was destroyed with this operation pending")));
  close(wake_fd_);
}

void PointToPoint::wake() {
  const std::uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void PointToPoint::stop(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      for (int peer = 0; peer < mesh_.size(); ++peer) fail_peer(peer, error);
      for (auto& receive : receives_) complete(receive, error, -1);
      receives_.clear();
    }
  }
  wake();
  if (thread_.joinable()) thread_.join();
}

void PointToPoint::complete(const std::shared_ptr<Operation>& op,
                            std::exception_ptr error, int source) {
  if (!error && op->on_success) {
    try {
      op->on_success();
    } catch (...) {
      error = std::current_exception();
    }
  }
  op->work->finish(std::move(error), source);
}

void PointToPoint::post_send(std::shared_ptr<Work> work,
                             std::shared_ptr<void> keep_alive, int peer,
                             int tag, DType dtype, const void* data,
                             std::size_t bytes,
                             detail::Clock::time_point deadline) {
  auto op = std::make_shared<Operation>();
  op->work = std::move(work);
  op->keep_alive = std::move(keep_alive);
  op->peer = peer;
  op->tag = tag;
  op->dtype = dtype;
  op->data = static_cast<std::uint8_t*>(const_cast<void*>(data));
  op->bytes = bytes;
  op->deadline = deadline;
  std::lock_guard<std::mutex> lock(mutex_);
  MessageHeader header;
  header.call.collective = Collective::kSend;
  header.call.sequence = sent_++;
  header.call.dtype = dtype;
  header.call.count = static_cast<std::int64_t>(bytes / dtype_size(dtype));
  header.call.root = tag;
  header.payload_bytes = bytes;
  header.encode(op->header);
  if (stopping_ || broken_[peer]) {
    complete(op,
             stopping_ ? std::make_exception_ptr(
                             BackendError("the process group was shut down"))
                       : broken_[peer],
             -1);
    return;
  }
  sends_[peer].push_back(std::move(op));
  wake();
}

void PointToPoint::post_recv(std::shared_ptr<Work> work,
                             std::shared_ptr<void> keep_alive, int peer,
                             int tag, DType dtype, void* data,
                             std::size_t bytes,
                             detail::Clock::time_point deadline,
                             std::function<void()> on_success) {
  auto op = std::make_shared<Operation>();
  op->on_success = std::move(on_success);
  op->work = std::move(work);
  op->keep_alive = std::move(keep_alive);
  op->peer = peer;
  op->tag = tag;
  op->dtype = dtype;
  op->data = static_cast<std::uint8_t*>(data);
  op->bytes = bytes;
  op->deadline = deadline;
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) {
    complete(op,
             std::make_exception_ptr(
                 BackendError("the process group was shut down")),
             -1);
    return;
  }
  // A message kept before the peer failed is still delivered, as bytes a
  // socket received before its peer reset it are.
  if (try_match_kept(op)) return;
  if (peer != kAnySource && broken_[peer]) {
    complete(op, broken_[peer], -1);
    return;
  }
  receives_.push_back(std::move(op));
  wake();
}

// A message that matches but differs in size or dtype fails the receive
// with MismatchError; the message is consumed either way.
static std::exception_ptr check_fit(const MessageHeader& header, int peer,
                                    DType dtype, std::size_t bytes, int tag) {
  if (header.call.dtype != dtype || header.payload_bytes != bytes) {
    return std::make_exception_ptr(MismatchError(
        "recv with tag " + std::to_string(tag) + " expected " +
        dtype_name(dtype) + " x " + std::to_string(bytes / dtype_size(dtype)) +
        " but rank " + std::to_string(peer) + " sent " +
        header.call.describe()));
  }
  return nullptr;
}

bool PointToPoint::try_match_kept(const std::shared_ptr<Operation>& receive) {
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if ((receive->peer == kAnySource || receive->peer == it->peer) &&
        it->header.call.root == receive->tag) {
      auto misfit = check_fit(it->header, it->peer, receive->dtype,
                              receive->bytes, receive->tag);
      if (!misfit && receive->bytes > 0) {
        detail::copy_bytes(receive->data, it->payload.data(), receive->bytes);
      }
      complete(receive, misfit, it->peer);
      kept_.erase(it);
      return true;
    }
  }
  return false;
}

std::shared_ptr<PointToPoint::Operation> PointToPoint::take_receiver(
    int peer, const MessageHeader& header) {
  for (auto it = receives_.begin(); it != receives_.end(); ++it) {
    if (((*it)->peer == kAnySource || (*it)->peer == peer) &&
        (*it)->tag == header.call.root) {
      auto receiver = *it;
      receives_.erase(it);
      return receiver;
    }
  }
  return nullptr;
}

bool PointToPoint::wants_input(int peer) const {
  if (incoming_[peer].header_done > 0) return true;
  return std::any_of(receives_.begin(), receives_.end(), [&](const auto& op) {
    return op->peer == kAnySource || op->peer == peer;
  });
}

void PointToPoint::fail_peer(int peer, const std::exception_ptr& error) {
  if (peer == mesh_.rank()) return;
  if (!broken_[peer]) broken_[peer] = error;
  for (auto& op : sends_[peer]) complete(op, error, -1);
  sends_[peer].clear();
  for (auto it = receives_.begin(); it != receives_.end();) {
    if ((*it)->peer == peer) {
      complete(*it, error, -1);
      it = receives_.erase(it);
    } else {
      ++it;
    }
  }
  Incoming& in = incoming_[peer];
  if (in.receiver) complete(in.receiver, error, -1);
  in = Incoming{};
}

void PointToPoint::lose_peer(int peer, std::exception_ptr error) {
  if (settling_[peer]) return;  // settle_lost() fails its operations
  if (peer == mesh_.rank() || broken_[peer]) return fail_peer(peer, error);
  bool gone = false;
  try {
    std::rethrow_exception(error);
  } catch (const shm::PeerGone& e) {
    gone = e.peer_rank() == peer;
  } catch (...) {
  }
  // A peer that leaves while nothing names it (a receive from any rank
  // pending, say) may have ended as the program meant it to.
  const bool named =
      !sends_[peer].empty() || incoming_[peer].header_done > 0 ||
      std::any_of(receives_.begin(), receives_.end(),
                  [&](const auto& op) { return op->peer == peer; });
  if (!gone || !named) return fail_peer(peer, error);
  // Not polled from now on; operations posted meanwhile wait with the
  // others, to fail in settle_lost() with what it names.
  settling_[peer] = true;
  lost_.push_back({peer, std::move(error)});
}

std::optional<ControlMessage> PointToPoint::explain_loss(Lost& lost) {
  std::string text = "lost";
  int blamed = lost.peer;
  try {
    std::rethrow_exception(lost.error);
  } catch (const std::exception& e) {
    text = e.what();
  }
  const auto cause = control_.death_report(lost.peer);
  if (const auto left = control_.departure(lost.peer); left && !cause) {
    // It shut its group down: the program's doing, not a death to tell
    // the others of. What waits for it fails alone.
    lost.error = std::make_exception_ptr(PeerError(
        lost.peer,
        departure_error(mesh_.peer_name(lost.peer), *left,
                        "rank " + std::to_string(mesh_.rank()) +
                            " had a send to it or a receive from it pending",
                        "every send has its receive")));
    return std::nullopt;
  }
  // A peer that went after a rank was reported lost (by that peer, or by
  // any rank) left because of that loss: name the rank first lost.
  if (cause) {
    blamed = cause->message.blamed;
    text += "; " +
            (cause->from == lost.peer ? std::string("it")
                                      : "rank " + std::to_string(cause->from)) +
            " had reported: " + cause->message.text;
    lost.error = std::make_exception_ptr(PeerError(blamed, text));
  }
  ControlMessage news;
  news.kind = ControlKind::kAbort;
  news.error = ErrorKind::kPeer;
  news.blamed = blamed;
  // Sequence 0 comes before every collective: each fails on it.
  news.call = CallInfo{Collective::kSend, 0, DType::kU8, 0, ReduceOp::kSum, -1};
  news.text = "point-to-point traffic with " + mesh_.peer_name(lost.peer) +
              " failed on rank " + std::to_string(mesh_.rank()) + ": " + text;
  return news;
}

void PointToPoint::settle_lost() {
  // A lost peer's own report, if it made one before it went, arrives on
  // its control connection, which another thread reads: wait until that
  // connection has been read to its end too, or a moment (bounded).
  // A stop() cuts the wait short, but not below the floor: a peer
  // that shut down with this rank has its departure on the way.
  const auto floor = detail::deadline_after(ControlChannel::kLastWordsFloor);
  const auto until = detail::deadline_after(ControlChannel::kLastWordsWait);
  for (const Lost& lost : lost_) {
    while (!control_.peer_closed(lost.peer) && detail::Clock::now() < until) {
      if (detail::Clock::now() >= floor) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  for (Lost& lost : lost_) {
    if (auto news = explain_loss(lost)) {
      // Told before any operation fails on it, and even as the group
      // shuts down (the control channel outlives this thread), so that a
      // program that exits on the error has told the others first. Not
      // under mutex_: the broadcast may take a while to leave.
      COMM_LOG_INFO("{}", news->text);
      control_.record_own_report(*news);
      control_.broadcast(*news, std::chrono::milliseconds(200));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    settling_[lost.peer] = false;
    // Shut down meanwhile: stop() failed the operations already.
    if (stopping_) continue;
    broken_[lost.peer] = lost.error;
    fail_peer(lost.peer, lost.error);
  }
  lost_.clear();
}

void PointToPoint::progress_send(int peer) {
  const int fd = mesh_.socket(peer, Channel::kPointToPoint).fd();
  shm::Ring* ring = mesh_.ring(peer, Channel::kPointToPoint, true);
  while (!sends_[peer].empty()) {
    Operation& op = *sends_[peer].front();
    const int sent = ring != nullptr
                         ? send_message(*ring, op.header, op.header_done,
                                        op.data, op.bytes, op.payload_done)
                         : send_message(fd, op.header, op.header_done, op.data,
                                        op.bytes, op.payload_done);
    if (sent == 0) return;
    if (sent < 0) {
      const int error = errno;
      const std::string what =
          "sending to " + mesh_.peer_name(peer) +
          " failed: " + std::system_category().message(error);
      if (!peer_end_gone(error)) throw PeerError(peer, what);
      throw shm::PeerGone(peer, what + " (did it exit or crash?)");
    }
    complete(sends_[peer].front(), nullptr, -1);
    sends_[peer].pop_front();
  }
}

void PointToPoint::progress_recv(int peer) {
  detail::Socket& socket = mesh_.socket(peer, Channel::kPointToPoint);
  shm::Ring* ring = mesh_.ring(peer, Channel::kPointToPoint, false);
  Incoming& in = incoming_[peer];
  while (wants_input(peer)) {
    std::uint8_t* target = nullptr;
    std::size_t room = 0;
    if (in.header_done < MessageHeader::kWireSize) {
      target = in.header_bytes + in.header_done;
      room = MessageHeader::kWireSize - in.header_done;
    } else {
      std::uint8_t* base = in.receiver ? in.receiver->data : in.kept.data();
      target = base + in.payload_done;
      room = in.header.payload_bytes - in.payload_done;
    }
    if (room > 0) {
      const iovec where{target, room};
      const ssize_t n = ring != nullptr
                            ? read_some(*ring, &where, 1)
                            : recv(socket.fd(), target, room, MSG_DONTWAIT);
      if (n == 0) {
        throw shm::PeerGone(peer, mesh_.peer_name(peer) +
                                      " closed its connection (did it exit or "
                                      "crash?)");
      }
      if (n < 0) {
        const int error = errno;
        if (would_block(error)) return;
        const std::string what =
            "receiving from " + mesh_.peer_name(peer) +
            " failed: " + std::system_category().message(error);
        if (!peer_end_gone(error)) throw PeerError(peer, what);
        throw shm::PeerGone(peer, what);
      }
      if (in.header_done < MessageHeader::kWireSize) {
        in.header_done += static_cast<std::size_t>(n);
        if (in.header_done < MessageHeader::kWireSize) continue;
        if (!in.header.decode(in.header_bytes) ||
            in.header.call.collective != Collective::kSend) {
          throw PeerError(
              peer, mesh_.peer_name(peer) +
                        " sent bytes that are not a point-to-point message");
        }
        in.receiver = take_receiver(peer, in.header);
        // A receiver that does not fit gets an error; the bytes are still
        // read, into a buffer that is then dropped.
        if (in.receiver) {
          if (auto misfit = check_fit(in.header, peer, in.receiver->dtype,
                                      in.receiver->bytes, in.receiver->tag)) {
            complete(in.receiver, misfit, peer);
            in.receiver = nullptr;
            in.discard = true;
          }
        }
        if (!in.receiver) in.kept.resize(in.header.payload_bytes);
      } else {
        in.payload_done += static_cast<std::size_t>(n);
      }
    }
    if (in.header_done == MessageHeader::kWireSize &&
        in.payload_done == in.header.payload_bytes) {
      if (in.receiver) {
        complete(in.receiver, nullptr, peer);
      } else if (!in.discard) {
        kept_.push_back(Kept{peer, in.header, std::move(in.kept)});
        // A receive posted meanwhile for this message is already in
        // receives_; the kept message goes to it on the next match.
        for (auto it = receives_.begin(); it != receives_.end(); ++it) {
          if (try_match_kept(*it)) {
            receives_.erase(it);
            break;
          }
        }
      }
      in = Incoming{};
    }
  }
}

void PointToPoint::expire(detail::Clock::time_point now) {
  // `note` ends the message: for a receive, what it did not match.
  auto timeout = [&](const Operation& op, const std::string& note = {}) {
    return std::make_exception_ptr(
        TimeoutError(op.work->description() + " timed out waiting for " +
                     (op.peer == kAnySource ? std::string("any rank")
                                            : mesh_.peer_name(op.peer)) +
                     note));
  };
  for (int peer = 0; peer < mesh_.size(); ++peer) {
    auto& queue = sends_[peer];
    for (std::size_t i = 0; i < queue.size();) {
      if (queue[i]->deadline > now) {
        ++i;
        continue;
      }
      if (i == 0 && queue[0]->header_done > 0) {
        // Half sent: the channel can no longer be trusted.
        fail_peer(peer, timeout(*queue[0]));
        break;
      }
      complete(queue[i], timeout(*queue[i]), -1);
      queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(i));
    }
    Incoming& in = incoming_[peer];
    if (in.receiver && in.receiver->deadline <= now)
      fail_peer(peer, timeout(*in.receiver));
  }
  // The messages kept from the peers a receive takes from, which it did
  // not match: a tag that differs leaves them there.
  auto unmatched = [&](const Operation& op) {
    std::string list;
    int count = 0;
    for (const Kept& k : kept_) {
      if (op.peer != kAnySource && k.peer != op.peer) continue;
      if (++count <= 3) {
        list += (count > 1 ? ", " : "") + k.header.call.describe() +
                " from rank " + std::to_string(k.peer);
      }
    }
    if (count == 0) return std::string();
    return "; " + std::to_string(count) + " message" + (count == 1 ? "" : "s") +
           " arrived that it does not match: " + list +
           (count > 3 ? ", ..." : "") + " (a tag differs?)";
  };
  for (auto it = receives_.begin(); it != receives_.end();) {
    if ((*it)->deadline <= now) {
      complete(*it, timeout(**it, unmatched(**it)), -1);
      it = receives_.erase(it);
    } else {
      ++it;
    }
  }
}

void PointToPoint::loop() {
  std::vector<pollfd> fds;
  std::vector<int> peers;  // per pollfd: the peer, -1 (wake), -2 (doorbell)
  // Peers over rings with work this round, and which way they wait.
  struct RingWait {
    int peer;
    bool out, in;
  };
  std::vector<RingWait> ring_peers;
  std::vector<int> exit_peers;  // per pidfd polled: the peer
  // Runs until stop(); every round blocks in poll until a socket is ready,
  // a doorbell rings, a local peer exits, an operation is posted, or the
  // earliest deadline passes. Rings are progressed at the top of each
  // round, and waited on with their flags raised (shm/ring.h).
  while (true) {
    if (!lost_.empty()) settle_lost();
    detail::Clock::time_point earliest = detail::Clock::time_point::max();
    bool moved = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
      peers.assign(1, -1);
      ring_peers.clear();
      for (int peer = 0; peer < mesh_.size(); ++peer) {
        if (peer == mesh_.rank() || broken_[peer] || settling_[peer]) {
          continue;
        }
        short events = 0;
        if (!sends_[peer].empty()) {
          events |= POLLOUT;
          earliest = std::min(earliest, sends_[peer].front()->deadline);
          for (auto& op : sends_[peer])
            earliest = std::min(earliest, op->deadline);
        }
        if (wants_input(peer)) events |= POLLIN;
        if (incoming_[peer].receiver) {
          earliest = std::min(earliest, incoming_[peer].receiver->deadline);
        }
        if (events == 0) continue;
        if (mesh_.ring(peer, Channel::kPointToPoint, true) != nullptr) {
          moved = progress_ring(peer) || moved;
          if (!broken_[peer] && (!sends_[peer].empty() || wants_input(peer))) {
            ring_peers.push_back(
                {peer, !sends_[peer].empty(), wants_input(peer)});
          }
          continue;
        }
        fds.push_back(
            {mesh_.socket(peer, Channel::kPointToPoint).fd(), events, 0});
        peers.push_back(peer);
      }
      for (auto& op : receives_) earliest = std::min(earliest, op->deadline);
      if (!ring_peers.empty()) {
        fds.push_back({mesh_.local_peers().doorbell(1).fd(), POLLIN, 0});
        peers.push_back(-2);
        for (const RingWait& w : ring_peers) {
          fds.push_back({mesh_.local_peers().pidfd(w.peer), POLLIN, 0});
          peers.push_back(-3 - w.peer);
        }
      }
    }
    int wait_ms = -1;
    if (earliest != detail::Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          earliest - detail::Clock::now());
      wait_ms = static_cast<int>(
          std::clamp<std::int64_t>(left.count() + 1, 0, 1 << 30));
    }
    // Rings that moved are tried again at once; otherwise their waiting
    // flags go up before the sleep, one ordering for all of them, and a
    // ring that moved meanwhile means no sleep. Only this thread touches
    // this rank's point-to-point ends.
    if (moved) wait_ms = 0;
    if (!ring_peers.empty() && !shm::arm_all([&](auto&& visit) {
          for (const RingWait& w : ring_peers) {
            if (w.out) {
              visit(*mesh_.ring(w.peer, Channel::kPointToPoint, true), true);
            }
            if (w.in) {
              visit(*mesh_.ring(w.peer, Channel::kPointToPoint, false), false);
            }
          }
        })) {
      wait_ms = 0;
    }
    const int ready = poll(fds.data(), fds.size(), wait_ms);
    const int poll_error = errno;
    for (const RingWait& w : ring_peers) {
      if (w.out)
        mesh_.ring(w.peer, Channel::kPointToPoint, true)->disarm_writer();
      if (w.in)
        mesh_.ring(w.peer, Channel::kPointToPoint, false)->disarm_reader();
    }
    if (ready < 0 && poll_error != EINTR) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    if (fds[0].revents != 0) {
      std::uint64_t drained;
      (void)!read(wake_fd_, &drained, sizeof(drained));
    }
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const int peer = peers[k];
      if (peer == -2) {
        mesh_.local_peers().doorbell(1).drain();
        continue;
      }
      if (peer < -2) {
        ring_peer_exited(-3 - peer);
        continue;
      }
      try {
        if (!sends_[peer].empty()) progress_send(peer);
        if (wants_input(peer)) progress_recv(peer);
      } catch (...) {
        lose_peer(peer, std::current_exception());
      }
    }
    expire(detail::Clock::now());
  }
}

bool PointToPoint::progress_ring(int peer) {
  const shm::Ring* out = mesh_.ring(peer, Channel::kPointToPoint, true);
  const shm::Ring* in = mesh_.ring(peer, Channel::kPointToPoint, false);
  // Whether anything can move: a send with room, or bytes to read (or a
  // closed ring, which progress turns into the peer's error).
  const bool could =
      (!sends_[peer].empty() && (out->writable() || out->closed())) ||
      (wants_input(peer) && (in->readable() || in->closed()));
  if (!could) return false;
  try {
    if (!sends_[peer].empty()) progress_send(peer);
    if (wants_input(peer)) progress_recv(peer);
  } catch (...) {
    lose_peer(peer, std::current_exception());
  }
  return true;
}

void PointToPoint::ring_peer_exited(int peer) {
  if (broken_[peer] || settling_[peer]) return;
  // What the peer wrote before it ended is still in the ring, and goes to
  // the receives that want it. What is still pending then never moves: a
  // send waits for room that nobody makes, a receive for bytes that never
  // come. They fail now, as a send over TCP fails on a connection reset,
  // whatever else the ring still holds; left pending, they would keep the
  // pidfd in the poll and this thread spinning on it until their timeout.
  progress_ring(peer);
  if (broken_[peer] || (sends_[peer].empty() && !wants_input(peer))) return;
  lose_peer(peer, std::make_exception_ptr(shm::PeerGone(
                      peer, mesh_.peer_name(peer) +
                                " exited (killed, or crashed?)")));
}

}  // namespace comm::tcp
