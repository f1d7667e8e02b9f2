// The shared-memory transport's pieces: comm::shm::Ring (bytes in order
// across wrap-around, full and empty, read in place with peek and consume,
// written with publications as it copies; the waiting flags that decide a
// sleep; closing), and a Mesh whose ranks share a host (threads of this
// process): its collective and point-to-point channels are rings, not
// sockets, which go without fences only where they should, and an
// Exchange moves data over them.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/shm/doorbell.h"
#include "backends/shm/local_peers.h"
#include "backends/shm/ring.h"
#include "backends/tcp/exchange.h"
#include "backends/tcp/mesh.h"
#include "store/hash_store.h"
#include "support/env_is.h"
#include "support/mesh_ranks.h"
#include "support/rank_checks.h"
#include "support/temp_path.h"

using comm::shm::Doorbell;
using comm::shm::Ring;
using comm::tcp::Channel;
using comm::tcp::Mesh;
using comm::testing::EnvIs;
using comm::testing::expect;
using namespace std::chrono_literals;

namespace {

// One ring in ordinary memory, with a doorbell for each end.
struct LocalRing {
  explicit LocalRing(std::size_t capacity,
                     comm::shm::Waking waking = comm::shm::Waking::kFenced)
      : memory(comm::shm::ring_footprint(capacity) + 64) {
    // The control block needs its cache-line alignment.
    auto at = reinterpret_cast<std::uintptr_t>(memory.data());
    void* aligned = memory.data() + ((64 - at % 64) % 64);
    writer = Ring(aligned, capacity, reader_bell.fd(), waking);
    reader = Ring(aligned, capacity, writer_bell.fd(), waking);
    data = static_cast<std::uint8_t*>(aligned) + sizeof(comm::shm::RingControl);
  }
  std::vector<std::uint8_t> memory;
  std::uint8_t* data;  // the ring's first data byte
  Doorbell reader_bell, writer_bell;
  Ring writer, reader;
};

bool rang(const Doorbell& bell) {
  pollfd entry{bell.fd(), POLLIN, 0};
  return ::poll(&entry, 1, 0) == 1;
}

// Both ways of waking where this kernel offers waiter barriers (this
// process registers for them), else the fenced one, with a warning.
std::vector<comm::shm::Waking> wakings() {
  if (comm::shm::enable_waiter_barrier()) {
    return {comm::shm::Waking::kFenced, comm::shm::Waking::kWaiterBarrier};
  }
  WARN(
      "membarrier's MEMBARRIER_CMD_GLOBAL_EXPEDITED is not offered here; "
      "only fenced rings are tested");
  return {comm::shm::Waking::kFenced};
}

const char* name_of(comm::shm::Waking waking) {
  return waking == comm::shm::Waking::kFenced ? "fenced" : "waiter barrier";
}

// The CPUs this process may run on (its affinity mask), or 0 where the
// mask cannot be read.
int usable_cpus() {
  cpu_set_t usable;
  CPU_ZERO(&usable);
  if (::sched_getaffinity(0, sizeof(usable), &usable) != 0) return 0;
  return CPU_COUNT(&usable);
}

// This machine's boot id as host_identity() publishes it, or "" where
// /proc/sys/kernel/random/boot_id cannot be read.
std::string this_boot_id() {
  const std::string mine = comm::shm::host_identity();
  return mine.substr(0, mine.find(' '));
}

}  // namespace

TEST_CASE("a ring keeps bytes in order across wrap-around, full and empty",
          "[shm][ring]") {
  LocalRing ring(256);  // a capacity that writes do not divide
  std::vector<std::uint8_t> sent, got;
  std::uint8_t next = 0;
  // Writes of 50 bytes in two pieces, reads of 37: every offset of the
  // ring is crossed many times.
  for (int round = 0; round < 200; ++round) {
    std::uint8_t a[20], b[30];
    for (auto& x : a) x = next++;
    for (auto& x : b) x = next++;
    const iovec pieces[2] = {{a, sizeof(a)}, {b, sizeof(b)}};
    const std::size_t wrote = ring.writer.write(pieces, 2);
    sent.insert(sent.end(), a, a + std::min<std::size_t>(wrote, 20));
    if (wrote > 20) sent.insert(sent.end(), b, b + (wrote - 20));
    next = static_cast<std::uint8_t>(next - (50 - wrote));
    std::uint8_t out[37];
    const iovec into{out, sizeof(out)};
    const std::size_t read = ring.reader.read(&into, 1);
    got.insert(got.end(), out, out + read);
  }
  // Drain what is left.
  while (ring.reader.readable()) {
    std::uint8_t out[64];
    const iovec into{out, sizeof(out)};
    const std::size_t read = ring.reader.read(&into, 1);
    got.insert(got.end(), out, out + read);
  }
  REQUIRE(got.size() == sent.size());
  CHECK(got == sent);

  // Full: nothing more goes in, and what came out is whole.
  std::vector<std::uint8_t> big(1000, 7);
  const iovec all{big.data(), big.size()};
  CHECK(ring.writer.write(&all, 1) == 256);
  CHECK_FALSE(ring.writer.writable());
  CHECK(ring.writer.write(&all, 1) == 0);
  std::vector<std::uint8_t> out(1000);
  const iovec into{out.data(), out.size()};
  CHECK(ring.reader.read(&into, 1) == 256);
  CHECK(ring.reader.read(&into, 1) == 0);
}

TEST_CASE("a small write to an empty ring starts again at its first byte",
          "[shm][ring]") {
  LocalRing ring(256);
  const std::uint8_t* data = ring.data;
  auto pass = [&](std::size_t bytes, std::uint8_t seed) {
    std::vector<std::uint8_t> in(bytes), out(bytes);
    std::iota(in.begin(), in.end(), seed);
    const iovec from{in.data(), in.size()}, into{out.data(), out.size()};
    REQUIRE(ring.writer.write(&from, 1) == bytes);
    const bool at_start = std::memcmp(data, in.data(), bytes) == 0;
    REQUIRE(ring.reader.read(&into, 1) == bytes);
    CHECK(out == in);
    CHECK_FALSE(ring.reader.readable());
    return at_start;
  };
  // A rewind must leave rewind_room() bytes free (64 of this ring).
  REQUIRE(ring.writer.rewind_room() == 64);
  CHECK(pass(100, 1));  // a new ring starts at its first byte
  CHECK(pass(30, 2));   // empty, and 30 + 64 fits before offset 100: rewound
  // 20 + 64 does not fit before offset 30: it goes on from there, and so
  // does 150 at offset 50; the next small write, at offset 200, is rewound
  // once more.
  CHECK_FALSE(pass(20, 3));
  CHECK_FALSE(pass(150, 4));
  CHECK(pass(40, 5));
  // A write larger than the offset it finds is not rewound: it has the
  // whole ring.
  std::vector<std::uint8_t> big(1000, 9);
  const iovec all{big.data(), big.size()};
  CHECK(ring.writer.write(&all, 1) == 256);
}

TEST_CASE("a ring's counters wrap around 2^64 with its bytes in place",
          "[shm][ring]") {
  // A rewind adds most of a capacity to the counters, so small messages
  // bring them to 2^64 far sooner than their bytes would; a byte's place
  // is its counter modulo the capacity, which stays right across the wrap
  // only for a power of two.
  auto at_offset = [](LocalRing& ring, std::uint64_t offset) {
    auto* control = reinterpret_cast<comm::shm::RingControl*>(
        ring.data - sizeof(comm::shm::RingControl));
    control->head.store(offset);
    control->tail.store(offset);
  };
  SECTION("a rewind whose skip crosses 2^64") {
    LocalRing ring(256);
    at_offset(ring, ~std::uint64_t{0} - 9);  // at 246 of the ring
    std::uint8_t in[4] = {1, 2, 3, 4}, out[4] = {};
    const iovec from{in, 4}, into{out, 4};
    REQUIRE(ring.writer.write(&from, 1) == 4);  // 4 + 64 fit before 246
    CHECK(std::memcmp(ring.data, in, 4) == 0);  // rewound to the start
    REQUIRE(ring.reader.read(&into, 1) == 4);
    CHECK(std::memcmp(out, in, 4) == 0);
    CHECK_FALSE(ring.reader.readable());
  }
  SECTION("a write across 2^64, read in two parts") {
    LocalRing ring(256);
    at_offset(ring, ~std::uint64_t{0} - 7);  // at 248 of the ring
    std::vector<std::uint8_t> in(200), out(200);
    std::iota(in.begin(), in.end(), 1);
    const iovec from{in.data(), in.size()};
    REQUIRE(ring.writer.write(&from, 1) == 200);  // too large to rewind
    const iovec first{out.data(), 8}, rest{out.data() + 8, 192};
    REQUIRE(ring.reader.read(&first, 1) == 8);
    REQUIRE(ring.reader.read(&rest, 1) == 192);
    CHECK(out == in);
  }
  SECTION("a capacity that is not a power of two is refused") {
    std::vector<std::uint8_t> memory(comm::shm::ring_footprint(192) + 64);
    CHECK_THROWS_AS(Ring(memory.data(), 192, -1), comm::InvalidArgument);
    // COMM_SHM_RING_BYTES is rounded down to one.
    EnvIs ring_bytes({{"COMM_SHM_RING_BYTES", "300000"}});
    CHECK(comm::shm::ring_bytes_asked() == 262144);
  }
}

TEST_CASE(
    "a large write uses the reader's head it last saw, and looks again only "
    "when that leaves too little room",
    "[shm][ring]") {
  constexpr std::size_t kMessage = 8192;  // above the small writes' 4 KiB
  LocalRing ring(64 * 1024);
  const std::uint8_t* data = ring.data;
  // Where each message lands, by its first byte: message k is k + 1s.
  std::vector<std::size_t> offsets;
  std::vector<std::uint8_t> in(kMessage), out(kMessage);
  const iovec from{in.data(), in.size()}, into{out.data(), out.size()};
  for (std::uint8_t k = 0; k < 12; ++k) {
    std::fill(in.begin(), in.end(), static_cast<std::uint8_t>(k + 1));
    REQUIRE(ring.writer.write(&from, 1) == kMessage);
    for (std::size_t at = 0; at + kMessage <= 64 * 1024; at += kMessage) {
      if (data[at] == k + 1 && data[at + kMessage - 1] == k + 1) {
        offsets.push_back(at);
      }
    }
    REQUIRE(ring.reader.read(&into, 1) == kMessage);
    CHECK(out == in);
  }
  // The ring is empty after every read, but the writer sees that only when
  // the head it saw last leaves less than 8 KiB. Messages 0 to 7 walk the
  // ring, where small ones would rewind to its first byte; message 8 finds
  // no room behind the head it saw (0) and looks: the ring is empty, and
  // wraps to offset 0 anyway. Then the walk goes on.
  REQUIRE(offsets.size() == 12);
  for (std::size_t k = 0; k < 12; ++k) {
    CHECK(offsets[k] == k % 8 * kMessage);
  }
}

TEST_CASE("a rewound write left unread leaves room for more", "[shm][ring]") {
  // A reader may leave small messages unread for a while (the
  // confirmations tcp::Exchange reads a few calls late); the writer must
  // still find room behind them, or the two could wait for each other.
  LocalRing ring(256);
  std::vector<std::uint8_t> in(1000, 3), out(1000);
  const iovec into{out.data(), out.size()};
  const iovec first{in.data(), 150};
  REQUIRE(ring.writer.write(&first, 1) == 150);
  REQUIRE(ring.reader.read(&into, 1) == 150);
  // Empty at offset 150: 80 + 64 fits before it, so the write rewinds and
  // the 106 bytes it skips count as written until the reader passes them.
  const iovec small{in.data(), 80};
  REQUIRE(ring.writer.write(&small, 1) == 80);
  const iovec rest{in.data(), in.size()};
  CHECK(ring.writer.write(&rest, 1) == 70);
  CHECK(70 >= ring.writer.rewind_room());
  // The reader gets the 80 bytes, then the 70, and nothing of the skip.
  CHECK(ring.reader.read(&into, 1) == 150);
  CHECK_FALSE(ring.reader.readable());
}

namespace {

// The byte at offset `i` of a stream that two threads move through a ring.
std::uint8_t stream_byte(std::size_t i) {
  return static_cast<std::uint8_t>(i * 131 >> 3);
}

// Moves 1 MiB of stream_byte()s through a 512-byte ring, each side for at
// most 20 s: a reader thread calls take(ring, got), which appends what it
// takes to `got` and returns how much; this thread calls give(ring, from,
// sent) with the next bytes, which writes some and returns how many.
// Every byte must arrive, in order.
template <typename Take, typename Give>
void stream_through_ring(Take take, Give give) {
  LocalRing ring(512);
  constexpr std::size_t kBytes = 1 << 20;
  std::vector<std::uint8_t> got;
  got.reserve(kBytes);
  std::thread reader([&] {
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (got.size() < kBytes && std::chrono::steady_clock::now() < until) {
      if (take(ring.reader, got) == 0) sched_yield();
    }
  });
  std::size_t sent = 0;
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (sent < kBytes && std::chrono::steady_clock::now() < until) {
    std::uint8_t in[400];
    const std::size_t want = std::min(kBytes - sent, sizeof(in));
    for (std::size_t i = 0; i < want; ++i) in[i] = stream_byte(sent + i);
    const std::size_t wrote =
        give(ring.writer, std::span<const std::uint8_t>(in, want), sent);
    sent += wrote;
    if (wrote == 0) sched_yield();
  }
  reader.join();
  REQUIRE(got.size() == kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) {
    if (got[i] != stream_byte(i)) FAIL("byte " << i);
  }
}

// Reads of changing sizes, so that rewinds meet partial reads.
std::size_t read_some_of(Ring& ring, std::vector<std::uint8_t>& got) {
  std::uint8_t out[97];
  const iovec into{out, 1 + got.size() % sizeof(out)};
  const std::size_t read = ring.read(&into, 1);
  got.insert(got.end(), out, out + read);
  return read;
}

}  // namespace

TEST_CASE("a ring's bytes stay in order between two threads", "[shm][ring]") {
  stream_through_ring(
      read_some_of,
      [](Ring& ring, std::span<const std::uint8_t> next, std::size_t sent) {
        // Writes of changing sizes, 1 to 80 bytes.
        const iovec from{const_cast<std::uint8_t*>(next.data()),
                         std::min(next.size(), 1 + sent % 80)};
        return ring.write(&from, 1);
      });
}

TEST_CASE(
    "peek and consume take the bytes read would, across rewinds and "
    "wrap-around, from a writer that publishes as it copies",
    "[shm][ring]") {
  stream_through_ring(
      [](Ring& ring, std::vector<std::uint8_t>& got) -> std::size_t {
        if (got.size() % 3 == 0) return read_some_of(ring, got);
        // Some of what peek() shows, never more.
        const std::span<const std::uint8_t> ready = ring.peek();
        const std::size_t taken = std::min(ready.size(), 1 + got.size() % 61);
        got.insert(got.end(), ready.begin(), ready.begin() + taken);
        ring.consume(taken);
        return taken;
      },
      [](Ring& ring, std::span<const std::uint8_t> next, std::size_t sent) {
        // Small writes, which rewind an empty ring, and 400-byte ones,
        // which publish every 7 bytes.
        const bool large = sent % 5 == 0;
        const iovec from{const_cast<std::uint8_t*>(next.data()),
                         std::min(next.size(), large ? 400 : 1 + sent % 40)};
        return ring.write(&from, 1, large ? 7 : 0);
      });
}

// The waiting flags decide every doorbell, for rings of `waking`.
static void check_waking(comm::shm::Waking waking) {
  LocalRing ring(256, waking);
  std::uint8_t byte = 1;
  const iovec one{&byte, 1};

  // Nobody waits: no doorbell.
  ring.writer.write(&one, 1);
  CHECK_FALSE(rang(ring.reader_bell));
  // Data there: arming says do not sleep.
  CHECK_FALSE(ring.reader.arm_reader());
  ring.reader.disarm_reader();
  std::uint8_t out[8];
  const iovec into{out, sizeof(out)};
  CHECK(ring.reader.read(&into, 1) == 1);
  CHECK_FALSE(rang(ring.writer_bell));

  // Empty and armed: the reader may sleep, and the next write rings it.
  CHECK(ring.reader.arm_reader());
  ring.writer.write(&one, 1);
  CHECK(rang(ring.reader_bell));
  ring.reader_bell.drain();
  CHECK_FALSE(rang(ring.reader_bell));
  ring.reader.disarm_reader();
  CHECK(ring.reader.read(&into, 1) == 1);

  // A full ring and a writer that waits for room: a read rings it.
  std::vector<std::uint8_t> big(256, 3);
  const iovec all{big.data(), big.size()};
  CHECK(ring.writer.write(&all, 1) == 256);
  CHECK(ring.writer.arm_writer());
  CHECK(ring.reader.read(&into, 1) == 8);
  CHECK(rang(ring.writer_bell));
  ring.writer.disarm_writer();

  // Closing wakes the other end, which sees it after the bytes left.
  ring.writer_bell.drain();
  ring.reader_bell.drain();
  ring.writer.close();
  CHECK(rang(ring.reader_bell));
  CHECK(ring.reader.closed());
  CHECK_FALSE(ring.reader.arm_reader());  // closed: never sleep on it
  std::vector<std::uint8_t> rest(512);
  const iovec into_rest{rest.data(), rest.size()};
  CHECK(comm::tcp::read_some(ring.reader, &into_rest, 1) == 248);
  CHECK(comm::tcp::read_some(ring.reader, &into_rest, 1) == 0);  // end
  std::size_t header_done = comm::tcp::MessageHeader::kWireSize;
  CHECK(comm::tcp::send_some(ring.writer, nullptr, header_done, &one, 1) == -1);
  CHECK(errno == EPIPE);
}

TEST_CASE("a ring wakes the other end only when it said it waits",
          "[shm][ring]") {
  for (const comm::shm::Waking waking : wakings()) {
    INFO(name_of(waking));
    check_waking(waking);
  }
}

TEST_CASE("no wake-up is lost between a writer and a reader that sleeps",
          "[shm][ring]") {
  // One byte at a time, each written only once the reader has taken the
  // one before, after an uneven delay, so that many publications meet the
  // reader as it raises its flag; the reader sleeps whenever the ring is
  // empty. No later byte can then ring for a lost wake-up: the reader
  // would sleep out the poll's 2 s, which fails the test.
  constexpr int kBytes = 20000;
  for (const comm::shm::Waking waking : wakings()) {
    INFO(name_of(waking));
    LocalRing ring(4096, waking);
    std::atomic<int> taken{0};
    std::atomic<bool> lost{false};
    std::thread writer([&] {
      for (int i = 0; i < kBytes && !lost.load(); ++i) {
        // Bounded: the reader takes each byte or gives up within 2 s.
        while (taken.load() < i && !lost.load()) sched_yield();
        for (unsigned spin = 0; spin < static_cast<unsigned>(i) * 7919u % 4000u;
             ++spin) {
          std::atomic_signal_fence(std::memory_order_seq_cst);
        }
        std::uint8_t byte = static_cast<std::uint8_t>(i);
        const iovec one{&byte, 1};
        ring.writer.write(&one, 1);  // the ring is empty: it fits
      }
    });
    int sleeps = 0;
    bool in_order = true;
    while (taken.load() < kBytes && !lost.load()) {
      std::uint8_t bytes[8];
      const iovec into{bytes, sizeof(bytes)};
      const std::size_t n = ring.reader.read(&into, 1);
      for (std::size_t i = 0; i < n; ++i) {
        in_order =
            in_order && bytes[i] == static_cast<std::uint8_t>(taken.load());
        taken.fetch_add(1);
      }
      if (n > 0) continue;
      if (ring.reader.arm_reader()) {
        ++sleeps;
        pollfd entry{ring.reader_bell.fd(), POLLIN, 0};
        if (::poll(&entry, 1, 2000) == 0) lost.store(true);
        ring.reader_bell.drain();
      }
      ring.reader.disarm_reader();
    }
    writer.join();
    CHECK_FALSE(lost.load());
    CHECK(taken.load() == kBytes);
    CHECK(in_order);
    CHECK(sleeps > 0);  // the reader did sleep, so the doorbell was tested
  }
}

TEST_CASE("ranks of one host talk over rings, not sockets, but for control",
          "[shm][mesh]") {
  EnvIs shm({{"COMM_TRANSPORT", "shm"}});
  constexpr int kWorld = 3;
  auto errors = comm::testing::run_meshes(kWorld, 20s, [](Mesh& mesh) {
    const int me = mesh.rank();
    expect(mesh.local_peers().local_count() == kWorld, "every rank is local");
    for (int peer = 0; peer < kWorld; ++peer) {
      if (peer == me) continue;
      for (Channel channel : {Channel::kCollective, Channel::kPointToPoint}) {
        expect(!mesh.socket(peer, channel).valid(),
               "a data socket to a rank of this host");
        expect(mesh.ring(peer, channel, true) != nullptr &&
                   mesh.ring(peer, channel, false) != nullptr,
               "no ring to a rank of this host");
      }
      expect(mesh.socket(peer, Channel::kControl).valid(), "no control socket");
      expect(mesh.ring(peer, Channel::kControl, true) == nullptr,
             "a ring for control");
      expect(mesh.peer_name(peer).find("shared memory") != std::string::npos,
             "peer_name says " + mesh.peer_name(peer));
    }
    // A ring-all-gather through Exchange: a large message each way, in
    // steps, so that every ring fills and wraps.
    const std::size_t bytes = (1 << 20) + 13;
    std::vector<std::vector<std::uint8_t>> blocks(kWorld);
    for (int r = 0; r < kWorld; ++r) blocks[r].resize(bytes);
    for (std::size_t i = 0; i < bytes; ++i) {
      blocks[me][i] = static_cast<std::uint8_t>(i * 7 + me);
    }
    const comm::tcp::CallInfo call{comm::tcp::Collective::kAllGather,
                                   0,
                                   comm::DType::kU8,
                                   1,
                                   comm::ReduceOp::kSum,
                                   -1};
    for (int step = 1; step < kWorld; ++step) {
      comm::tcp::Exchange exchange(mesh, call,
                                   comm::detail::deadline_after(20s), -1);
      const int to = (me + step) % kWorld;
      const int from = (me - step + kWorld) % kWorld;
      exchange.send(to, blocks[me].data(), bytes);
      exchange.recv(from, blocks[from].data(), bytes);
      exchange.run();
    }
    for (int r = 0; r < kWorld; ++r) {
      for (std::size_t i = 0; i < bytes; i += 4099) {
        expect(blocks[r][i] == static_cast<std::uint8_t>(i * 7 + r),
               "byte " + std::to_string(i) + " from rank " + std::to_string(r));
      }
    }
  });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

TEST_CASE(
    "a rank's rings shrink past 64 local peers, and a host's must fit in "
    "half its available memory",
    "[shm]") {
  using comm::shm::ring_bytes;
  {
    EnvIs unset({{"COMM_SHM_RING_BYTES", nullptr}});
    CHECK(comm::shm::ring_bytes_asked() == 0);
  }
  // By default 256 KiB, while a rank's 2 x peers rings fit in 32 MiB.
  CHECK(ring_bytes(0, 1) == 256 << 10);
  CHECK(ring_bytes(0, 64) == 256 << 10);
  CHECK(ring_bytes(0, 65) == 128 << 10);
  CHECK(ring_bytes(0, 128) == 128 << 10);
  CHECK(ring_bytes(0, 129) == 64 << 10);
  CHECK(ring_bytes(0, 1000) == 16 << 10);
  CHECK(ring_bytes(0, 100000) == 16 << 10);  // no smaller than 16 KiB
  // What a rank asks for, whatever its peers.
  CHECK(ring_bytes(300000, 1000) == 262144);
  CHECK(ring_bytes(4096, 1) == 4096);
  // Half the available memory at most; unknown memory refuses nothing.
  CHECK(comm::shm::rings_fit(10, 20));
  CHECK_FALSE(comm::shm::rings_fit(11, 20));
  CHECK(comm::shm::rings_fit(std::uint64_t{1} << 50, 0));
  const std::uint64_t available = comm::shm::available_memory();
  CHECK(available > 0);  // /proc/meminfo has MemAvailable
}

namespace {

// A directory tree standing for /proc/self/cgroup and /sys/fs/cgroup,
// removed at the end of the test.
class FakeCgroups {
 public:
  FakeCgroups() : top_(path_.str()) {
    std::filesystem::create_directories(top_ / "sys");
  }
  ~FakeCgroups() { std::filesystem::remove_all(top_); }

  std::string membership() const { return (top_ / "cgroup").string(); }
  std::string root() const { return (top_ / "sys").string(); }
  // Writes `text` to `file` under the cgroup root, making its directory.
  void write(const std::string& file, const std::string& text) const {
    const auto path = top_ / "sys" / file;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void member_of(const std::string& lines) const {
    std::ofstream(membership()) << lines;
  }

 private:
  comm::testing::TempPath path_{"fake_cgroups"};
  std::filesystem::path top_;
};

constexpr std::uint64_t kMiB = 1 << 20;

}  // namespace

TEST_CASE(
    "the memory left under cgroup v1 and v2 limits on a host or in a container",
    "[shm]") {
  using comm::shm::cgroup_room;
  const FakeCgroups fake;
  SECTION("v2: the least room of the cgroup and those above it") {
    fake.member_of("0::/job/rank\n");
    fake.write("job/rank/memory.max", "max\n");
    fake.write("job/rank/memory.current", "1000\n");
    // 1 GiB, 300 MiB charged of which 200 MiB are file cache and 50 MiB of
    // that shared memory: 150 MiB are reclaimable, 150 MiB used.
    fake.write("job/memory.max", std::to_string(1024 * kMiB) + "\n");
    fake.write("job/memory.current", std::to_string(300 * kMiB) + "\n");
    fake.write("job/memory.stat", "anon 100\nfile " +
                                      std::to_string(200 * kMiB) + "\nshmem " +
                                      std::to_string(50 * kMiB) + "\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 874 * kMiB);
    // A tighter limit below wins.
    fake.write("job/rank/memory.max", std::to_string(500 * kMiB) + "\n");
    fake.write("job/rank/memory.current", std::to_string(400 * kMiB) + "\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 100 * kMiB);
    // At or over its limit, a cgroup has no room, which is not "unknown".
    fake.write("job/rank/memory.current", std::to_string(600 * kMiB) + "\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 1);
  }
  SECTION("v1: the hierarchical limit, less usage that is not cache") {
    fake.member_of("12:cpu,cpuacct:/x\n7:memory:/job\n0::/x\n");
    fake.write("memory/job/memory.usage_in_bytes",
               std::to_string(600 * kMiB) + "\n");
    fake.write("memory/job/memory.stat",
               "cache 1\nhierarchical_memory_limit " +
                   std::to_string(4096 * kMiB) + "\ntotal_cache " +
                   std::to_string(300 * kMiB) + "\ntotal_shmem " +
                   std::to_string(100 * kMiB) + "\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 3696 * kMiB);
    // No limit reads as the page counter's maximum.
    fake.write("memory/job/memory.stat",
               "hierarchical_memory_limit 9223372036854771712\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 0);
  }
  SECTION("v1 in a container: the path is not there, the root is its own") {
    fake.member_of("4:memory:/docker/abc\n");
    fake.write("memory/memory.usage_in_bytes",
               std::to_string(100 * kMiB) + "\n");
    fake.write("memory/memory.stat", "hierarchical_memory_limit " +
                                         std::to_string(2048 * kMiB) + "\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 1948 * kMiB);
  }
  SECTION("both on a hybrid host: the lesser") {
    fake.member_of("4:memory:/a\n0::/b\n");
    fake.write("memory/a/memory.usage_in_bytes", "0\n");
    fake.write("memory/a/memory.stat", "hierarchical_memory_limit " +
                                           std::to_string(700 * kMiB) + "\n");
    fake.write("b/memory.max", std::to_string(900 * kMiB) + "\n");
    fake.write("b/memory.current", "0\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 700 * kMiB);
  }
  SECTION("no limit anywhere, or nothing to read") {
    fake.member_of("0::/free\n");
    fake.write("free/memory.max", "max\n");
    fake.write("free/memory.current", "5\n");
    CHECK(cgroup_room(fake.membership(), fake.root()) == 0);
    CHECK(cgroup_room(fake.membership() + ".missing", fake.root()) == 0);
  }
}

TEST_CASE(
    "rings that would take more than half a host's memory: auto uses TCP, "
    "shm says why it cannot",
    "[shm][mesh]") {
  // Four ranks asking for rings of 1 GiB take 24 GiB. Where that fits in
  // half the memory available, the case would make them: it does not run.
  const std::uint64_t needed = 4 * 2 * 3 * (std::uint64_t{1} << 30);
  if (comm::shm::rings_fit(needed, comm::shm::available_memory())) {
    WARN("skipped: this host has more than 48 GiB of memory available");
    return;
  }
  {
    EnvIs env(
        {{"COMM_TRANSPORT", "auto"}, {"COMM_SHM_RING_BYTES", "1073741824"}});
    auto errors = comm::testing::run_meshes(4, 20s, [](Mesh& mesh) {
      expect(mesh.local_peers().local_count() == 1, "ranks share memory");
      for (int peer = 0; peer < 4; ++peer) {
        if (peer == mesh.rank()) continue;
        expect(mesh.socket(peer, Channel::kCollective).valid(), "no socket");
        expect(mesh.ring(peer, Channel::kCollective, true) == nullptr,
               "a ring");
      }
    });
    for (const std::string& error : errors) CHECK(error == "");
  }
  {
    EnvIs env(
        {{"COMM_TRANSPORT", "shm"}, {"COMM_SHM_RING_BYTES", "1073741824"}});
    auto errors = comm::testing::run_meshes(4, 20s, [](Mesh&) {});
    for (const std::string& error : errors) {
      CHECK_THAT(error, Catch::Matchers::Contains("COMM_TRANSPORT=shm: the "
                                                  "rings of this host's 4 "
                                                  "ranks would take") &&
                            Catch::Matchers::Contains(
                                "set COMM_SHM_RING_BYTES lower"));
    }
  }
}

TEST_CASE("COMM_TRANSPORT=tcp keeps every channel on sockets", "[shm][mesh]") {
  EnvIs tcp({{"COMM_TRANSPORT", "tcp"}});
  auto errors = comm::testing::run_meshes(2, 20s, [](Mesh& mesh) {
    const int peer = 1 - mesh.rank();
    expect(mesh.local_peers().local_count() <= 1, "ranks are local over tcp");
    expect(mesh.socket(peer, Channel::kCollective).valid(), "no socket");
    expect(mesh.ring(peer, Channel::kCollective, true) == nullptr, "a ring");
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}

TEST_CASE("a host's ranks know whether they outnumber their CPUs",
          "[shm][mesh]") {
  EnvIs shm({{"COMM_TRANSPORT", "shm"}});
  const int cpus = usable_cpus();
  REQUIRE(cpus > 0);
  // Thread ranks share this process's CPUs: one more rank than CPUs is too
  // many, two ranks on two or more CPUs are not.
  for (const int world : {2, cpus + 1}) {
    if ((world == 2 && cpus < 2) || world > 16) continue;  // too many threads
    const bool expected = world > cpus;
    INFO("world " << world << ", " << cpus << " usable CPUs");
    auto errors = comm::testing::run_meshes(world, 20s, [&](Mesh& mesh) {
      expect(mesh.local_peers().oversubscribed() == expected,
             expected ? "not oversubscribed" : "oversubscribed");
    });
    for (const std::string& error : errors) CHECK(error == "");
  }
}

TEST_CASE(
    "only the collective lane of ranks with a CPU each goes without fences",
    "[shm][mesh]") {
  const int cpus = usable_cpus();
  REQUIRE(cpus > 0);
  const bool offered = comm::shm::enable_waiter_barrier();
  if (!offered) {
    WARN("membarrier's MEMBARRIER_CMD_GLOBAL_EXPEDITED is not offered here");
  }
  // World 2 has a CPU per rank where there are two; world cpus + 1 (when
  // it is a reasonable number of threads) does not.
  for (const int world : {2, cpus + 1}) {
    if (world > 16) continue;
    for (const char* membarrier : {"1", "0"}) {
      const bool fence_free = offered && world == 2 && world <= cpus &&
                              std::string(membarrier) == "1";
      INFO("world " << world << ", COMM_SHM_MEMBARRIER=" << membarrier);
      EnvIs env({{"COMM_TRANSPORT", "shm"},
                 {"COMM_SHM_MEMBARRIER", membarrier},
                 {"COMM_SHM_SPIN_US", "0"}});
      auto errors = comm::testing::run_meshes(world, 20s, [&](Mesh& mesh) {
        const int me = mesh.rank();
        for (int peer = 0; peer < world; ++peer) {
          if (peer == me) continue;
          for (const bool sending : {true, false}) {
            const Ring* collective =
                mesh.ring(peer, Channel::kCollective, sending);
            const Ring* p2p = mesh.ring(peer, Channel::kPointToPoint, sending);
            expect(collective->waking() ==
                       (fence_free ? comm::shm::Waking::kWaiterBarrier
                                   : comm::shm::Waking::kFenced),
                   std::string("collective ring is ") +
                       name_of(collective->waking()));
            expect(p2p->waking() == comm::shm::Waking::kFenced,
                   "the point-to-point ring goes without fences");
          }
        }
        if (world != 2) return;
        // Each rank sends four rings' worth to the other, which starts late,
        // so that the first waits for room on one ring and bytes on the
        // other at once, with no spin (COMM_SHM_SPIN_US=0 where the rings go
        // without fences): it sleeps on both after one order_before_sleep,
        // and must be woken. Whether it slept is not observed; the bytes
        // arriving whole within the deadline are.
        const std::size_t bytes =
            4 * mesh.ring(1 - me, Channel::kCollective, true)->capacity() + 13;
        std::vector<std::uint8_t> out(bytes), in(bytes);
        for (std::size_t i = 0; i < bytes; ++i) {
          out[i] = static_cast<std::uint8_t>(i * 5 + me);
        }
        if (me == 1) std::this_thread::sleep_for(50ms);
        const comm::tcp::CallInfo call{comm::tcp::Collective::kAllGather,
                                       0,
                                       comm::DType::kU8,
                                       1,
                                       comm::ReduceOp::kSum,
                                       -1};
        comm::tcp::Exchange exchange(mesh, call,
                                     comm::detail::deadline_after(20s), -1);
        exchange.send(1 - me, out.data(), bytes);
        exchange.recv(1 - me, in.data(), bytes);
        exchange.run();
        for (std::size_t i = 0; i < bytes; i += 997) {
          expect(in[i] == static_cast<std::uint8_t>(i * 5 + 1 - me),
                 "byte " + std::to_string(i));
        }
      });
      for (std::size_t r = 0; r < errors.size(); ++r) {
        INFO("rank " << r);
        CHECK(errors[r] == "");
      }
    }
  }
}

TEST_CASE("a rank knows which peers run on its kernel, whatever their host",
          "[shm][mesh]") {
  // Ranks 1 and 2 are made up: both asked for tcp, so neither is local to
  // rank 0; rank 1 shares its boot id from another network namespace (a
  // veth pair away), rank 2 runs on another machine.
  const std::string boot_id = this_boot_id();
  if (boot_id.empty()) {
    WARN("no boot id here (/proc/sys/kernel/random/boot_id): not tested");
    return;
  }
  // Rank 0 reads the identities as it sets up shared memory, or, where it
  // asked for tcp itself, once its mesh is connected (read_hosts).
  const char* transport = GENERATE("auto", "tcp");
  INFO("COMM_TRANSPORT=" << transport);
  EnvIs env({{"COMM_TRANSPORT", transport}});
  comm::HashStore store;
  store.set_string("shm/host/1",
                   "tcp " + boot_id + " ipc:1 net:2 pid:3 pid 1 cpus 1");
  store.set_string("shm/host/2",
                   "tcp 00000000-0000-0000-0000-000000000000 ipc:1 net:2 "
                   "pid:3 pid 1 cpus 1");
  const auto deadline = comm::detail::deadline_after(10s);
  comm::shm::LocalPeers peers(store, 0, 3, 7, deadline);
  peers.read_hosts(store, deadline);
  CHECK(peers.hosts().host_count() == 3);
  CHECK(!peers.is_local(1));
  CHECK(peers.same_kernel(0));
  CHECK(peers.same_kernel(1));
  CHECK(!peers.same_kernel(2));
}

TEST_CASE(
    "ranks in other namespaces of this kernel count against its CPUs, ranks "
    "on other machines do not",
    "[shm][mesh]") {
  const std::string boot_id = this_boot_id();
  if (boot_id.empty()) {
    WARN("no boot id here (/proc/sys/kernel/random/boot_id): not tested");
    return;
  }
  // Rank 0 sets up shared memory, which needs pidfds; without them it
  // falls back to TCP and looks at no CPU.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  if (pidfd < 0) {
    WARN("pidfd_open is refused here: not tested");
    return;
  }
  ::close(pidfd);
  cpu_set_t usable;
  CPU_ZERO(&usable);
  REQUIRE(::sched_getaffinity(0, sizeof(usable), &usable) == 0);
  const int cpus = CPU_COUNT(&usable);
  int lowest = 0;
  while (!CPU_ISSET(lowest, &usable)) ++lowest;
  // That CPU's mask in hexadecimal, as ranks publish theirs.
  const std::string lowest_mask =
      std::string(1, "1248"[lowest % 4]) + std::string(lowest / 4, '0');
  // Rank 0 is alone on its host; ranks 1 to `cpus`, made up, run on one of
  // its CPUs, in another network namespace of this machine (as containers,
  // or the tests' emulated hosts, do), or on another machine. With this
  // kernel's, the group has one rank more than the CPUs its ranks here may
  // use.
  EnvIs env({{"COMM_TRANSPORT", "auto"}});
  for (const bool same_kernel : {true, false}) {
    INFO((same_kernel ? "this kernel" : "another machine")
         << ", " << cpus << " CPUs");
    comm::HashStore store;
    const std::string theirs =
        same_kernel ? boot_id : "00000000-0000-0000-0000-000000000000";
    for (int r = 1; r <= cpus; ++r) {
      store.set_string(
          "shm/host/" + std::to_string(r),
          "tcp " + theirs + " ipc:1 net:2 pid:3 pid 1 cpus " + lowest_mask);
    }
    const auto deadline = comm::detail::deadline_after(10s);
    comm::shm::LocalPeers peers(store, 0, cpus + 1, 7, deadline);
    CHECK(peers.local_count() == 1);
    CHECK(peers.oversubscribed() == same_kernel);
  }
}

TEST_CASE("connections over loopback get the loopback send buffer",
          "[shm][mesh]") {
  // The ranks listen on 127.0.0.2 and connect from 127.0.0.1, so the two
  // ends of each connection have different addresses: the loopback
  // address, not their equality, says that they share a namespace. The
  // buffer across namespaces differs, so that taking it would fail.
  EnvIs env({{"COMM_TRANSPORT", "tcp"},
             {"COMM_TCP_ADDR", "127.0.0.2"},
             {"COMM_TCP_LOCAL_SNDBUF_BYTES", "100000"},
             {"COMM_TCP_NETNS_SNDBUF_BYTES", "60000"}});
  // Linux caps SO_SNDBUF at net.core.wmem_max and reports twice the value.
  int cap = 100000;
  std::ifstream("/proc/sys/net/core/wmem_max") >> cap;
  if (cap <= 60000) {
    WARN("net.core.wmem_max is " << cap
                                 << ": both buffers would be capped alike");
    return;
  }
  const int expected = 2 * std::min(100000, cap);
  auto errors = comm::testing::run_meshes(2, 20s, [&](Mesh& mesh) {
    const int peer = 1 - mesh.rank();
    for (int channel = 0; channel < comm::tcp::kChannels; ++channel) {
      const int fd = mesh.socket(peer, static_cast<Channel>(channel)).fd();
      sockaddr_in mine{}, theirs{};
      socklen_t mine_size = sizeof(mine), theirs_size = sizeof(theirs);
      expect(::getsockname(fd, reinterpret_cast<sockaddr*>(&mine),
                           &mine_size) == 0 &&
                 ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs),
                               &theirs_size) == 0,
             "no addresses");
      expect(mine.sin_addr.s_addr != theirs.sin_addr.s_addr,
             "both ends have one address: the test needs two");
      int bytes = 0;
      socklen_t size = sizeof(bytes);
      expect(::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &size) == 0,
             "getsockopt");
      expect(bytes == expected, "channel " + std::to_string(channel) +
                                    ": SO_SNDBUF is " + std::to_string(bytes) +
                                    ", not " + std::to_string(expected));
    }
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}
