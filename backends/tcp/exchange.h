// One step of a collective: a set of sends and receives to and from peers
// that progress together, in one thread, without busy waiting.
//
// Sends and receives run concurrently (a rank may send to its right
// neighbour while receiving from its left, or exchange with one partner in
// both directions) through non-blocking sockets and poll(). A receive may
// reduce as it goes: from a socket it reads the payload into a scratch
// buffer of one chunk and reduces each chunk into its destination while
// the kernel delivers the next one; from a shared-memory ring it reduces
// the bytes where they lie, at most a quarter of the ring at a time, while
// the sender writes the next (only a payload that lies misaligned there
// goes through scratch). So scratch memory is O(chunk), not O(message),
// per reducing receive. Taken from the call's Workspace, a step's chunks
// stay with the call until it ends, so a call holds at most one per
// reducing step (n - 1 in a ring of n ranks) and the next call finds them
// again.
//
// A step that must wait first polls its sockets without sleeping for a
// short, bounded time (spin_budget()), yielding the processor between
// polls, and only then sleeps in poll(): waking a sleeping thread costs
// more than a whole small message on a loopback mesh, and a partner that
// is a few microseconds behind is met while still polling. The budget runs
// from the start of the step and again from each round that found a socket
// ready, so a large message whose bytes keep coming is not slept on between
// them, while a rank whose peer is truly absent costs one budget of polling
// per step before it sleeps. The yield hands the core to any runnable rank
// that shares it, so ranks that outnumber the cores keep making progress.
// A step that waits only on rings without fences (shm::Waking::
// kWaiterBarrier), whose every sleep costs a membarrier, watches them for
// COMM_SHM_SPIN_US (1 ms) instead.
// bench/README.md ("The TCP backend's tuning") has the measurements.
//
// While waiting, run() also watches the control channel's alarm (a peer's
// failure report, a peer found silent by the heartbeats, an answer to a
// query) and the backend's wake-up descriptor, so that a failure elsewhere
// in the group or a shutdown ends the wait at once. A step that has waited
// kFirstQuery without any bytes moving asks the peers it waits for which
// call they are in, and again at doubling intervals up to kMaxQuery, so
// that ranks that called different collectives (different roots, say) and
// so exchange no message at all find out instead of waiting for the
// timeout. At those moments the step also sends what its rank still owes
// (send_confirmation) to every peer it sends nothing to
// (send_owed_while_stalled): such a peer may be waiting for those
// confirmations, directly or through a chain of ranks, before it sends what
// this step waits for.
//
// A peer on this host is reached through shared-memory rings (Mesh::ring)
// instead of a socket, with the same bytes (header and payload), so every
// algorithm and every check runs unchanged. Rings are progressed without a
// system call while the step polls; a step that waits on rings alone spins
// without system calls, polling its descriptors only every
// kDescriptorPollInterval, and between two rounds watches the rings'
// cursors alone (watch_rings), pausing the core between looks, or yielding
// the CPU where the host is oversubscribed
// (shm::LocalPeers::oversubscribed); before it sleeps, the step raises the
// waiting flag of each ring it waits on and sleeps on its doorbell
// (shm/ring.h says why no wake-up is lost), and on the pidfd of each such
// peer, so that a peer that dies is a PeerError at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/uio.h>

#include "backends/collective_step.h"
#include "backends/tcp/control_channel.h"
#include "backends/tcp/control_message.h"
#include "backends/tcp/mesh.h"
#include "backends/tcp/message_header.h"
#include "backends/tcp/step_arena.h"
#include "backends/workspace.h"
#include "libcomm/error.h"

namespace comm::tcp {

// The bytes of scratch a reducing receive from a socket uses (from a ring,
// at most a quarter of the ring): COMM_TCP_CHUNK_BYTES, or 256 KiB; always
// a multiple of 64.
std::size_t chunk_bytes();

// How long a waiting step polls, from its start or its last progress,
// before it sleeps: COMM_TCP_SPIN_US microseconds, or 50; 0 sleeps at once.
// Not for a step that waits only on rings without fences (see above).
std::chrono::microseconds spin_budget();

// How many bytes a one-way send over a ring copies between publications,
// once it has two such slices or more to copy (Exchange::publish_every):
// small enough that a 64 KiB message is read while it is written, large
// enough that publishing, a store the reader's core must fetch, stays rare
// (bench/README.md, "Reducing in the ring; one-way sends").
inline constexpr std::size_t kPublishBytes = 32 * 1024;

// One non-blocking sendmsg of header[header_done, kWireSize) (nothing once
// header_done is kWireSize) followed by the `count` regions of `payload`,
// at most kMaxPayloadRegions. Advances header_done and returns the payload
// bytes sent, or -1 with errno set: EAGAIN when the socket would block,
// another error when sending failed.
inline constexpr int kMaxPayloadRegions = 8;
long send_some(int fd, const std::uint8_t* header, std::size_t& header_done,
               const iovec* payload, int count);

// Sends, without blocking, as much as `fd` takes of header[header_done,
// kWireSize) followed by data[payload_done, bytes), in one sendmsg per
// round, advancing both counts. Returns 1 once everything is sent, 0 when
// the socket would block, and -1 with errno set when sending failed.
int send_message(int fd, const std::uint8_t* header, std::size_t& header_done,
                 const std::uint8_t* data, std::size_t bytes,
                 std::size_t& payload_done);

// The same three over a shared-memory ring (the channel to a rank of this
// host), with the sockets' contracts: send_some and send_message copy what
// fits, and fail with EPIPE once the reader closed the ring; read_some is
// readv's: the bytes read, 0 once the writer closed the ring and it is
// empty, -1 with EAGAIN while it is empty. send_some publishes every
// `publish_every` bytes it copies, when not 0 (Ring::write).
long send_some(shm::Ring& ring, const std::uint8_t* header,
               std::size_t& header_done, const iovec* payload, int count,
               std::size_t publish_every = 0);
int send_message(shm::Ring& ring, const std::uint8_t* header,
                 std::size_t& header_done, const std::uint8_t* data,
                 std::size_t bytes, std::size_t& payload_done);
long read_some(shm::Ring& ring, const iovec* parts, int count);

// The TCP backend's CollectiveStep, over a Mesh. A step holds at most one
// send and one receive per peer: the messages of one peer arrive in order
// on one socket.
class Exchange final : public CollectiveStep {
 public:
  using Part = CollectiveStep::Part;

  // How long a step waits before it first asks its peers which call they
  // are in, and the longest interval between two such queries.
  static constexpr std::chrono::milliseconds kFirstQuery{100};
  static constexpr std::chrono::milliseconds kMaxQuery{2000};
  // How often a step that spins on shared-memory rings alone polls its
  // descriptors (doorbell, peers' exits, alarm, wake-up): each poll is a
  // system call, and the rings need none to be seen moving.
  static constexpr std::chrono::microseconds kDescriptorPollInterval{20};

  // `wake_fd` becomes readable when the backend shuts down (or is -1).
  // Without `control` (tests of the engine alone) nothing is reported to
  // or heard from the peers' control channels. A reducing receive's chunk
  // comes from `workspace`, or without one is allocated with the step.
  Exchange(Mesh& mesh, const CallInfo& call, detail::Clock::time_point deadline,
           int wake_fd, ControlChannel* control = nullptr,
           Workspace* workspace = nullptr);
  // Its transfers point into the Exchange itself.
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  void send(int peer, const void* data, std::size_t bytes) override;
  void recv(int peer, void* data, std::size_t bytes) override;
  void send_address(int peer, const void* data, std::size_t bytes) override;
  void recv_address(int peer, void* data, std::size_t bytes) override;
  // Receives `bytes` and reduces them into `data` (dtype elements, op),
  // or into base op received with `base` (see Part).
  void recv_reduce(int peer, void* data, std::size_t bytes, DType dtype,
                   ReduceOp op, const void* base = nullptr) override;

  // Receives one message whose payload fills `parts` in order, and returns
  // a handle for relay().
  int recv_parts(int peer, std::span<const Part> parts, DType dtype,
                 ReduceOp op) override;
  // Sends one message gathered from `parts`, of which only the first
  // `ready` bytes can go at once: byte ready + x goes once the receive
  // `source` has completed (stored or reduced) and published its byte x.
  // A receive publishes chunk_bytes() or a whole part at a time, whichever
  // comes first, and its relays send once it has read what there is to
  // read. This is how a ring or a tree forwards what it receives while the
  // rest is still on its way, instead of waiting for a whole step; the
  // caller makes the parts past `ready` the memory that the receive fills.
  void relay(int peer, std::span<const Part> parts, std::size_t ready,
             int source) override;

  // Confirmations travel in batches. A confirmation is recorded in the
  // Mesh once run() has succeeded, and sent, together with the others this
  // rank owes the same peer, before the first step that sends `peer`
  // anything else, before or after the first step that begins or ends
  // kConfirmationBatch calls or more after the oldest of them (before too,
  // as a call may have no step), or by finish_confirmations(): one
  // message, whose header names the last call it confirms and whose
  // payload says how many calls it confirms. So a confirmation leaves only
  // once this rank has received all it receives from `peer` in that call.
  // EPIPE and ECONNRESET (`peer` has left) count as sent.
  void send_confirmation(int peer) override;
  // Recorded in the Mesh once run() has succeeded, and read by a later
  // step: before it receives anything else from `peer`, or at the start of
  // the first step of the call kConfirmationWindow calls later, whichever
  // comes first, or by finish_confirmations(). Until then a peer's
  // confirmation waits in its socket or ring, where it costs this rank
  // nothing; a rank that reads it a few calls late finds it there without
  // waiting, where reading it in the call would make every rooted call
  // wait for the slowest of its receivers, and one message for several
  // calls costs one system call on each side instead of several. The
  // window bounds how many calls a rank may finish before it learns that
  // a peer disagreed with one of them, and how far a rank that only sends
  // may run ahead of its receivers; where ranks outnumber CPUs, a long
  // run-ahead lets each rank move many calls per time slice. The batch is
  // smaller, so that a peer that keeps calling has sent a confirmation
  // before it is due.
  //
  // Unread, a window's confirmations from one peer can be a 72-byte
  // message per call (a rank about to wait for confirmations first sends
  // all it owes). Over a socket that is 18.5 KiB at most, which the
  // kernel's buffers hold. Over a ring it must fit in the room a ring
  // keeps free when it rewinds (ring.h), or a peer that only receives
  // from this rank would fill it and wait for a reader that waits for it
  // in turn: so the window to a peer over a ring is that room's worth of
  // messages less two (26 calls with the default ring), and the batch a
  // quarter of it (confirmation_window, confirmation_batch, which work
  // them out at a peer's first confirmation and keep them in the Mesh).
  void expect_confirmation(int peer) override;
  void send_owed_confirmations() override;
  static constexpr std::uint64_t kConfirmationWindow = 256;
  static constexpr std::uint64_t kConfirmationBatch = 64;
  static constexpr std::size_t kConfirmationBytes = 8;
  static std::uint64_t confirmation_window(Mesh& mesh, int peer);
  static std::uint64_t confirmation_batch(Mesh& mesh, int peer);

  // Sends every confirmation this rank still owes, then reads every one
  // the peers owe it, oldest first, waiting until `deadline` at most: the
  // backend calls it as it shuts down, so that its peers need not wait for
  // what it owes, and so that it closes no socket with a confirmation
  // unread (a close with unread bytes resets the connection, under a peer
  // that may still be reading what this rank sent). Throws as run() does,
  // but tells the peers (on `control`) only of a confirmation that names
  // another call: a peer that has yet to confirm is late, not failed.
  static void finish_confirmations(Mesh& mesh, ControlChannel* control,
                                   detail::Clock::time_point deadline);

  // Progresses every transfer until all are done. Throws PeerError when a
  // peer closes or resets its connection or the control channel found a
  // peer silent, MismatchError when a peer's message belongs to another
  // call or a peer answers that it called another, TimeoutError at the
  // deadline naming the peers nobody heard from, and a peer's reported
  // failure as the error it names. The last two are Reported<E>
  // (reported_failure.h): the other ranks know of them already, run()
  // having told them of its timeout.
  void run() override;

 private:
  struct Transfer {
    explicit Transfer(StepArena* arena) : parts(StepAllocator<Part>(arena)) {}
    enum class Kind { kSend, kRecv } kind = Kind::kSend;
    int peer = -1;
    std::vector<Part, StepAllocator<Part>> parts;  // none of them empty
    std::size_t bytes = 0;                         // their sum
    DType dtype = DType::kU8;
    ReduceOp op = ReduceOp::kSum;
    std::uint8_t header[MessageHeader::kWireSize];
    std::size_t header_done = 0;
    std::size_t payload_done = 0;  // sent, stored, or reduced
    // The bytes of a receive that its relays may send: payload_done, a
    // chunk or a part at a time, so that a relay forwards pieces worth a
    // system call, and a small message whole.
    std::size_t published = 0;
    // Where payload_done lies: parts[part], part_done bytes into it.
    std::size_t part = 0;
    std::size_t part_done = 0;
    // One chunk, for reduced parts; left uninitialised, as every byte is
    // received before it is read. Taken when a chunk is first copied out:
    // over a ring, where the bytes are reduced where they lie, only a
    // payload that lies misaligned, or an element published in part,
    // needs it.
    WorkspaceBuffer scratch;
    std::size_t scratch_bytes = 0;
    std::size_t scratch_filled = 0;
    // A relay's gate (see relay()); source -1: everything is ready.
    int source = -1;
    std::size_t ready = 0;
    bool confirmation = false;  // see add_confirmation()
    bool address = false;       // see send_address()
    bool done() const {
      return header_done == MessageHeader::kWireSize && payload_done == bytes;
    }
  };

  // `address`: the message says where a part lies instead of carrying it
  // (send_address(), recv_address()).
  int add(Transfer::Kind kind, int peer, std::span<const Part> parts,
          bool address = false);
  // A confirmation to or from `peer`: a header naming `last` (for a
  // send) and the count of calls confirmed in `count` (8 bytes).
  int add_confirmation(Transfer::Kind kind, int peer, const CallInfo& last,
                       std::uint8_t* count);
  // The whole step, once the confirmations due were sent and read.
  void run_transfers();
  // Sends and reads the confirmations due before this step (see
  // send_confirmation() and expect_confirmation()), then raises what the
  // control channel recorded meanwhile: the steps that read them watch it
  // for their own, older call.
  void settle_confirmations();
  // Sends, in one step of an earlier call (the oldest owed the first
  // peer due), the confirmations
  // this rank owes each peer for which `due(peer, oldest call owed)` holds.
  // `call` is the call now running (null at shutdown): a failure of it
  // that the control channel records fails the step too (running_).
  template <typename Due>
  static void send_confirmations(Mesh& mesh, const CallInfo* call,
                                 ControlChannel* control,
                                 detail::Clock::time_point deadline,
                                 int wake_fd, Due due);
  // Reads, one message per peer and round, the confirmations of each peer
  // for which `due(peer, oldest call unread)` holds, until none is due, in
  // a step of the oldest call read; `call` as above.
  template <typename Due>
  static void read_confirmations(Mesh& mesh, const CallInfo* call,
                                 ControlChannel* control,
                                 detail::Clock::time_point deadline,
                                 int wake_fd, Due due);
  // Takes the calls that the confirmation `t` received confirms off its
  // peer's unread ones; throws MismatchError when `count` is not how many
  // this rank expected up to the call its header names.
  void take_confirmation(const Transfer& t, std::uint64_t count);
  // The bytes of `t` that may be sent now.
  std::size_t sendable(const Transfer& t) const;
  // Progresses transfer `index` until its socket would block; then, for a
  // receive that published bytes, the relays it feeds. Reading all that is
  // there before relaying any of it makes fewer, larger sends, which large
  // rings need (see bench/README.md).
  void advance(std::size_t index);
  // Moves bytes while the socket takes or gives them, until it would block.
  void progress(Transfer& t);
  void progress_send(Transfer& t);
  // How often a send over `ring` publishes as it copies (Ring::write):
  // every kPublishBytes (a quarter of a smaller ring) while two of them or
  // more of the message are left, the step has no payload still to receive
  // and the host's ranks have a CPU each, so that the reader copies or
  // reduces while the writer copies, instead of the two taking turns over
  // whole rings or whole messages; 0 (once per write) otherwise: a rank that
  // also receives (a two-way exchange, a ring's step, a relay) is busy with
  // that meanwhile, and ranks that share CPUs cannot run at once.
  std::size_t publish_every(const Transfer& t, const shm::Ring& ring) const;
  void progress_recv(Transfer& t);
  // Between two rounds of a step that spins on rings alone: looks at the
  // cursors of the rings that the transfers `waiting` (indices) wait on
  // and returns as soon as one of them can move (bytes to read, room to
  // write) or is closed, after kWatchLooks looks, or once `until` (the next
  // poll of the step's descriptors) has passed. Between two looks it
  // pauses the core, and reads the clock every kLooksPerClockRead looks,
  // since how long a pause lasts differs widely between processors; where
  // the host is oversubscribed it yields the CPU instead (the
  // rank waited for may be the one that would run) and reads the clock
  // after every yield. A round reads the clock, rebuilds its lists and
  // tries every transfer; a look loads a cursor or two per ring, so a rank
  // sees its peer's message within a pause (or a yield) of its
  // publication, and ranks that share CPUs spend their turns on their
  // calls rather than on rounds. A step that waits on more than
  // kMostWatched rings (an all_to_all of many local ranks) only pauses the
  // core a few times (or yields once) and returns, so that the list of
  // rings fits on the stack.
  static constexpr int kWatchLooks = 256;
  static constexpr int kLooksPerClockRead = 32;
  static constexpr std::size_t kMostWatched = 8;
  void watch_rings(std::span<const int> waiting,
                   detail::Clock::time_point until);
  // Run first, when the first sends and receives left transfers waiting
  // and the step may spin: while every one of them waits on
  // a ring (no socket, no relay, at most kMostWatched), watches their
  // cursors and moves them, without the lists, descriptors and clock reads
  // of a whole round. Returns true once the step is done; false at
  // `until` (no later than the first descriptor poll and the end of the
  // spin budget), or when a transfer needs a round (the rounds then take
  // over from where it stopped). Sets `moved` when it moved bytes.
  bool watch_rings_first(detail::Clock::time_point until, bool& moved);
  // A reducing receive over a ring reduces the bytes where they lie in the
  // ring, into `part`, instead of copying them into scratch first. Returns
  // the bytes reduced and freed; 0 when none can be (the ring is empty, or
  // its next bytes are not a whole, aligned element), with `fallback` set
  // to the bytes the copying path should take (0: its usual chunk).
  std::size_t reduce_in_ring(Transfer& t, const Part& part, shm::Ring& ring,
                             std::size_t& fallback);
  // Counts `moved` bytes of the transfer's current part as received, and
  // publishes them to its relays every chunk_bytes() and at the part's end.
  void advance_part(Transfer& t, std::size_t moved);
  void check_header(const Transfer& t);
  // `peer`'s process ended (its pidfd): takes what it left in the rings,
  // then throws PeerError if this step still waits for it.
  void peer_exited(int peer);
  using Report = ControlChannel::Report;
  // The control channel's alarm went off: throws what it recorded that
  // fails this call, if anything.
  void read_control();
  std::vector<int> owed_peers() const;
  // Sends the confirmations this rank owes to every peer this step has no
  // send to (a step that sends to a peer sent them before its first byte,
  // in settle_confirmations). Among ranks that agree on a call, a peer
  // that a step receives from sends to it in that same step, so what the
  // peer owes goes first; ranks whose steps disagree (their kind of memory,
  // their COMM_SHM_DIRECT_* settings, their split sizes) can leave a peer
  // waiting for this rank's confirmations before it sends anything, while
  // this rank waits for that peer, or for a third rank that waits for it:
  // once they are sent, the peer goes on into the call and finds the
  // disagreement (MismatchError) instead of every rank waiting for the
  // timeout. A peer that was not waiting reads them before its next
  // receive from this rank, as it would have anyway. Called at every query
  // time: confirmations become owed only as a step ends, so the first call
  // sends all there is and the later ones find nothing due.
  void send_owed_while_stalled();
  // The deadline passed, here or (per `reports`) at a peer: tells the
  // others whom this rank waited for, gathers their reports for a moment,
  // and throws TimeoutError naming the ranks nobody heard from, as a
  // Reported<TimeoutError>.
  [[noreturn]] void time_out(std::vector<Report> reports);
  // `peer`'s connection or ring broke: throws a report that fails this
  // call, if one comes. Waits until the control channel has read the
  // peer's control connection to its end (ControlChannel::peer_closed),
  // and at least ControlChannel::kLastWordsFloor, for a report of another
  // rank, but at most ControlChannel::kLastWordsWait, the call's deadline
  // or the backend's
  // shutdown. A peer that fails, then exits or destroys its group, sends
  // its report (when its socket takes it within the report's budget)
  // before it closes that connection, so the error names the first cause
  // rather than the messenger unless this rank's control thread is more
  // than kLastWordsWait late. Where the peer said instead that it shut its
  // group down (ControlChannel::departure), throws a PeerError naming it
  // that says so (departure_error): its program ended, or destroyed its
  // group, early.
  void read_last_words(int peer);

  Mesh& mesh_;
  CallInfo call_;
  detail::Clock::time_point deadline_;
  int wake_fd_;
  ControlChannel* control_;
  Workspace* workspace_;
  // The transfers and their parts live in the arena's own buffer while
  // they fit, as those of any step among four ranks or fewer do (see the
  // constructor), and on the heap past it: a small step, which runs in a
  // few microseconds, would otherwise spend a good part of them in malloc
  // and free.
  StepArena arena_;
  // The transfers reserved up front at most: three quarters of the arena,
  // leaving the rest to their parts.
  static constexpr std::size_t kArenaTransfers =
      StepArena::kInlineBytes * 3 / 4 / sizeof(Transfer);
  static_assert(kArenaTransfers >= 2, "a step's two transfers fit the arena");
  template <typename T>
  using StepVector = std::vector<T, StepAllocator<T>>;
  StepVector<Transfer> transfers_{StepAllocator<Transfer>(&arena_)};
  // The peers whose confirmation this step expects, and those it confirms
  // to.
  StepVector<int> expected_{StepAllocator<int>(&arena_)};
  StepVector<int> confirming_{StepAllocator<int>(&arena_)};
  // False in the steps that send or read confirmations, which belong to
  // an earlier call than `running_`, the call now running.
  bool settles_confirmations_ = true;
  // send_owed_confirmations() was called: this step sends every
  // confirmation owed, to every peer.
  bool sends_every_owed_ = false;
  const CallInfo* running_ = nullptr;
};

}  // namespace comm::tcp
