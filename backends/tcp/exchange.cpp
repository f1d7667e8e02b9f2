#include "backends/tcp/exchange.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory_resource>
#include <optional>
#include <system_error>

#include "backends/tcp/reported_failure.h"
#include "libcomm/detail/pause_core.h"
#include "libcomm/int_param.h"
#include "libcomm/reduce_kernels.h"

namespace comm::tcp {
namespace {

const IntParam kChunkBytes{
    "COMM_TCP_CHUNK_BYTES", 256 << 10, 64, 1 << 30,
    "bytes a ring step receives and reduces at a time (rounded down to 64)"};
const IntParam kSpinUs{
    "COMM_TCP_SPIN_US", 50, 0, 10000,
    "microseconds a waiting TCP step polls its sockets before it sleeps"};

const IntParam kShmSpinUs{
    "COMM_SHM_SPIN_US", 1000, 0, 100000,
    "microseconds a step waiting only on shared-memory rings without fences "
    "(COMM_SHM_MEMBARRIER) watches them before it sleeps"};

bool would_block(int error) {
  return error == EAGAIN || error == EWOULDBLOCK || error == EINTR;
}

int remaining_ms(detail::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - detail::Clock::now());
  // Round up, so that poll does not return a millisecond early forever.
  return static_cast<int>(
      std::clamp<std::int64_t>(left.count() + 1, 0, 1 << 30));
}

// One pause of a spinning step between two looks at its transfers: a yield
// of the CPU where the host is oversubscribed (shm::LocalPeers::
// oversubscribed: the rank waited for may be the one that would run), else
// a few pauses of the core.
void relax(bool oversubscribed) {
  if (oversubscribed) {
    sched_yield();
    return;
  }
  for (int i = 0; i < 16; ++i) detail::pause_core();
}

}  // namespace

std::size_t chunk_bytes() {
  return static_cast<std::size_t>(kChunkBytes.get()) / 64 * 64;
}

std::chrono::microseconds spin_budget() {
  return std::chrono::microseconds(kSpinUs.get());
}

namespace {

// Lays out the unsent rest of the header, then up to kMaxPayloadRegions
// payload regions, in `parts`; returns how many it used.
int gather_header_and_payload(iovec* parts, const std::uint8_t* header,
                              std::size_t header_done, const iovec* payload,
                              int count) {
  int used = 0;
  if (header_done < MessageHeader::kWireSize) {
    parts[used++] = {const_cast<std::uint8_t*>(header) + header_done,
                     MessageHeader::kWireSize - header_done};
  }
  for (int i = 0; i < count && i < kMaxPayloadRegions; ++i) {
    parts[used++] = payload[i];
  }
  return used;
}

// Counts `moved` bytes against the header first; returns the payload's
// share.
long payload_share(std::size_t moved, std::size_t& header_done) {
  const std::size_t to_header =
      std::min(moved, MessageHeader::kWireSize - header_done);
  header_done += to_header;
  return static_cast<long>(moved - to_header);
}

// send_message over either channel: send_some until the message is out or
// the channel is full.
template <typename Channel>
int send_whole_message(Channel& channel, const std::uint8_t* header,
                       std::size_t& header_done, const std::uint8_t* data,
                       std::size_t bytes, std::size_t& payload_done) {
  // Bounded: every round moves bytes or returns.
  while (header_done < MessageHeader::kWireSize || payload_done < bytes) {
    const iovec rest{const_cast<std::uint8_t*>(data) + payload_done,
                     bytes - payload_done};
    const long sent = send_some(channel, header, header_done, &rest,
                                payload_done < bytes ? 1 : 0);
    if (sent < 0) {
      return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    payload_done += static_cast<std::size_t>(sent);
  }
  return 1;
}

}  // namespace

long send_some(int fd, const std::uint8_t* header, std::size_t& header_done,
               const iovec* payload, int count) {
  iovec parts[1 + kMaxPayloadRegions];
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = static_cast<std::size_t>(
      gather_header_and_payload(parts, header, header_done, payload, count));
  ssize_t n;
  do {
    n = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  return payload_share(static_cast<std::size_t>(n), header_done);
}

int send_message(int fd, const std::uint8_t* header, std::size_t& header_done,
                 const std::uint8_t* data, std::size_t bytes,
                 std::size_t& payload_done) {
  return send_whole_message(fd, header, header_done, data, bytes, payload_done);
}

long send_some(shm::Ring& ring, const std::uint8_t* header,
               std::size_t& header_done, const iovec* payload, int count,
               std::size_t publish_every) {
  if (ring.closed()) {
    errno = EPIPE;
    return -1;
  }
  iovec parts[1 + kMaxPayloadRegions];
  const std::size_t moved = ring.write(
      parts,
      gather_header_and_payload(parts, header, header_done, payload, count),
      publish_every);
  if (moved == 0) {
    errno = EAGAIN;
    return -1;
  }
  return payload_share(moved, header_done);
}

int send_message(shm::Ring& ring, const std::uint8_t* header,
                 std::size_t& header_done, const std::uint8_t* data,
                 std::size_t bytes, std::size_t& payload_done) {
  return send_whole_message(ring, header, header_done, data, bytes,
                            payload_done);
}

long read_some(shm::Ring& ring, const iovec* parts, int count) {
  const std::size_t moved = ring.read(parts, count);
  if (moved > 0) return static_cast<long>(moved);
  // Closed, but only once every byte written before is read: a peer that
  // sent its last message and went away is read to the end first.
  if (ring.closed() && !ring.readable()) return 0;
  errno = EAGAIN;
  return -1;
}

Exchange::Exchange(Mesh& mesh, const CallInfo& call,
                   detail::Clock::time_point deadline, int wake_fd,
                   ControlChannel* control, Workspace* workspace)
    : mesh_(mesh),
      call_(call),
      deadline_(deadline),
      wake_fd_(wake_fd),
      control_(control),
      workspace_(workspace) {
  // A step sends at most one message to each peer and receives one from
  // each. Where that many fit in the arena (four ranks or fewer), they are
  // reserved, so that a direct step (an all_to_all) does not grow its
  // vector into copies of its transfers and onto the heap; past that, only
  // the two of a ring's or a tree's step, leaving the arena to the parts.
  const std::size_t most = 2 * static_cast<std::size_t>(mesh.size() - 1);
  transfers_.reserve(most >= 2 && most <= kArenaTransfers ? most : 2);
}

int Exchange::add(Transfer::Kind kind, int peer, std::span<const Part> parts,
                  bool address) {
  Transfer& t = transfers_.emplace_back(&arena_);
  t.kind = kind;
  t.peer = peer;
  t.address = address;
  t.parts.reserve(parts.size());
  std::size_t largest_reduced = 0;
  for (const Part& given : parts) {
    if (given.bytes == 0) continue;
    Part& part = t.parts.emplace_back(given);
    t.bytes += part.bytes;
    if (part.base == part.data) part.base = nullptr;
    if (part.reduce) largest_reduced = std::max(largest_reduced, part.bytes);
  }
  if (largest_reduced > 0) {
    // Over a ring, a reducing receive takes a quarter of the ring at a
    // time, so that the sender keeps filling the rest while this rank
    // reduces; with a chunk of the whole ring the two would take turns.
    std::size_t chunk = chunk_bytes();
    if (const shm::Ring* ring =
            kind == Transfer::Kind::kRecv
                ? mesh_.ring(peer, Channel::kCollective, false)
                : nullptr) {
      chunk = std::min(
          chunk, std::max<std::size_t>(64, ring->capacity() / 4 / 64 * 64));
    }
    t.scratch_bytes = std::min(largest_reduced, chunk);
  }
  if (kind == Transfer::Kind::kSend) {
    MessageHeader header;
    header.call = call_;
    header.payload_bytes = t.bytes;
    header.address = address;
    header.encode(t.header);
  }
  return static_cast<int>(transfers_.size() - 1);
}

void Exchange::send(int peer, const void* data, std::size_t bytes) {
  const Part part{
      const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(data)), bytes};
  add(Transfer::Kind::kSend, peer, {&part, 1});
}

void Exchange::send_address(int peer, const void* data, std::size_t bytes) {
  const Part part{
      const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(data)), bytes};
  add(Transfer::Kind::kSend, peer, {&part, 1}, true);
}

void Exchange::recv_address(int peer, void* data, std::size_t bytes) {
  const Part part{static_cast<std::uint8_t*>(data), bytes};
  add(Transfer::Kind::kRecv, peer, {&part, 1}, true);
}

void Exchange::send_confirmation(int peer) { confirming_.push_back(peer); }

void Exchange::expect_confirmation(int peer) { expected_.push_back(peer); }

void Exchange::send_owed_confirmations() { sends_every_owed_ = true; }

int Exchange::add_confirmation(Transfer::Kind kind, int peer,
                               const CallInfo& last, std::uint8_t* count) {
  const Part part{count, kConfirmationBytes};
  const int index = add(kind, peer, {&part, 1});
  Transfer& t = transfers_[static_cast<std::size_t>(index)];
  t.confirmation = true;
  if (kind == Transfer::Kind::kSend) {
    MessageHeader header;
    header.call = last;
    header.payload_bytes = kConfirmationBytes;
    header.encode(t.header);
  }
  return index;
}

void Exchange::recv(int peer, void* data, std::size_t bytes) {
  const Part part{static_cast<std::uint8_t*>(data), bytes};
  add(Transfer::Kind::kRecv, peer, {&part, 1});
}

void Exchange::recv_reduce(int peer, void* data, std::size_t bytes, DType dtype,
                           ReduceOp op, const void* base) {
  const Part part{static_cast<std::uint8_t*>(data), bytes, true,
                  static_cast<const std::uint8_t*>(base)};
  const int index = add(Transfer::Kind::kRecv, peer, {&part, 1});
  transfers_[static_cast<std::size_t>(index)].dtype = dtype;
  transfers_[static_cast<std::size_t>(index)].op = op;
}

int Exchange::recv_parts(int peer, std::span<const Part> parts, DType dtype,
                         ReduceOp op) {
  const int index = add(Transfer::Kind::kRecv, peer, parts);
  transfers_.back().dtype = dtype;
  transfers_.back().op = op;
  return index;
}

void Exchange::relay(int peer, std::span<const Part> parts, std::size_t ready,
                     int source) {
  add(Transfer::Kind::kSend, peer, parts);
  transfers_.back().source = source;
  transfers_.back().ready = ready;
}

std::size_t Exchange::sendable(const Transfer& t) const {
  if (t.source < 0) return t.bytes - t.payload_done;
  const std::size_t limit = std::min(
      t.bytes,
      t.ready + transfers_[static_cast<std::size_t>(t.source)].published);
  return limit > t.payload_done ? limit - t.payload_done : 0;
}

void Exchange::advance(std::size_t index) {
  Transfer& t = transfers_[index];
  if (t.done()) return;
  const std::size_t published = t.published;
  progress(t);
  if (t.kind != Transfer::Kind::kRecv || t.published == published) return;
  for (Transfer& relay : transfers_) {
    if (relay.source == static_cast<int>(index) && !relay.done()) {
      progress(relay);
    }
  }
}

static_assert(ControlChannel::kHistory >= 2 * (Exchange::kConfirmationWindow +
                                               Exchange::kConfirmationBatch),
              "a query about a call read late must find it in the history");

std::uint64_t Exchange::confirmation_window(Mesh& mesh, int peer) {
  Mesh::Confirmations& owed = mesh.confirmations(peer);
  if (owed.window_kept != 0) return owed.window_kept;
  owed.window_kept = kConfirmationWindow;
  if (const shm::Ring* ring = mesh.ring(peer, Channel::kCollective, false)) {
    constexpr std::size_t kMessage =
        MessageHeader::kWireSize + kConfirmationBytes;
    const std::size_t fit = ring->rewind_room() / kMessage;
    owed.window_kept = std::clamp<std::uint64_t>(fit >= 3 ? fit - 2 : 1, 1,
                                                 kConfirmationWindow);
  }
  // The batch is a share of this window. A batch goes out as one message
  // that counts its confirmations, on the ring `peer` reads, whose
  // capacity `peer` chose (COMM_SHM_RING_BYTES may differ between ranks),
  // written as that ring makes room, like any message.
  owed.batch_kept = std::max<std::uint64_t>(
      1, owed.window_kept * kConfirmationBatch / kConfirmationWindow);
  return owed.window_kept;
}

std::uint64_t Exchange::confirmation_batch(Mesh& mesh, int peer) {
  confirmation_window(mesh, peer);
  return mesh.confirmations(peer).batch_kept;
}

void Exchange::run() {
  if (settles_confirmations_) settle_confirmations();
  run_transfers();
  for (int peer : expected_) mesh_.confirmations(peer).unread.push_back(call_);
  for (int peer : confirming_)
    mesh_.confirmations(peer).unsent.push_back(call_);
  if (settles_confirmations_) {
    // As soon as the step is done, so that a peer that reads them late
    // finds them there. A confirmation goes only once its call's bytes from
    // that peer have arrived. Over TCP, one that reaches a peer that has
    // shut down makes it reset the connection, which would discard bytes
    // of a later call still in its send queue, were the peer not to wait
    // for those to arrive before it closes (Mesh::wait_until_delivered).
    send_confirmations(mesh_, &call_, control_, deadline_, wake_fd_,
                       [&](int peer, const CallInfo& oldest) {
                         return oldest.sequence +
                                    confirmation_batch(mesh_, peer) <=
                                call_.sequence;
                       });
  }
}

namespace {

// A confirmation's payload: how many calls it confirms, little-endian.
void put_count(std::uint8_t* out, std::uint64_t count) {
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<std::uint8_t>(count >> (8 * i));
}

std::uint64_t take_count(const std::uint8_t* in) {
  std::uint64_t count = 0;
  for (int i = 0; i < 8; ++i) count |= std::uint64_t{in[i]} << (8 * i);
  return count;
}

// The payloads of one step's confirmations, at most one per peer, each at
// an address that stays put while the step runs. On the stack up to 64
// peers: a step of confirmations runs every few calls, and a heap
// allocation is a good part of a small call.
class ConfirmationCounts {
 public:
  explicit ConfirmationCounts(int peers) {
    counts_.reserve(static_cast<std::size_t>(peers));
  }
  ConfirmationCounts(const ConfirmationCounts&) = delete;
  ConfirmationCounts& operator=(const ConfirmationCounts&) = delete;

  // A new payload; no more than `peers` between two clear().
  std::uint8_t* add() { return counts_.emplace_back().data(); }
  const std::uint8_t* operator[](std::size_t i) const {
    return counts_[i].data();
  }
  void clear() { counts_.clear(); }

 private:
  alignas(std::max_align_t) std::byte memory_[512];
  std::pmr::monotonic_buffer_resource arena_{memory_, sizeof(memory_)};
  std::pmr::vector<std::array<std::uint8_t, Exchange::kConfirmationBytes>>
      counts_{&arena_};
};

// The oldest call, over all peers, whose confirmation is unread and for
// which `due(peer, call)` holds (each peer's oldest unread only).
template <typename Due>
std::optional<CallInfo> oldest_unread(Mesh& mesh, Due due) {
  std::optional<CallInfo> oldest;
  for (int peer = 0; peer < mesh.size(); ++peer) {
    const auto& unread = mesh.confirmations(peer).unread;
    if (unread.empty() || !due(peer, unread.front())) continue;
    if (!oldest || unread.front().sequence < oldest->sequence) {
      oldest = unread.front();
    }
  }
  return oldest;
}

}  // namespace

void Exchange::settle_confirmations() {
  bool any = false;
  for (int peer = 0; peer < mesh_.size() && !any; ++peer) {
    any = !mesh_.confirmations(peer).unread.empty() ||
          !mesh_.confirmations(peer).unsent.empty();
  }
  if (!any) return;
  auto step_has = [this](Transfer::Kind kind, int peer) {
    return std::any_of(
        transfers_.begin(), transfers_.end(),
        [&](const Transfer& t) { return t.kind == kind && t.peer == peer; });
  };
  auto read_due = [&](int peer, const CallInfo& oldest) {
    return oldest.sequence + confirmation_window(mesh_, peer) <=
               call_.sequence ||
           step_has(Transfer::Kind::kRecv, peer);
  };
  // A rank that is about to wait for its peers' confirmations first sends
  // all it owes, to every peer: ranks that wait in a cycle for each
  // other's confirmations (three or more: between two, a rank's send
  // carries what it owes first), whose next calls disagree so that each
  // only receives, would otherwise wait until the timeout, as the queries
  // of those waits ask about the earlier calls and find nothing wrong.
  bool reads = false;
  for (int peer = 0; peer < mesh_.size() && !reads; ++peer) {
    const auto& unread = mesh_.confirmations(peer).unread;
    reads = !unread.empty() && read_due(peer, unread.front());
  }
  // Otherwise a peer this step sends to reads what this rank owes it
  // first, and what is due by age goes now too, not only after a step,
  // since a call may have no step (an all_reduce of nothing) while a peer
  // waits for it.
  send_confirmations(mesh_, &call_, control_, deadline_, wake_fd_,
                     [&](int peer, const CallInfo& oldest) {
                       return reads || sends_every_owed_ ||
                              oldest.sequence +
                                      confirmation_batch(mesh_, peer) <=
                                  call_.sequence ||
                              step_has(Transfer::Kind::kSend, peer);
                     });
  read_confirmations(mesh_, &call_, control_, deadline_, wake_fd_, read_due);
  if (control_ != nullptr) read_control();
}

void Exchange::finish_confirmations(Mesh& mesh, ControlChannel* control,
                                    detail::Clock::time_point deadline) {
  // Without the control channel: a peer that has not confirmed yet is
  // late, not failed, and is told nothing; only a mismatch is reported.
  auto every = [](int, const CallInfo&) { return true; };
  send_confirmations(mesh, nullptr, nullptr, deadline, -1, every);
  try {
    read_confirmations(mesh, nullptr, nullptr, deadline, -1, every);
  } catch (const MismatchError&) {
    if (control != nullptr) {
      // Still unread, as it failed.
      if (const auto failed = oldest_unread(mesh, every)) {
        report_failure(*control, *failed, mesh.rank(), FailureSeen::kLogOnly);
      }
    }
    throw;
  }
}

template <typename Due>
void Exchange::send_confirmations(Mesh& mesh, const CallInfo* call,
                                  ControlChannel* control,
                                  detail::Clock::time_point deadline,
                                  int wake_fd, Due due) {
  // Most calls owe nothing due: leave before the step, a few kilobytes of
  // object, is even constructed.
  bool any_due = false;
  for (int peer = 0; peer < mesh.size() && !any_due; ++peer) {
    const auto& unsent = mesh.confirmations(peer).unsent;
    any_due = !unsent.empty() && due(peer, unsent.front());
  }
  if (!any_due) return;
  std::optional<Exchange> sending;
  ConfirmationCounts counts(mesh.size());
  for (int peer = 0; peer < mesh.size(); ++peer) {
    const auto& unsent = mesh.confirmations(peer).unsent;
    if (unsent.empty() || !due(peer, unsent.front())) continue;
    if (!sending) {
      sending.emplace(mesh, unsent.front(), deadline, wake_fd, control);
      sending->settles_confirmations_ = false;
      sending->running_ = call;
    }
    std::uint8_t* count = counts.add();
    put_count(count, unsent.size());
    sending->add_confirmation(Transfer::Kind::kSend, peer, unsent.back(),
                              count);
  }
  if (!sending) return;
  sending->run_transfers();
  for (const Transfer& t : sending->transfers_) {
    mesh.confirmations(t.peer).unsent.clear();
  }
}

template <typename Due>
void Exchange::read_confirmations(Mesh& mesh, const CallInfo* call,
                                  ControlChannel* control,
                                  detail::Clock::time_point deadline,
                                  int wake_fd, Due due) {
  std::optional<CallInfo> oldest = oldest_unread(mesh, due);
  if (!oldest) return;  // as in most calls
  ConfirmationCounts counts(mesh.size());
  // Bounded: each round reads at least one confirmation, and the peers owe
  // a finite number.
  for (; oldest; oldest = oldest_unread(mesh, due)) {
    // A step of the oldest call to confirm, so that its queries and its
    // errors name that call; each confirmation's header is checked
    // against the calls its sender still owes (check_header).
    Exchange reading(mesh, *oldest, deadline, wake_fd, control);
    reading.settles_confirmations_ = false;
    reading.running_ = call;
    counts.clear();
    for (int peer = 0; peer < mesh.size(); ++peer) {
      const auto& unread = mesh.confirmations(peer).unread;
      if (!unread.empty() && due(peer, unread.front())) {
        reading.add_confirmation(Transfer::Kind::kRecv, peer, unread.front(),
                                 counts.add());
      }
    }
    try {
      reading.run_transfers();
      for (std::size_t i = 0; i < reading.transfers_.size(); ++i) {
        reading.take_confirmation(reading.transfers_[i], take_count(counts[i]));
      }
    } catch (const ReportedFailure&) {
      throw;
    } catch (...) {
      // Reported as the failure of the call confirmed, which every peer
      // still in it or past it takes for its own, where the failure of a
      // later call would not fail a peer still waiting in this one. The
      // backend reports it again as the failure of the call now running.
      if (control != nullptr) report_failure(*control, *oldest, mesh.rank());
      throw;
    }
  }
}

void Exchange::take_confirmation(const Transfer& t, std::uint64_t count) {
  MessageHeader header;
  header.decode(t.header);  // checked as it arrived
  auto& unread = mesh_.confirmations(t.peer).unread;
  const auto last = std::find(unread.begin(), unread.end(), header.call);
  const auto expected = static_cast<std::uint64_t>(last - unread.begin()) + 1;
  if (count != expected) {
    throw MismatchError(
        "rank " + std::to_string(t.peer) + " confirmed " +
        std::to_string(count) + " calls up to " + header.call.describe() +
        " to rank " + std::to_string(mesh_.rank()) + ", which expected " +
        std::to_string(expected) + " (from " + unread.front().describe() +
        "); every rank must issue the same collectives in the same order "
        "with the same dtype, count, op and root");
  }
  unread.erase(unread.begin(), last + 1);
}

void Exchange::run_transfers() {
  // Small steps usually finish here: the send fits in the socket buffer and
  // the peer's message is often already in ours. Polling first would cost
  // a system call, and often a sleep, for nothing.
  // Sends go first, so that the peers have something to receive.
  for (std::size_t i = 0; i < transfers_.size(); ++i) {
    if (transfers_[i].kind == Transfer::Kind::kSend) advance(i);
  }
  for (std::size_t i = 0; i < transfers_.size(); ++i) {
    if (transfers_[i].kind == Transfer::Kind::kRecv) advance(i);
  }
  // A step that finished at once (sends that fit, messages that had
  // arrived) reads no clock: a read costs tens of nanoseconds in a guest.
  if (std::all_of(transfers_.begin(), transfers_.end(),
                  [](const Transfer& t) { return t.done(); })) {
    return;
  }
  // Where every ring waited on uses waiter barriers, a sleep costs a
  // membarrier, which interrupts every CPU of the host's ranks: those CPUs
  // are the ranks' own, so watching the rings for longer is cheaper.
  const bool barrier_rings_only =
      std::all_of(transfers_.begin(), transfers_.end(), [&](const Transfer& t) {
        if (t.done()) return true;
        const shm::Ring* ring = mesh_.ring(t.peer, Channel::kCollective,
                                           t.kind == Transfer::Kind::kSend);
        return ring != nullptr && ring->waking() == shm::Waking::kWaiterBarrier;
      });
  const auto budget = barrier_rings_only
                          ? std::chrono::microseconds(kShmSpinUs.get())
                          : spin_budget();
  const auto began = detail::Clock::now();
  bool moved_first = false;
  if (budget.count() > 0 &&
      watch_rings_first(began + std::min<detail::Clock::duration>(
                                    budget, kDescriptorPollInterval),
                        moved_first)) {
    return;
  }
  // What each pollfd stands for.
  enum class Watch { kTransfer, kAlarm, kWake, kDoorbell, kPeerExit };
  struct Watched {
    Watch what;
    int index;  // the transfer, or the peer
  };
  // The round's lists live on the stack while they fit: a small step,
  // which runs in a few microseconds, would otherwise spend a good part of
  // them in malloc and free. Past the buffer they take heap memory.
  alignas(std::max_align_t) std::byte lists_memory[1024];
  std::pmr::monotonic_buffer_resource lists(lists_memory, sizeof(lists_memory));
  std::pmr::vector<pollfd> fds(&lists);
  std::pmr::vector<Watched> owner(&lists);
  std::pmr::vector<int> ring_transfers(&lists);  // waiting on a ring
  std::pmr::vector<int> ring_peers(&lists);
  // At most a descriptor per transfer and per ring peer, the doorbell, the
  // alarm and the wake-up.
  const std::size_t most_watched = 2 * transfers_.size() + 3;
  fds.reserve(most_watched);
  owner.reserve(most_watched);
  ring_transfers.reserve(transfers_.size());
  ring_peers.reserve(transfers_.size());
  const shm::Doorbell* doorbell = nullptr;
  // Polling without sleeping lasts until spin_until: one budget after the
  // step began, and again after each round that found a socket ready or
  // moved bytes through a ring, so that a long transfer whose bytes keep
  // coming does not sleep between them, while a peer that sends nothing
  // costs one budget.
  // As after any round that moved bytes, the spin goes on for a budget
  // from the last movement.
  auto spin_until = (moved_first ? detail::Clock::now() : began) + budget;
  // When to ask the peers still owed which call they are in: kFirstQuery
  // after the last bytes moved, then at doubling intervals.
  auto query_interval = kFirstQuery;
  auto next_query = (moved_first ? spin_until : began) + query_interval;
  auto next_descriptor_poll = began + kDescriptorPollInterval;
  // Bounded by the deadline: every round waits in poll until a socket is
  // ready, a doorbell rings or a peer exits (without sleeping until
  // spin_until), then moves what it can.
  while (true) {
    fds.clear();
    owner.clear();
    ring_transfers.clear();
    ring_peers.clear();
    bool moved = false;
    bool on_socket = false;  // some transfer waits on a socket
    for (std::size_t i = 0; i < transfers_.size(); ++i) {
      Transfer& t = transfers_[i];
      if (t.done()) continue;
      const bool sending = t.kind == Transfer::Kind::kSend;
      // A relay with nothing to send waits for its source, which is
      // watched here; asking for POLLOUT would only spin.
      if (sending && t.bytes > 0 && sendable(t) == 0) continue;
      if (mesh_.ring(t.peer, Channel::kCollective, sending) != nullptr) {
        // A ring has no readiness to poll: try it, and sleep on the
        // doorbell only when it did not move.
        const std::size_t before =
            t.header_done + t.payload_done + t.scratch_filled;
        advance(i);
        if (t.header_done + t.payload_done + t.scratch_filled != before) {
          moved = true;
        }
        // Done, or a relay that sent all it has: its source is watched.
        if (t.done() || (sending && t.bytes > 0 && sendable(t) == 0)) {
          continue;
        }
        ring_transfers.push_back(static_cast<int>(i));
        if (std::find(ring_peers.begin(), ring_peers.end(), t.peer) ==
            ring_peers.end()) {
          ring_peers.push_back(t.peer);
        }
        continue;
      }
      const short events = sending ? POLLOUT : POLLIN;
      on_socket = true;
      fds.push_back(
          {mesh_.socket(t.peer, Channel::kCollective).fd(), events, 0});
      owner.push_back({Watch::kTransfer, static_cast<int>(i)});
    }
    if (fds.empty() && ring_transfers.empty()) {
      // Either all done, or only relays whose sources finished in this
      // round's ring progress, which a next round sends.
      if (std::all_of(transfers_.begin(), transfers_.end(),
                      [](const Transfer& t) { return t.done(); })) {
        return;
      }
      continue;
    }
    if (!ring_transfers.empty()) {
      doorbell = &mesh_.local_peers().doorbell(0);
      fds.push_back({doorbell->fd(), POLLIN, 0});
      owner.push_back({Watch::kDoorbell, -1});
      for (int peer : ring_peers) {
        fds.push_back({mesh_.local_peers().pidfd(peer), POLLIN, 0});
        owner.push_back({Watch::kPeerExit, peer});
      }
    }
    if (control_ != nullptr) {
      fds.push_back({control_->alarm_fd(), POLLIN, 0});
      owner.push_back({Watch::kAlarm, -1});
    }
    if (wake_fd_ >= 0) {
      fds.push_back({wake_fd_, POLLIN, 0});
      owner.push_back({Watch::kWake, -1});
    }
    const auto now = detail::Clock::now();
    if (moved) {
      spin_until = now + budget;
      query_interval = kFirstQuery;
      next_query = spin_until + query_interval;
    }
    const bool spinning = moved || (budget.count() > 0 && now < spin_until);
    // A spin that waits on rings alone needs no system call to see them
    // move; the descriptors (a doorbell, a peer's exit, the alarm, the
    // wake-up) are polled once per kDescriptorPollInterval. Between two
    // rounds it watches the rings' cursors (watch_rings).
    if (spinning && !ring_transfers.empty() && !on_socket &&
        now < next_descriptor_poll) {
      watch_rings(ring_transfers, next_descriptor_poll);
      continue;
    }
    next_descriptor_poll = now + kDescriptorPollInterval;
    const bool asking = control_ != nullptr;
    // Before sleeping, raise the waiting flag of every ring waited on,
    // order once for all of them (one membarrier, where the rings go
    // without fences, however many there are), then look again: a ring
    // that moved meanwhile means no sleep this round.
    bool armed = false;
    bool sleep = !spinning;
    if (sleep && !ring_transfers.empty()) {
      armed = true;
      sleep = shm::arm_all([&](auto&& visit) {
        for (int i : ring_transfers) {
          const Transfer& t = transfers_[static_cast<std::size_t>(i)];
          const bool sending = t.kind == Transfer::Kind::kSend;
          visit(*mesh_.ring(t.peer, Channel::kCollective, sending), sending);
        }
      });
    }
    const int ready =
        ::poll(fds.data(), fds.size(),
               sleep ? remaining_ms(std::min(deadline_, next_query)) : 0);
    const int poll_error = errno;
    if (armed) {
      for (int i : ring_transfers) {
        const Transfer& t = transfers_[static_cast<std::size_t>(i)];
        const bool sending = t.kind == Transfer::Kind::kSend;
        shm::Ring* ring = mesh_.ring(t.peer, Channel::kCollective, sending);
        if (sending) {
          ring->disarm_writer();
        } else {
          ring->disarm_reader();
        }
      }
    }
    if (ready < 0) {
      if (poll_error == EINTR) continue;
      throw SystemError(poll_error, "poll");
    }
    if (ready == 0) {
      const auto later = detail::Clock::now();
      if (later >= deadline_) time_out({});
      if (later >= next_query) {
        if (settles_confirmations_) send_owed_while_stalled();
        if (asking) {
          for (int peer : owed_peers()) control_->query(peer, call_);
        }
        query_interval = std::min(query_interval * 2, kMaxQuery);
        next_query = later + query_interval;
      }
      if (spinning && !moved) sched_yield();
      continue;
    }
    bool socket_moved = false;  // a transfer's socket was ready
    // The transfers' entries come first. Once they are all done, this step
    // has succeeded: what the control channel's alarm announces then
    // belongs to a later call (a peer that went ahead and failed there),
    // or fails this call when the backend checks it as the call ends.
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const Watched& w = owner[k];
      if (w.what != Watch::kTransfer &&
          std::all_of(transfers_.begin(), transfers_.end(),
                      [](const Transfer& t) { return t.done(); })) {
        return;
      }
      switch (w.what) {
        case Watch::kWake:
          throw BackendError(
              call_.describe() +
              " was interrupted: the process group is shutting down");
        case Watch::kAlarm: read_control(); break;
        case Watch::kTransfer:
          advance(static_cast<std::size_t>(w.index));
          socket_moved = true;
          break;
        case Watch::kDoorbell:
          // The rings are tried at the top of the next round.
          doorbell->drain();
          break;
        case Watch::kPeerExit: peer_exited(w.index); break;
      }
    }
    spin_until = detail::Clock::now() + budget;
    if (socket_moved) {
      query_interval = kFirstQuery;
      next_query = spin_until + query_interval;
    }
  }
}

bool Exchange::watch_rings_first(detail::Clock::time_point until, bool& moved) {
  int waiting[kMostWatched];
  // Bounded: each round is kWatchLooks looks at most, and the rounds end
  // at `until`.
  for (bool first = true;; first = false) {
    std::size_t count = 0;
    for (std::size_t i = 0; i < transfers_.size(); ++i) {
      const Transfer& t = transfers_[i];
      if (t.done()) continue;
      const bool sending = t.kind == Transfer::Kind::kSend;
      // A relay waiting for its source, a socket, or more rings than fit:
      // the general rounds handle those.
      if ((sending && t.source >= 0) || count == kMostWatched ||
          mesh_.ring(t.peer, Channel::kCollective, sending) == nullptr) {
        return false;
      }
      waiting[count++] = static_cast<int>(i);
    }
    if (count == 0) return true;
    if (!first && detail::Clock::now() >= until) return false;
    watch_rings({waiting, count}, until);
    for (std::size_t k = 0; k < count; ++k) {
      const Transfer& t = transfers_[static_cast<std::size_t>(waiting[k])];
      const std::size_t before =
          t.header_done + t.payload_done + t.scratch_filled;
      advance(static_cast<std::size_t>(waiting[k]));
      if (t.header_done + t.payload_done + t.scratch_filled != before) {
        moved = true;
      }
    }
  }
}

void Exchange::watch_rings(std::span<const int> waiting,
                           detail::Clock::time_point until) {
  const bool oversubscribed = mesh_.local_peers().oversubscribed();
  if (waiting.size() > kMostWatched) {
    relax(oversubscribed);
    return;
  }
  shm::Ring* rings[kMostWatched];
  bool sending[kMostWatched];
  for (std::size_t k = 0; k < waiting.size(); ++k) {
    const Transfer& t = transfers_[static_cast<std::size_t>(waiting[k])];
    sending[k] = t.kind == Transfer::Kind::kSend;
    rings[k] = mesh_.ring(t.peer, Channel::kCollective, sending[k]);
  }
  // Bounded: kWatchLooks looks, and `until`.
  for (int look = 1; look <= kWatchLooks; ++look) {
    for (std::size_t k = 0; k < waiting.size(); ++k) {
      const shm::Ring& ring = *rings[k];
      if ((sending[k] ? ring.writable() : ring.readable()) || ring.closed()) {
        return;
      }
    }
    // A yield may last another rank's whole time slice: the clock is read
    // after each one.
    if ((oversubscribed || look % kLooksPerClockRead == 0) &&
        detail::Clock::now() >= until) {
      return;
    }
    if (oversubscribed) {
      sched_yield();
    } else {
      detail::pause_core();
    }
  }
}

void Exchange::peer_exited(int peer) {
  // What the peer wrote before it ended is still in the ring: take it, and
  // fail only if this step still waits for the peer.
  for (std::size_t i = 0; i < transfers_.size(); ++i) {
    if (transfers_[i].peer == peer) advance(i);
  }
  for (Transfer& t : transfers_) {
    if (t.peer != peer || t.done()) continue;
    PeerError error(peer, mesh_.peer_name(peer) + " exited during " +
                              call_.describe() + " (killed, or crashed?)");
    // As for a broken socket (progress): a report on the control channel
    // names the first cause better than this rank can.
    read_last_words(peer);
    throw error;
  }
}

void Exchange::progress(Transfer& t) {
  try {
    if (t.kind == Transfer::Kind::kSend) {
      progress_send(t);
    } else {
      progress_recv(t);
    }
  } catch (const PeerError&) {
    // A peer that failed first reports why on the control channel before
    // it exits; its report names the real cause (the rank that died
    // first, the call that did not match), where our broken connection
    // names only the messenger.
    read_last_words(t.peer);
    throw;
  }
}

std::size_t Exchange::publish_every(const Transfer& t,
                                    const shm::Ring& ring) const {
  const std::size_t left =
      MessageHeader::kWireSize - t.header_done + t.bytes - t.payload_done;
  const std::size_t slice = std::min(kPublishBytes, ring.capacity() / 4);
  if (left < 2 * slice || mesh_.local_peers().oversubscribed()) {
    return 0;
  }
  for (const Transfer& other : transfers_) {
    if (other.kind == Transfer::Kind::kRecv && other.bytes > 0 &&
        !other.done()) {
      return 0;
    }
  }
  return slice;
}

void Exchange::progress_send(Transfer& t) {
  const int fd = mesh_.socket(t.peer, Channel::kCollective).fd();
  shm::Ring* ring = mesh_.ring(t.peer, Channel::kCollective, true);
  // Bounded: every round moves bytes or returns.
  while (true) {
    const bool header_pending = t.header_done < MessageHeader::kWireSize;
    std::size_t budget = sendable(t);
    // A relay's header waits for payload to go with it: alone, it would
    // cost a system call and a packet of its own.
    if (budget == 0 && (!header_pending || t.bytes > 0)) return;
    iovec parts[kMaxPayloadRegions];
    int count = 0;
    std::size_t skip = t.part_done;
    for (std::size_t p = t.part;
         p < t.parts.size() && budget > 0 && count < kMaxPayloadRegions; ++p) {
      const std::size_t take = std::min(budget, t.parts[p].bytes - skip);
      parts[count++] = {t.parts[p].data + skip, take};
      budget -= take;
      skip = 0;
    }
    const long sent =
        ring != nullptr ? send_some(*ring, t.header, t.header_done, parts,
                                    count, publish_every(t, *ring))
                        : send_some(fd, t.header, t.header_done, parts, count);
    if (sent < 0) {
      if (would_block(errno)) return;
      if (t.confirmation && (errno == EPIPE || errno == ECONNRESET)) {
        // See send_confirmation(): the peer has left.
        t.header_done = MessageHeader::kWireSize;
        t.payload_done = t.bytes;
        return;
      }
      throw PeerError(t.peer, "connection to " + mesh_.peer_name(t.peer) +
                                  " failed while sending " + call_.describe() +
                                  ": " + std::system_category().message(errno) +
                                  " (did it exit or crash?)");
    }
    std::size_t moved = static_cast<std::size_t>(sent);
    t.payload_done += moved;
    while (moved > 0) {
      const std::size_t take =
          std::min(moved, t.parts[t.part].bytes - t.part_done);
      t.part_done += take;
      moved -= take;
      if (t.part_done == t.parts[t.part].bytes) {
        ++t.part;
        t.part_done = 0;
      }
    }
    if (t.done()) return;
  }
}

void Exchange::progress_recv(Transfer& t) {
  shm::Ring* ring = mesh_.ring(t.peer, Channel::kCollective, false);
  while (!t.done()) {
    iovec parts[2];
    int count = 0;
    const bool header_pending = t.header_done < MessageHeader::kWireSize;
    if (header_pending) {
      parts[count++] = {t.header + t.header_done,
                        MessageHeader::kWireSize - t.header_done};
    }
    // Never take more than this message: the next one may belong to
    // another call (over a socket, what the Mesh reads ahead waits there
    // for the next receive). A reduced part is reduced where it lies in a ring,
    // its header read alone first, or else read a chunk at a time into scratch.
    Part* part = t.part < t.parts.size() ? &t.parts[t.part] : nullptr;
    const bool in_ring = ring != nullptr && part != nullptr && part->reduce;
    std::size_t chunk = 0;
    if (in_ring && !header_pending && t.scratch_filled == 0) {
      const std::size_t reduced = reduce_in_ring(t, *part, *ring, chunk);
      if (reduced > 0) {
        advance_part(t, reduced);
        continue;
      }
    }
    if (in_ring && header_pending) {
      // The header alone.
    } else if (part != nullptr && part->reduce) {
      if (chunk == 0) {
        chunk = std::min(t.scratch_bytes, part->bytes - t.part_done);
      }
      if (t.scratch.get() == nullptr) t.scratch = {workspace_, t.scratch_bytes};
      parts[count++] = {t.scratch.get() + t.scratch_filled,
                        chunk - t.scratch_filled};
    } else if (part != nullptr) {
      parts[count++] = {part->data + t.part_done, part->bytes - t.part_done};
    }
    const ssize_t n = ring != nullptr
                          ? read_some(*ring, parts, count)
                          : mesh_.read_collective(t.peer, parts, count);
    if (n == 0) {
      throw PeerError(
          t.peer, mesh_.peer_name(t.peer) + " closed its connection during " +
                      call_.describe() + " (did it exit or crash?)");
    }
    if (n < 0) {
      if (would_block(errno)) return;
      throw PeerError(t.peer, "connection to " + mesh_.peer_name(t.peer) +
                                  " failed during " + call_.describe() + ": " +
                                  std::system_category().message(errno));
    }
    std::size_t moved = static_cast<std::size_t>(n);
    if (header_pending) {
      const std::size_t to_header =
          std::min(moved, MessageHeader::kWireSize - t.header_done);
      t.header_done += to_header;
      moved -= to_header;
      if (t.header_done == MessageHeader::kWireSize) check_header(t);
    }
    if (part == nullptr) continue;
    if (part->reduce) {
      t.scratch_filled += moved;
      // chunk 0: the header was read alone, for reduce_in_ring.
      if (chunk == 0 || t.scratch_filled < chunk) continue;
      std::uint8_t* target = part->data + t.part_done;
      const std::uint8_t* other =
          part->base != nullptr ? part->base + t.part_done : target;
      reduce_pair_into(t.op, t.dtype, target, other, t.scratch.get(),
                       chunk / dtype_size(t.dtype));
      t.scratch_filled = 0;
      moved = chunk;
    }
    advance_part(t, moved);
  }
}

std::size_t Exchange::reduce_in_ring(Transfer& t, const Part& part,
                                     shm::Ring& ring, std::size_t& fallback) {
  const std::size_t element = dtype_size(t.dtype);
  const std::span<const std::uint8_t> ready = ring.peek();
  if (ready.empty()) return 0;
  // The kernels read whole, aligned elements: an element only partly
  // published is copied out, alone; a payload that lies misaligned (after
  // a message of odd length) is copied out a chunk at a time.
  if (reinterpret_cast<std::uintptr_t>(ready.data()) % element != 0) return 0;
  if (ready.size() < element) {
    fallback = element;
    return 0;
  }
  // At most a chunk (a quarter of the ring) before freeing it, so that the
  // sender refills the ring while this rank reduces.
  const std::size_t bytes =
      std::min({ready.size(), part.bytes - t.part_done, t.scratch_bytes}) /
      element * element;
  std::uint8_t* target = part.data + t.part_done;
  const std::uint8_t* other =
      part.base != nullptr ? part.base + t.part_done : target;
  reduce_pair_into(t.op, t.dtype, target, other, ready.data(), bytes / element);
  ring.consume(bytes);
  return bytes;
}

void Exchange::advance_part(Transfer& t, std::size_t moved) {
  const Part& part = t.parts[t.part];
  t.part_done += moved;
  t.payload_done += moved;
  if (t.part_done == part.bytes) {
    ++t.part;
    t.part_done = 0;
    t.published = t.payload_done;
  } else if (t.payload_done - t.published >= chunk_bytes()) {
    t.published = t.payload_done;
  }
}

void Exchange::check_header(const Transfer& t) {
  MessageHeader header;
  if (!header.decode(t.header)) {
    throw PeerError(t.peer,
                    mesh_.peer_name(t.peer) +
                        " sent bytes that are not a libcomm message during " +
                        call_.describe());
  }
  if (t.confirmation) {
    // One of the calls the peer still owes this rank a confirmation of,
    // the last of those it confirms (take_confirmation() counts them).
    const auto& unread = mesh_.confirmations(t.peer).unread;
    if (header.address || header.payload_bytes != kConfirmationBytes ||
        std::find(unread.begin(), unread.end(), header.call) == unread.end()) {
      throw MismatchError(
          "rank " + std::to_string(mesh_.rank()) + " called " +
          unread.front().describe() + " but rank " + std::to_string(t.peer) +
          " called " + header.call.describe() + " (found as rank " +
          std::to_string(mesh_.rank()) +
          " read its confirmations); every rank must issue the same "
          "collectives in the same order with the same dtype, count, op "
          "and root");
    }
    return;
  }
  if (!(header.call == call_)) {
    const MismatchError error(
        "rank " + std::to_string(mesh_.rank()) + " called " + call_.describe() +
        " but rank " + std::to_string(t.peer) + " called " +
        header.call.describe() +
        "; every rank must issue the same collectives in the same "
        "order with the same dtype, count, op and root");
    if (control_ != nullptr && header.call.sequence < call_.sequence) {
      // The message belongs to a call this rank has finished (a
      // confirmation it did not wait for), in which other peers may still
      // wait: a failure of this later call would not fail them, so it is
      // reported as a failure of that call too.
      try {
        throw error;
      } catch (...) {
        report_failure(*control_, header.call, mesh_.rank());
      }
    }
    throw error;
  }
  if (header.address != t.address) {
    throw MismatchError(
        "in " + call_.describe() + ", rank " + std::to_string(t.peer) +
        (header.address ? " sends the address of its part"
                        : " sends its part") +
        " where rank " + std::to_string(mesh_.rank()) + " expects " +
        (t.address
             ? "the address of " + std::to_string(t.bytes) + " bytes to read"
             : std::to_string(t.bytes) + " bytes") +
        "; check that the ranks' sizes (and split sizes) agree, that every "
        "rank passes shared host memory (allocate_shared_host) or none does, "
        "and their COMM_SHM_DIRECT_* settings");
  }
  if (header.payload_bytes != t.bytes) {
    throw MismatchError(
        "in " + call_.describe() + ", rank " + std::to_string(t.peer) +
        " sends " + std::to_string(header.payload_bytes) +
        " bytes where rank " + std::to_string(mesh_.rank()) + " expects " +
        std::to_string(t.bytes) + "; check that the ranks' split sizes agree");
  }
}

void Exchange::read_last_words(int peer) {
  if (control_ == nullptr) return;
  const auto at_least = detail::deadline_after(ControlChannel::kLastWordsFloor);
  const auto at_most = std::min(
      detail::deadline_after(ControlChannel::kLastWordsWait), deadline_);
  // Bounded by at_most: each round sleeps until the alarm, the wake-up or
  // a deadline.
  while (true) {
    // Closed first: a report that arrived before the peer closed is
    // recorded by then, and read_control() below sees it.
    const bool closed = control_->peer_closed(peer);
    read_control();
    // Closed in between: the alarm it raised may be the one read_control()
    // just drained, so look again rather than sleep.
    if (!closed && control_->peer_closed(peer)) continue;
    const auto now = detail::Clock::now();
    if (now >= at_most || (closed && now >= at_least)) break;
    pollfd watched[2] = {{control_->alarm_fd(), POLLIN, 0},
                         {wake_fd_, POLLIN, 0}};
    const int ready =
        ::poll(watched, 2,
               remaining_ms(closed ? std::min(at_least, at_most) : at_most));
    // Shutting down: the caller's own error stands.
    if (ready > 0 && watched[1].revents != 0) return;
  }
  const std::optional<std::string> left = control_->departure(peer);
  if (!left) return;
  throw PeerError(peer,
                  departure_error(mesh_.peer_name(peer), *left,
                                  "rank " + std::to_string(mesh_.rank()) +
                                      " waited for it in " + call_.describe(),
                                  "every rank issues the same "
                                  "collectives in the same order"));
}

void Exchange::read_control() {
  std::optional<Report> report = control_->check(call_);
  if (!report && running_ != nullptr) {
    // A failure of the call now running, found by a peer that waits for
    // this rank in it, fails this step of an earlier call too: this rank
    // would otherwise wait here for that peer's confirmation.
    if ((report = control_->check(*running_))) raise_report(*running_, *report);
  }
  if (!report) return;
  if (report->message.error == ErrorKind::kTimeout) time_out({*report});
  raise_report(call_, *report);
}

std::vector<int> Exchange::owed_peers() const {
  std::vector<int> owed;
  for (const Transfer& t : transfers_) {
    if (!t.done() &&
        std::find(owed.begin(), owed.end(), t.peer) == owed.end()) {
      owed.push_back(t.peer);
    }
  }
  return owed;
}

void Exchange::send_owed_while_stalled() {
  auto sends_nothing_to = [this](int peer, const CallInfo&) {
    // A send's bytes may be in the stream still, and a confirmation must
    // not cut into them; what was owed went before them anyway.
    return std::none_of(
        transfers_.begin(), transfers_.end(), [&](const Transfer& t) {
          return t.peer == peer && t.kind == Transfer::Kind::kSend;
        });
  };
  send_confirmations(mesh_, &call_, control_, deadline_, wake_fd_,
                     sends_nothing_to);
}

void Exchange::time_out(std::vector<Report> reports) {
  // Every rank that times out says whom it was waiting for. The ranks that
  // never say anything, yet are waited for, are the ones that stopped
  // answering; naming them beats naming a neighbour that was itself
  // waiting.
  const std::vector<int> owed = owed_peers();
  std::string mine = call_.describe() + " on rank " +
                     std::to_string(mesh_.rank()) + " timed out waiting for";
  for (int peer : owed) mine += " rank " + std::to_string(peer);
  if (control_ != nullptr) {
    ControlMessage abort;
    abort.call = call_;
    abort.error = ErrorKind::kTimeout;
    abort.waiting_for = owed;
    abort.text = mine;
    control_->broadcast(abort, std::chrono::milliseconds(200));
  }

  Report own;
  own.from = mesh_.rank();
  own.message.waiting_for = owed;
  reports.push_back(own);
  // Everyone has spoken: nothing more to wait for.
  auto accounted = [&] {
    std::vector<bool> spoke(static_cast<std::size_t>(mesh_.size()), false);
    for (const Report& r : reports) spoke[r.from] = true;
    return std::all_of(spoke.begin(), spoke.end(), [](bool b) { return b; });
  };
  // Collect the others' reports for a moment (bounded: 500 ms).
  const auto until = detail::deadline_after(std::chrono::milliseconds(500));
  // Bounded by `until`: each round sleeps until the alarm or the end.
  while (control_ != nullptr && !accounted() && detail::Clock::now() < until) {
    for (Report& report : control_->reports_for(call_.sequence)) {
      // A real cause (a dead peer, a mismatch) beats a timeout.
      if (report.message.error != ErrorKind::kTimeout) {
        raise_report(call_, report);
      }
      const bool known =
          std::any_of(reports.begin(), reports.end(),
                      [&](const Report& r) { return r.from == report.from; });
      if (!known) reports.push_back(std::move(report));
    }
    if (accounted()) break;
    pollfd alarm{control_->alarm_fd(), POLLIN, 0};
    if (::poll(&alarm, 1, remaining_ms(until)) <= 0) break;
  }

  std::vector<int> silent;
  for (const Report& r : reports) {
    for (int w : r.message.waiting_for) {
      const bool reported =
          std::any_of(reports.begin(), reports.end(),
                      [&](const Report& x) { return x.from == w; });
      if (!reported &&
          std::find(silent.begin(), silent.end(), w) == silent.end()) {
        silent.push_back(w);
      }
    }
  }
  if (silent.empty()) silent = owed;
  std::sort(silent.begin(), silent.end());
  std::string names;
  for (std::size_t i = 0; i < silent.size(); ++i) {
    names += (i ? ", rank " : "rank ") + std::to_string(silent[i]);
  }
  // What the silent ranks answered when asked which call they were in:
  // alive (their control thread answered) but not yet at this call.
  std::string late;
  for (int rank : silent) {
    if (control_ != nullptr &&
        control_->answered_not_reached(rank, call_.sequence)) {
      late += (late.empty() ? "rank " : ", rank ") + std::to_string(rank);
    }
  }
  if (!late.empty()) {
    late = "; " + late +
           " answered that it had not started this collective yet (alive "
           "but late: a longer timeout, or its missing call, would help)";
  }
  // The others were told above.
  throw Reported<TimeoutError>(
      call_.describe() + " timed out on rank " + std::to_string(mesh_.rank()) +
      ": " + names + (silent.size() == 1 ? " did" : " each did") +
      " not send or receive in time (stopped, overloaded, or not "
      "calling this collective)" +
      late);
}

}  // namespace comm::tcp
