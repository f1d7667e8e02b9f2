#include "backends/shm/local_peers.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <string_view>

#include "backends/shm/kernel_copy.h"
#include "libcomm/detail/log.h"
#include "libcomm/detail/memfd.h"
#include "libcomm/enum_param.h"
#include "libcomm/error.h"
#include "libcomm/int_param.h"
#include "libcomm/optional_int_param.h"
#include "store/watched_wait.h"

namespace comm::shm {
namespace {

const EnumParam kTransport{
    "COMM_TRANSPORT",
    {"auto", "tcp", "shm"},
    "auto",
    "how CPU ranks on one host talk: shared memory (auto, shm) or TCP"};
const OptionalIntParam kRingBytes{
    "COMM_SHM_RING_BYTES",
    "262144, less past 64 local peers: the largest power of two that keeps "
    "a rank's rings within 32 MiB, at least 16384",
    4096, 1 << 30,
    "bytes of each shared-memory ring between two ranks of one host, "
    "rounded down to a power of two"};
const IntParam kSingleCopy{
    "COMM_SHM_SINGLE_COPY", 1, 0, 1,
    "1 lets ranks of one host read each other's buffers in large "
    "collectives (process_vm_readv); 0 keeps every byte on the rings"};

const IntParam kMembarrier{
    "COMM_SHM_MEMBARRIER", 1, 0, 1,
    "1 lets ranks of one host that do not outnumber their CPUs (nor do the "
    "group's ranks on the machine) publish on the rings without a fence, a "
    "rank going to sleep paying with a membarrier system call instead; 0 "
    "keeps the fences"};

// Where a rank's local peers find the name of its abstract socket (hex),
// or, where it failed before it had one, kFailedInbox and its reason.
std::string inbox_key(int rank) { return "shm/inbox/" + std::to_string(rank); }
constexpr const char* kFailedInbox = "failed: ";

constexpr std::uint32_t kHelloMagic = 0x4d484d43;  // "CMHM" in memory

// The datagram that carries a rank's segment and doorbells to a peer; the
// descriptors travel beside it (SCM_RIGHTS).
struct Hello {
  std::uint32_t magic = kHelloMagic;
  std::int32_t rank = 0;
  std::int32_t size = 0;
  std::uint32_t flags = 0;  // kHelloWaiterBarrier
  std::uint64_t job = 0;
  std::uint64_t ring_bytes = 0;     // the capacity of each ring of the segment
  std::uint64_t probe_address = 0;  // where the sender's probe word lies
};
// The sender registered for waiter barriers (shm::enable_waiter_barrier).
constexpr std::uint32_t kHelloWaiterBarrier = 1;
// The memfd, the doorbells, then a pidfd of the sender's own process: the
// receiver watches that one rather than open a pidfd for the pid in the
// datagram's credentials, which could by then be another process's.
constexpr int kHelloDescriptors = 1 + kLanes + 1;
// A segment's layout: its owner's offer word on the first page, then the
// kLanes rings of each local peer in rank order, together and padded to
// whole pages. So a peer maps only that first page and the pages of its
// own rings: each rank maps O(ring x local peers) in all, where mapping
// whole segments would be O(ring x local peers^2).
struct SegmentLayout {
  explicit SegmentLayout(std::size_t capacity)
      : page(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))),
        stride((kLanes * ring_footprint(capacity) + page - 1) / page * page) {}
  // The bytes of a segment with rings for `writers` peers.
  std::size_t bytes(std::size_t writers) const {
    return page + writers * stride;
  }
  // Where the rings of the peer in slot `slot` start.
  std::size_t rings_of(std::size_t slot) const { return page + slot * stride; }

  std::size_t page;
  std::size_t stride;  // a peer's rings, padded to pages
};

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string namespace_inode(const char* path) {
  struct stat info {};
  if (::stat(path, &info) != 0) return "?";
  return std::to_string(info.st_ino);
}

std::string to_hex(const void* data, std::size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (std::size_t i = 0; i < size; ++i) {
    const auto byte = static_cast<const std::uint8_t*>(data)[i];
    text += digits[byte >> 4];
    text += digits[byte & 15];
  }
  return text;
}

std::string from_hex(const std::string& text) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < text.size(); i += 2) {
    bytes += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
  }
  return bytes;
}

// The word rank `rank` of group `job` publishes for its peers to read: one
// that a read of the wrong process or address is unlikely to find.
std::uint64_t probe_value(std::uint64_t job, int rank) {
  return (job ^ 0x9e3779b97f4a7c15ULL) * 0x100000001b3ULL +
         static_cast<std::uint64_t>(rank);
}

int remaining_ms(detail::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - detail::Clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Closes the descriptors a datagram carried, when it is refused.
void close_carried(msghdr& message) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
       c = CMSG_NXTHDR(&message, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      ::close(fd);
    }
  }
}

// The CPUs this process may run on, as the hex digits of a bit mask (CPU 0
// is bit 0 of the last digit).
std::string cpu_mask_hex() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return "";
  std::string digits;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu += 4) {
    int digit = 0;
    for (int bit = 0; bit < 4; ++bit) {
      if (CPU_ISSET(cpu + bit, &set)) digit |= 1 << bit;
    }
    digits.insert(digits.begin(), "0123456789abcdef"[digit]);
  }
  const auto first = digits.find_first_not_of('0');
  return first == std::string::npos ? "0" : digits.substr(first);
}

// ORs the mask `hex` (cpu_mask_hex's form) into `cpus`; false when it is not
// such a mask.
bool add_cpu_mask(const std::string& hex, std::vector<bool>& cpus) {
  if (hex.empty()) return false;
  for (std::size_t i = 0; i < hex.size(); ++i) {
    const char c = hex[hex.size() - 1 - i];
    const auto at = std::string_view("0123456789abcdef").find(c);
    if (at == std::string_view::npos) return false;
    for (int bit = 0; bit < 4; ++bit) {
      if ((at >> bit & 1) == 0) continue;
      const std::size_t cpu = 4 * i + static_cast<std::size_t>(bit);
      if (cpus.size() <= cpu) cpus.resize(cpu + 1);
      cpus[cpu] = true;
    }
  }
  return true;
}

}  // namespace

Transport transport_choice() {
  const std::string& word = kTransport.get();
  if (word == "tcp") return Transport::kTcp;
  if (word == "shm") return Transport::kShm;
  return Transport::kAuto;
}

std::size_t ring_bytes_asked() {
  const std::optional<std::int64_t> asked = kRingBytes.get();
  return asked ? std::bit_floor(static_cast<std::size_t>(*asked)) : 0;
}

std::size_t ring_bytes(std::size_t asked, int local_peers) {
  if (asked != 0) return std::bit_floor(asked);
  constexpr std::size_t kMost = 256 << 10, kLeast = 16 << 10;
  const std::size_t rings =
      kLanes * static_cast<std::size_t>(std::max(local_peers, 1));
  return std::clamp(std::bit_floor(kDefaultRingsBytes / rings), kLeast, kMost);
}

namespace {

// The number after `key` in /proc/meminfo's form ("MemAvailable:  123 kB"),
// in bytes; 0 where there is none.
std::uint64_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  std::uint64_t value = 0;
  std::string unit;
  // Bounded by the file, a few dozen lines.
  while (in >> name >> value) {
    std::getline(in, unit);
    if (name == key) {
      return unit.find("kB") != std::string::npos ? value << 10 : value;
    }
  }
  return 0;
}

// The number after `key` at the start of a line of a cgroup's memory.stat
// ("file 123"); 0 where there is none.
std::uint64_t memory_stat(const std::string& dir, const std::string& key) {
  std::ifstream in(dir + "/memory.stat");
  std::string name;
  std::uint64_t value = 0;
  // Bounded by the file, a few dozen lines.
  while (in >> name >> value) {
    if (name == key) return value;
  }
  return 0;
}

// The lesser of two amounts of memory of which 0 means unknown: the known
// one where only one is.
std::uint64_t least_known(std::uint64_t a, std::uint64_t b) {
  return a == 0 ? b : b == 0 ? a : std::min(a, b);
}

// What `limit` leaves of a cgroup's memory after `charged` bytes, of which
// `cache` bytes are page cache of files less shared memory: the kernel
// reclaims that cache for new memory, so it does not count as used. At
// least 1, so that a cgroup at its limit reads as one with no room.
std::uint64_t room_under(std::uint64_t limit, std::uint64_t charged,
                         std::uint64_t cache) {
  const std::uint64_t used = charged > cache ? charged - cache : 0;
  return limit > used ? limit - used : 1;
}

// The room left under the cgroup v2 limits of `path` (from /proc/self/cgroup's
// "0::/path") and of every cgroup above it, the least of them, where the
// unified hierarchy is mounted at `root`; 0 where none sets one.
std::uint64_t cgroup_v2_room(const std::string& root, std::string path) {
  std::uint64_t room = 0;
  // Bounded by the path's depth.
  while (true) {
    const std::string dir = root + (path == "/" ? "" : path);
    const std::string max = read_first_line((dir + "/memory.max").c_str());
    const std::string current =
        read_first_line((dir + "/memory.current").c_str());
    if (!max.empty() && max != "max" && !current.empty()) {
      const std::uint64_t file = memory_stat(dir, "file");
      const std::uint64_t left =
          room_under(std::stoull(max), std::stoull(current),
                     file - std::min(file, memory_stat(dir, "shmem")));
      room = least_known(room, left);
    }
    if (path == "/") break;
    const auto slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return room;
}

// The room left under the cgroup v1 memory controller's limit for `path`
// (from /proc/self/cgroup's "N:memory:/path"), where the controller is
// mounted at `root`, whose memory.stat gives the least limit of it and the
// cgroups above it; 0 where none sets one. In a container the controller's
// root is the container's own cgroup, where `path` does not exist.
std::uint64_t cgroup_v1_room(const std::string& root, const std::string& path) {
  for (const std::string& dir : {root + path, root}) {
    const std::string usage =
        read_first_line((dir + "/memory.usage_in_bytes").c_str());
    if (usage.empty()) continue;
    const std::uint64_t limit = memory_stat(dir, "hierarchical_memory_limit");
    // No limit reads as the page counter's maximum, near 2^63.
    if (limit == 0 || limit >= (std::uint64_t{1} << 60)) return 0;
    const std::uint64_t cache = memory_stat(dir, "total_cache");
    return room_under(limit, std::stoull(usage),
                      cache - std::min(cache, memory_stat(dir, "total_shmem")));
  }
  return 0;
}

}  // namespace

std::uint64_t cgroup_room(const std::string& membership,
                          const std::string& root) {
  std::ifstream lines(membership);
  std::string line;
  std::uint64_t room = 0;
  // Bounded by the file, a line per hierarchy: "N:controllers:/path".
  while (std::getline(lines, line)) {
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (!path.starts_with('/')) continue;
    if (line.starts_with("0::")) {
      room = least_known(room, cgroup_v2_room(root, path));
    } else if (("," + controllers + ",").find(",memory,") !=
               std::string::npos) {
      room = least_known(room, cgroup_v1_room(root + "/memory", path));
    }
  }
  return room;
}

std::uint64_t available_memory() {
  std::uint64_t available = 0;
  try {
    available = least_known(meminfo_bytes("MemAvailable:"),
                            cgroup_room("/proc/self/cgroup", "/sys/fs/cgroup"));
  } catch (const std::exception&) {
    // A number that does not parse: unknown, as where nothing is readable.
  }
  return available;
}

bool rings_fit(std::uint64_t needed, std::uint64_t available) {
  return available == 0 || needed <= available / 2;
}

std::string host_identity() {
  return read_first_line("/proc/sys/kernel/random/boot_id") +
         " ipc:" + namespace_inode("/proc/self/ns/ipc") +
         " net:" + namespace_inode("/proc/self/ns/net") +
         " pid:" + namespace_inode("/proc/self/ns/pid");
}

std::size_t LocalPeers::writer_slot(int owner, int writer) const {
  auto local_index = [&](int r) {
    return static_cast<std::size_t>(
        std::lower_bound(local_ranks_.begin(), local_ranks_.end(), r) -
        local_ranks_.begin());
  };
  std::size_t slot = local_index(writer);
  if (slot > local_index(owner)) --slot;
  return slot;
}

std::vector<LocalPeers::Published> LocalPeers::read_published(
    Store& store, int size, detail::Clock::time_point deadline) const {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    keys.push_back("shm/host/" + std::to_string(r));
  }
  const auto timeout = std::chrono::milliseconds(remaining_ms(deadline) + 1);
  std::vector<Bytes> values;
  try {
    values = store.multi_get(keys, timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    throw TimeoutError("TCP backend: rank " + std::to_string(rank_) +
                       " timed out waiting for connections from rank(s) " +
                       missing + ", which never joined the group");
  }
  std::vector<Published> published;
  for (const Bytes& value : values) {
    // "transport identity pid N ring R memory M cpus MASK"
    std::string text = to_string(value);
    Published& p = published.emplace_back();
    const auto cpus_at = text.rfind(" cpus ");
    if (cpus_at != std::string::npos) {
      p.cpus = text.substr(cpus_at + 6);
      text.resize(cpus_at);
    }
    const auto memory_at = text.rfind(" memory ");
    if (memory_at != std::string::npos) {
      p.available = std::stoull(text.substr(memory_at + 8));
      text.resize(memory_at);
    }
    const auto ring_at = text.rfind(" ring ");
    if (ring_at != std::string::npos) {
      p.ring_asked = std::stoull(text.substr(ring_at + 6));
      text.resize(ring_at);
    }
    const auto pid_at = text.rfind(" pid ");
    p.choice = text.substr(0, text.find(' '));
    p.identity = text.substr(p.choice.size() + 1, pid_at - p.choice.size() - 1);
    p.pid = static_cast<pid_t>(std::stol(text.substr(pid_at + 5)));
  }
  return published;
}

HostPartition LocalPeers::partition(const std::vector<Published>& published) {
  // Each rank's host label: the lowest rank of its identity that did not
  // ask for tcp, or itself where it asked for tcp.
  std::map<std::string, int> first_of_identity;
  std::vector<int> labels;
  for (std::size_t r = 0; r < published.size(); ++r) {
    const int rank = static_cast<int>(r);
    labels.push_back(
        published[r].choice == "tcp"
            ? rank
            : first_of_identity.try_emplace(published[r].identity, rank)
                  .first->second);
  }
  return HostPartition(labels);
}

void LocalPeers::learn_hosts(const std::vector<Published>& published) {
  hosts_ = partition(published);
  hosts_known_ = true;
  // The boot id leads the identity; a rank that could not read it
  // published an empty one, and is on no known kernel.
  auto boot_id = [](const std::string& identity) {
    return identity.substr(0, identity.find(' '));
  };
  const std::string mine = boot_id(published[rank_].identity);
  for (std::size_t r = 0; r < published.size(); ++r) {
    peers_[r].same_kernel =
        !mine.empty() && boot_id(published[r].identity) == mine;
  }
}

void LocalPeers::read_hosts(Store& store, detail::Clock::time_point deadline) {
  if (!hosts_known_) {
    learn_hosts(read_published(store, hosts_.size(), deadline));
  }
  COMM_LOG_DEBUG("rank {}: the group's hosts are {}", rank_, hosts_.describe());
}

LocalPeers::LocalPeers(Store& store, int rank, int size, std::uint64_t job,
                       detail::Clock::time_point deadline)
    : rank_(rank), hosts_(size), peers_(static_cast<std::size_t>(size)) {
  try {
    set_up(store, size, job, deadline);
  } catch (...) {
    release();
    throw;
  }
}

void LocalPeers::set_up(Store& store, int size, std::uint64_t job,
                        detail::Clock::time_point deadline) {
  const int rank = rank_;
  Transport choice = transport_choice();
  std::string word = kTransport.get();
  // Liveness needs pidfds (Linux 5.3; a container's seccomp profile may
  // refuse them). Without them this rank says tcp, so that its peers agree.
  if (choice != Transport::kTcp) {
    own_pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
    if (own_pidfd_ < 0) {
      const int error = errno;
      if (choice == Transport::kShm) {
        throw SystemError(error,
                          "COMM_TRANSPORT=shm: pidfd_open, which shared "
                          "memory needs to notice a dead peer (Linux 5.3 or "
                          "later); use COMM_TRANSPORT=tcp");
      }
      COMM_LOG_WARN(
          "shared memory is off: pidfd_open failed ({}), so ranks on this "
          "host use TCP",
          std::strerror(error));
      choice = Transport::kTcp;
      word = "tcp";
    }
  }
  const std::string me = host_identity();
  // "transport identity pid P ring R memory M cpus MASK": a rank that says
  // tcp is local to nobody.
  store.set_string("shm/host/" + std::to_string(rank),
                   word + " " + me + " pid " + std::to_string(::getpid()) +
                       " ring " + std::to_string(ring_bytes_asked()) +
                       " memory " + std::to_string(available_memory()) +
                       " cpus " + cpu_mask_hex());
  // A rank that asked for tcp is local to nobody, and needs nobody's
  // identity now; the others read its word and treat it as remote. It
  // reads them once the mesh is connected (read_hosts), for the partition
  // into hosts.
  if (choice == Transport::kTcp) return;
  const std::vector<Published> published =
      read_published(store, size, deadline);
  learn_hosts(published);
  std::string remote;
  std::vector<std::string> strict;  // the ranks that asked for shm
  std::vector<bool> local_cpus;     // the union of the local ranks' CPUs
  std::vector<bool> kernel_cpus;    // ... and of those on this kernel
  int kernel_count = 0;             // the ranks on this kernel
  bool cpus_known = true;
  for (int r = 0; r < size; ++r) {
    const std::string& their_choice = published[r].choice;
    const std::string& identity = published[r].identity;
    if (identity != me || their_choice == "tcp") {
      remote += (remote.empty() ? "rank " : ", rank ") + std::to_string(r);
    }
    if (their_choice == "shm")
      strict.push_back("shm/read/" + std::to_string(r));
    peers_[r].pid = published[r].pid;
    peers_[r].local =
        identity == me && their_choice != "tcp" && choice != Transport::kTcp;
    if (peers_[r].local) {
      local_ranks_.push_back(r);
      cpus_known = add_cpu_mask(published[r].cpus, local_cpus) && cpus_known;
    }
    if (peers_[r].same_kernel) {
      ++kernel_count;
      cpus_known = add_cpu_mask(published[r].cpus, kernel_cpus) && cpus_known;
    }
  }
  // Every rank that asked for shm finds the same and fails alike; each
  // waits for the others to have read what they need, so that none loses
  // the store (which rank 0 may host) to a rank that failed first.
  auto refuse_shm = [&](const std::string& why) {
    store.set_string("shm/read/" + std::to_string(rank), "1");
    try {
      store.wait(strict, std::chrono::milliseconds(remaining_ms(deadline) + 1));
    } catch (const Error&) {
      // Failing anyway; the message says why.
    }
    throw InvalidArgument(why);
  };
  if (choice == Transport::kShm && !remote.empty()) {
    refuse_shm(
        "COMM_TRANSPORT=shm needs every rank on this host, but " + remote +
        " of rank " + std::to_string(rank) +
        "'s group run elsewhere (another boot id, or another IPC, network "
        "or PID namespace) or asked for COMM_TRANSPORT=tcp; use "
        "COMM_TRANSPORT=auto, which uses shared memory between the ranks of "
        "a host and TCP between hosts");
  }
  peers_[rank].local = false;  // never a link to itself
  local_count_ = static_cast<int>(local_ranks_.size());
  // Ranks in other network namespaces of this machine (containers, or
  // the tests' emulated hosts) compete for the same CPUs: a local rank
  // that spins may keep one of them off its CPU as surely as a local peer.
  const auto cpus_in = [](const std::vector<bool>& mask) {
    return static_cast<int>(std::count(mask.begin(), mask.end(), true));
  };
  oversubscribed_ = !cpus_known || local_count_ > cpus_in(local_cpus) ||
                    kernel_count > cpus_in(kernel_cpus);
  if (local_count_ <= 1) return;

  // This rank's segment: the rings its local peers write to it.
  const std::size_t writers = local_ranks_.size() - 1;
  const std::size_t capacity =
      ring_bytes(ring_bytes_asked(), static_cast<int>(writers));
  // Every local rank adds up the same: each one's rings as it asked, and
  // the least memory any of them found available, before any of them took
  // its share.
  std::uint64_t needed = 0;
  std::uint64_t available = 0;
  for (int r : local_ranks_) {
    needed += SegmentLayout(ring_bytes(published[r].ring_asked,
                                       static_cast<int>(writers)))
                  .bytes(writers);
    available = least_known(available, published[r].available);
  }
  if (!rings_fit(needed, available)) {
    const std::string what =
        "the rings of this host's " + std::to_string(local_count_) +
        " ranks would take " + std::to_string(needed >> 20) + " MiB (" +
        std::to_string(kLanes * writers) + " rings of " +
        std::to_string(capacity) + " bytes per rank), more than half of the " +
        std::to_string(available >> 20) + " MiB of memory available here";
    if (choice == Transport::kShm) {
      refuse_shm("COMM_TRANSPORT=shm: " + what +
                 "; set COMM_SHM_RING_BYTES lower, run fewer ranks on this "
                 "host, or use COMM_TRANSPORT=auto, which then uses TCP");
    }
    COMM_LOG_WARN(
        "shared memory is off: {}, so they use TCP (COMM_SHM_RING_BYTES lower, "
        "or fewer ranks on this host, keeps shared memory)",
        what);
    for (int r : local_ranks_) peers_[r].local = false;
    local_ranks_ = {rank};
    local_count_ = 1;
    return;
  }
  // Each peer is watched through the set-up (see "Liveness" in the
  // header) from here on, with a pidfd its hello replaces.
  for (int r : local_ranks_) {
    if (r == rank) continue;
    peers_[r].pidfd =
        static_cast<int>(::syscall(SYS_pidfd_open, peers_[r].pid, 0));
    if (peers_[r].pidfd >= 0) continue;
    const int error = errno;
    if (error == ESRCH) {
      throw PeerGone(r, "shared memory: rank " + std::to_string(r) + " (pid " +
                            std::to_string(peers_[r].pid) +
                            ") on this host exited before rank " +
                            std::to_string(rank) + " set up with it");
    }
    throw SystemError(error, "shared memory: pidfd_open of rank " +
                                 std::to_string(r) + " (pid " +
                                 std::to_string(peers_[r].pid) + ")");
  }
  const SegmentLayout layout(capacity);
  segment_bytes_ = layout.bytes(writers);
  // Closed on every way out: once the peers have it, their mappings and the
  // datagrams in flight hold the segment.
  struct Descriptor {
    int fd;
    ~Descriptor() {
      if (fd >= 0) ::close(fd);
    }
  } owned{static_cast<int>(
      ::syscall(SYS_memfd_create, "libcomm-shm", MFD_CLOEXEC))};
  const int memfd = owned.fd;
  if (memfd < 0) throw SystemError(errno, "shared memory: memfd_create");
  detail::size_memfd(memfd, segment_bytes_,
                     "shared memory: a segment for this rank's rings "
                     "(COMM_SHM_RING_BYTES, or COMM_TRANSPORT=tcp)");
  // MAP_POPULATE allocates and maps every page now, at group creation, so
  // that the first pass of each ring does not take a page fault per page on
  // both ends in the middle of a collective (see bench/README.md).
  segment_ = ::mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_POPULATE, memfd, 0);
  if (segment_ == MAP_FAILED) {
    const int error = errno;
    segment_ = nullptr;
    throw SystemError(error, "shared memory: mapping a segment");
  }
  offer_word_ = new (segment_) std::atomic<std::uint64_t>(0);
  for (auto& doorbell : doorbells_) doorbell = std::make_unique<Doorbell>();
  // Single copy is for groups whose every rank is local, so that a group's
  // algorithms never mix reads with sockets; every rank sees the same.
  const bool every_rank_local = local_count_ == size;
  const bool probing = every_rank_local && kSingleCopy.get() != 0;
  std::string refusal;  // why this rank cannot read some peer's memory
  probe_word_ = probe_value(job, rank);

  // An abstract socket (no file) with a name the kernel picks.
  detail::Socket inbox(
      ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!inbox.valid()) {
    throw SystemError(errno, "shared memory: socket(AF_UNIX)");
  }
  const int one = 1;
  ::setsockopt(inbox.fd(), SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // Binding with only the family asks the kernel for a fresh abstract name.
  socklen_t length = sizeof(sa_family_t);
  const bool bound =
      ::bind(inbox.fd(), reinterpret_cast<sockaddr*>(&address), length) == 0;
  length = sizeof(address);
  if (!bound || ::getsockname(inbox.fd(), reinterpret_cast<sockaddr*>(&address),
                              &length) != 0) {
    const int error = errno;
    throw SystemError(error, "shared memory: binding an abstract socket");
  }
  store.set_string(inbox_key(rank), to_hex(&address, length));

  Hello hello;
  hello.rank = rank;
  hello.size = size;
  hello.job = job;
  hello.ring_bytes = capacity;
  hello.probe_address = reinterpret_cast<std::uintptr_t>(&probe_word_);
  // Where ranks outnumber CPUs a waiting rank sleeps often, and a barrier
  // on the other CPUs before each sleep would cost more than the fences it
  // saves; the ranks of a host agree on that, and each ring uses waiter
  // barriers only when both of its ends registered.
  const bool waiter_barrier =
      !oversubscribed_ && kMembarrier.get() != 0 && enable_waiter_barrier();
  if (waiter_barrier) hello.flags |= kHelloWaiterBarrier;
  int carried[kHelloDescriptors] = {memfd, doorbells_[0]->fd(),
                                    doorbells_[1]->fd(), own_pidfd_};
  std::vector<int> unsent, unheard;
  std::vector<std::string> inboxes(static_cast<std::size_t>(size));
  for (int r : local_ranks_) {
    if (r == rank) continue;
    unsent.push_back(r);
    unheard.push_back(r);
    const std::string published_inbox =
        to_string(multi_get_watched(store, {inbox_key(r)}, deadline, [&] {
          throw_if_exited(local_ranks_, "waiting for its shared-memory inbox");
        })[0]);
    if (published_inbox.starts_with(kFailedInbox)) {
      // A failure that a local peer's death caused is reported as that
      // death.
      throw_if_exited(local_ranks_, "waiting for the inbox of rank " +
                                        std::to_string(r) +
                                        ", which failed to set up");
      throw PeerError(
          r, "shared memory: rank " + std::to_string(r) +
                 " on this host failed to set up: " +
                 published_inbox.substr(std::string_view(kFailedInbox).size()));
    }
    inboxes[r] = from_hex(published_inbox);
  }
  // Bounded by the deadline: each round sends what the peers' queues take,
  // reads what arrived, and sleeps in poll for at most 10 ms.
  while (!unsent.empty() || !unheard.empty()) {
    for (auto it = unsent.begin(); it != unsent.end();) {
      iovec body{&hello, sizeof(hello)};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(carried))] = {};
      msghdr message{};
      message.msg_name = inboxes[*it].data();
      message.msg_namelen = static_cast<socklen_t>(inboxes[*it].size());
      message.msg_iov = &body;
      message.msg_iovlen = 1;
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&message);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(carried));
      std::memcpy(CMSG_DATA(c), carried, sizeof(carried));
      if (::sendmsg(inbox.fd(), &message, MSG_DONTWAIT | MSG_NOSIGNAL) ==
          static_cast<ssize_t>(sizeof(hello))) {
        it = unsent.erase(it);
        continue;
      }
      // ETOOMANYREFS: the descriptors this user has in flight over Unix
      // sockets passed this process's limit; they leave as peers read.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
          errno != ETOOMANYREFS) {
        const int error = errno;
        // A peer's inbox closes as its process ends, a moment before its
        // pidfd says so, or as it fails the set-up, maybe because another
        // peer died: that one is the one to name.
        if (error == ECONNREFUSED) {
          pollfd end{peers_[*it].pidfd, POLLIN, 0};
          (void)::poll(&end, 1, std::min(1000, remaining_ms(deadline)));
          throw_if_exited(local_ranks_, "sending rank " + std::to_string(*it) +
                                            " its segment");
        }
        throw SystemError(error, "shared memory: sending rank " +
                                     std::to_string(rank) +
                                     "'s segment to "
                                     "rank " +
                                     std::to_string(*it));
      }
      ++it;
    }
    while (!unheard.empty()) {
      Hello theirs;
      iovec body{&theirs, sizeof(theirs)};
      alignas(cmsghdr) char
          control[CMSG_SPACE(sizeof(carried)) + CMSG_SPACE(sizeof(ucred))] = {};
      msghdr message{};
      message.msg_iov = &body;
      message.msg_iovlen = 1;
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      const ssize_t n = ::recvmsg(inbox.fd(), &message, MSG_CMSG_CLOEXEC);
      if (n < 0) break;
      int fds[kHelloDescriptors] = {-1, -1, -1, -1};
      bool have_fds = false;
      ucred sender{};
      bool have_sender = false;
      for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr;
           c = CMSG_NXTHDR(&message, c)) {
        if (c->cmsg_level != SOL_SOCKET) continue;
        if (c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len == CMSG_LEN(sizeof(fds))) {
          std::memcpy(fds, CMSG_DATA(c), sizeof(fds));
          have_fds = true;
        } else if (c->cmsg_type == SCM_CREDENTIALS) {
          std::memcpy(&sender, CMSG_DATA(c), sizeof(sender));
          have_sender = true;
        }
      }
      const bool expected = n == static_cast<ssize_t>(sizeof(theirs)) &&
                            (message.msg_flags & MSG_CTRUNC) == 0 && have_fds &&
                            have_sender && theirs.magic == kHelloMagic &&
                            theirs.job == job && theirs.size == size &&
                            std::find(unheard.begin(), unheard.end(),
                                      theirs.rank) != unheard.end() &&
                            sender.pid == peers_[theirs.rank].pid &&
                            theirs.ring_bytes >= 64 &&
                            theirs.ring_bytes <= (1ULL << 30) &&
                            std::has_single_bit(theirs.ring_bytes);
      if ((message.msg_flags & MSG_CTRUNC) != 0 &&
          n == static_cast<ssize_t>(sizeof(theirs)) &&
          theirs.magic == kHelloMagic && theirs.job == job && have_sender &&
          theirs.rank >= 0 && theirs.rank < size &&
          sender.pid == peers_[theirs.rank].pid) {
        // The kernel drops the descriptors a receiver has no room for.
        close_carried(message);
        throw SystemError(EMFILE, "shared memory: rank " +
                                      std::to_string(rank) +
                                      " receiving the segment of rank " +
                                      std::to_string(theirs.rank));
      }
      if (!expected) {
        COMM_LOG_WARN(
            "shared memory: rank {} dropped a datagram that is not a hello of "
            "its group (from pid {})",
            rank, have_sender ? sender.pid : 0);
        close_carried(message);
        continue;
      }
      Peer& peer = peers_[theirs.rank];
      struct stat info {};
      const SegmentLayout theirs_laid(theirs.ring_bytes);
      if (::fstat(fds[0], &info) != 0 ||
          static_cast<std::size_t>(info.st_size) < theirs_laid.bytes(writers)) {
        close_carried(message);
        throw BackendError("shared memory: rank " +
                           std::to_string(theirs.rank) +
                           " sent a segment smaller than its rings");
      }
      // Its first page, with its offer word, and this rank's rings.
      peer.offer_page =
          ::mmap(nullptr, theirs_laid.page, PROT_READ, MAP_SHARED, fds[0], 0);
      if (peer.offer_page != MAP_FAILED) {
        peer.offer_page_bytes = theirs_laid.page;
        peer.rings_bytes = theirs_laid.stride;
        peer.rings = ::mmap(nullptr, theirs_laid.stride, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_POPULATE, fds[0],
                            static_cast<off_t>(theirs_laid.rings_of(
                                writer_slot(theirs.rank, rank))));
      }
      const int map_error = errno;
      ::close(fds[0]);
      if (peer.offer_page == MAP_FAILED || peer.rings == MAP_FAILED) {
        if (peer.offer_page == MAP_FAILED) peer.offer_page = nullptr;
        if (peer.rings == MAP_FAILED) peer.rings = nullptr;
        close_fd(fds[1]);
        close_fd(fds[2]);
        close_fd(fds[3]);
        throw SystemError(map_error, "shared memory: mapping rank " +
                                         std::to_string(theirs.rank) +
                                         "'s segment");
      }
      peer.offer_word =
          static_cast<const std::atomic<std::uint64_t>*>(peer.offer_page);
      // The collective lane only: the point-to-point thread sleeps as soon
      // as nothing moves, so each of its sleeps would cost a membarrier.
      const bool both_registered =
          waiter_barrier && (theirs.flags & kHelloWaiterBarrier) != 0;
      for (int lane = 0; lane < kLanes; ++lane) {
        const Waking waking = both_registered && lane == 0
                                  ? Waking::kWaiterBarrier
                                  : Waking::kFenced;
        peer.doorbells[lane] = fds[1 + lane];
        const std::size_t lane_at =
            static_cast<std::size_t>(lane) * ring_footprint(theirs.ring_bytes);
        peer.out[lane] = Ring(static_cast<std::uint8_t*>(peer.rings) + lane_at,
                              theirs.ring_bytes, peer.doorbells[lane], waking);
        peer.in[lane] =
            Ring(static_cast<std::uint8_t*>(segment_) +
                     layout.rings_of(writer_slot(rank, theirs.rank)) +
                     static_cast<std::size_t>(lane) * ring_footprint(capacity),
                 capacity, peer.doorbells[lane], waking);
      }
      // The peer's own pidfd replaces the one that watched its set-up.
      close_fd(peer.pidfd);
      peer.pidfd = fds[3];
      if (probing && refusal.empty()) {
        std::uint64_t probe = 0;
        const int error = read_memory(theirs.rank, theirs.probe_address, &probe,
                                      sizeof(probe));
        if (error != 0) {
          refusal = "process_vm_readv of rank " + std::to_string(theirs.rank) +
                    " (pid " + std::to_string(peer.pid) +
                    ") failed: " + std::strerror(error);
        } else if (probe != probe_value(job, theirs.rank)) {
          refusal = "process_vm_readv of rank " + std::to_string(theirs.rank) +
                    " (pid " + std::to_string(peer.pid) +
                    ") read another word than the one it published";
        }
      }
      std::erase(unheard, theirs.rank);
    }
    if (unsent.empty() && unheard.empty()) break;
    if (detail::Clock::now() >= deadline) {
      std::string missing;
      for (int r : unheard) {
        missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(r);
      }
      throw TimeoutError(
          "shared memory: rank " + std::to_string(rank) +
          " timed out setting up with " +
          (missing.empty() ? std::string("its local peers") : missing) +
          " on this host");
    }
    // The inbox, and every peer's pidfd: a peer that dies ends the set-up.
    std::vector<pollfd> entries{{inbox.fd(), POLLIN, 0}};
    for (int r : local_ranks_) {
      if (r != rank) entries.push_back({peers_[r].pidfd, POLLIN, 0});
    }
    (void)::poll(
        entries.data(), entries.size(),
        std::min(unsent.empty() ? 1 << 30 : 10, remaining_ms(deadline)));
    throw_if_exited(local_ranks_, "trading segments with its local peers");
  }
  COMM_LOG_DEBUG(
      "shared memory: rank {} shares {} rings of {} bytes with {} "
      "local ranks",
      rank, kLanes * writers, capacity, writers);
  if (every_rank_local) {
    if (probing && !refusal.empty()) {
      COMM_LOG_WARN(
          "shared memory: rank {} cannot read its peers' memory ({}), so "
          "large collectives copy through the rings (COMM_SHM_SINGLE_COPY=0 "
          "chooses that without this warning)",
          rank, refusal);
    }
    agree_on_single_copy(store, size, probing && refusal.empty(), deadline);
  }
}

void LocalPeers::agree_on_single_copy(Store& store, int size, bool able,
                                      detail::Clock::time_point deadline) {
  // "0": this rank cannot read its peers' memory (or will not); "1": it
  // can; "2": it can, and its kernel's copy keeps up (kernel_copy.h).
  const char* mine = !able ? "0" : kernel_copy_keeps_up_here() ? "2" : "1";
  store.set_string("shm/copy/" + std::to_string(rank_), mine);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r)
    keys.push_back("shm/copy/" + std::to_string(r));
  std::vector<Bytes> said;
  try {
    said = multi_get_watched(store, keys, deadline, [&] {
      throw_if_exited(local_ranks_,
                      "waiting for its word on reading each other's memory");
    });
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r = 0; r < size; ++r) {
      if (!store.check({keys[r]})) {
        missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(r);
      }
    }
    throw TimeoutError("shared memory: rank " + std::to_string(rank_) +
                       " timed out waiting for " + missing +
                       " to finish setting up shared memory");
  }
  single_copy_ = std::all_of(said.begin(), said.end(), [](const Bytes& word) {
    return to_string(word) != "0";
  });
  kernel_copy_keeps_up_ =
      std::all_of(said.begin(), said.end(),
                  [](const Bytes& word) { return to_string(word) == "2"; });
  if (able && !single_copy_) {
    COMM_LOG_DEBUG(
        "shared memory: rank {} reads no peer's memory: another rank cannot, "
        "or does not want to (COMM_SHM_SINGLE_COPY)",
        rank_);
  }
}

bool LocalPeers::exited(int peer) const {
  const int fd = peers_[peer].pidfd;
  if (fd < 0) return false;  // this rank itself
  pollfd entry{fd, POLLIN, 0};
  return ::poll(&entry, 1, 0) == 1;
}

void LocalPeers::throw_if_exited(std::span<const int> peers,
                                 const std::string& doing) const {
  std::vector<pollfd> ends;
  std::vector<int> watched;
  for (int peer : peers) {
    if (peer == rank_ || !peers_[peer].local || peers_[peer].pidfd < 0) {
      continue;
    }
    ends.push_back({peers_[peer].pidfd, POLLIN, 0});
    watched.push_back(peer);
  }
  int ended;
  do {
    ended = ::poll(ends.data(), ends.size(), 0);
  } while (ended < 0 && errno == EINTR);
  if (ended <= 0) return;
  for (std::size_t i = 0; i < ends.size(); ++i) {
    if (ends[i].revents == 0) continue;
    const int peer = watched[i];
    throw PeerGone(peer, "shared memory: rank " + std::to_string(peer) +
                             " (pid " + std::to_string(peers_[peer].pid) +
                             ") on this host exited while rank " +
                             std::to_string(rank_) + " was " + doing);
  }
}

int LocalPeers::read_memory(int peer, std::uint64_t address, void* into,
                            std::size_t bytes) const {
  auto* target = static_cast<std::uint8_t*>(into);
  const pid_t pid = peer == rank_ ? ::getpid() : peers_[peer].pid;
  std::size_t done = 0;
  // Bounded: every round reads bytes or returns (a read may stop short, at
  // an unmapped page or at the kernel's limit on one call).
  while (done < bytes) {
    const iovec local{target + done, bytes - done};
    const iovec remote{
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(address + done)),
        bytes - done};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EFAULT;
      return exited(peer) ? ESRCH : error;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

int LocalPeers::offered(std::span<const int> peers, std::uint64_t sequence,
                        int& failed) const {
  // Bounded by `peers`, taken kBatch at a time so that the poll list
  // lives on the stack.
  constexpr std::size_t kBatch = 64;
  for (std::size_t first = 0; first < peers.size(); first += kBatch) {
    const std::span<const int> batch =
        peers.subspan(first, std::min(kBatch, peers.size() - first));
    // The buffers were read before these words: a peer that withdrew only
    // after it was read had not left the call when its buffers were read.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::array<std::uint64_t, kBatch> words{};
    std::array<pollfd, kBatch> ends{};
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const int peer = batch[i];
      const std::atomic<std::uint64_t>* offer =
          peer == rank_ ? offer_word_ : peers_[peer].offer_word;
      if (offer == nullptr) {  // released
        failed = peer;
        return ESRCH;
      }
      words[i] = offer->load(std::memory_order_acquire);
      // A negative descriptor (this rank's own) is one poll skips.
      ends[i] = {peers_[peer].pidfd, POLLIN, 0};
    }
    // A peer that ended leaves its word as it was, and the reads before
    // may have reached another process that took its id: only a peer that
    // still lives now was the process read.
    int ended;
    do {
      ended = ::poll(ends.data(), batch.size(), 0);
    } while (ended < 0 && errno == EINTR);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const int error = ended > 0 && ends[i].revents != 0 ? ESRCH
                        : words[i] != sequence + 1        ? ECANCELED
                                                          : 0;
      if (error != 0) {
        failed = batch[i];
        return error;
      }
    }
  }
  return 0;
}

std::uint8_t* LocalPeers::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void LocalPeers::close_all() {
  for (Peer& peer : peers_) {
    if (!peer.local) continue;
    for (int lane = 0; lane < kLanes; ++lane) {
      peer.out[lane].close();
      peer.in[lane].close();
    }
  }
}

LocalPeers::~LocalPeers() { release(); }

void LocalPeers::publish_failure(Store& store, int rank,
                                 const std::string& why) noexcept {
  try {
    // Only this rank sets its key, so what is there is its inbox, which
    // its peers may have read already.
    if (!store.check({inbox_key(rank)})) {
      store.set_string(inbox_key(rank), kFailedInbox + why);
    }
  } catch (const std::exception&) {
    // The store is gone: the peers fail on it too.
  }
}

void LocalPeers::unmap_blocks(Peer& peer) {
  for (const MappedBlock& block : peer.mapped) {
    ::munmap(const_cast<std::uint8_t*>(block.data), block.bytes);
  }
  peer.mapped.clear();
}

const std::uint8_t* LocalPeers::map_block(int peer_rank,
                                          const SharedHostBlock& block,
                                          std::uint64_t blocks_freed,
                                          int& error) {
  error = 0;
  Peer& peer = peers_[peer_rank];
  if (peer.mapping_refused) return nullptr;
  if (blocks_freed != peer.blocks_freed) {
    // Some block of the peer's was freed since these were mapped: which
    // one, this rank cannot tell, and a mapping keeps its pages alive.
    unmap_blocks(peer);
    peer.blocks_freed = blocks_freed;
  }
  for (auto it = peer.mapped.begin(); it != peer.mapped.end(); ++it) {
    if (it->serial != block.serial) continue;
    // A block of another size under the same serial is none that this
    // peer's libcomm sent: read it through the kernel, which checks it.
    if (it->bytes != block.bytes) return nullptr;
    const MappedBlock found = *it;
    peer.mapped.erase(it);
    peer.mapped.push_back(found);
    return found.data;
  }
  const int fd = static_cast<int>(
      ::syscall(SYS_pidfd_getfd, peer.pidfd, static_cast<int>(block.fd), 0));
  if (fd < 0) {
    const int cause = errno;
    if (exited(peer_rank)) {
      error = ESRCH;
    } else if (cause == EBADF) {
      error = EFAULT;
    } else if (cause == EPERM || cause == EACCES || cause == ENOSYS) {
      // The kernel's policy, which will not change while the group lives.
      peer.mapping_refused = true;
      COMM_LOG_INFO(
          "shared memory: rank {} cannot duplicate the descriptors of rank "
          "{} (pidfd_getfd: {}), so it reads that rank's shared host memory "
          "with process_vm_readv",
          rank_, peer_rank, std::strerror(cause));
    }
    // Otherwise (out of descriptors, say) this read goes through the
    // kernel, and the next tries again.
    return nullptr;
  }
  // The block's memfd, sealed at its size, and no other file that the
  // descriptor's number may have come to name.
  struct stat status {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  const bool same = ::fstat(fd, &status) == 0 && status.st_ino == block.inode &&
                    static_cast<std::uint64_t>(status.st_size) == block.bytes &&
                    seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
  void* data = same ? ::mmap(nullptr, block.bytes, PROT_READ, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
  ::close(fd);
  if (!same) {
    error = exited(peer_rank) ? ESRCH : EFAULT;
    return nullptr;
  }
  // Out of address space or of mappings: read through the kernel.
  if (data == MAP_FAILED) return nullptr;
  if (peer.mapped.size() >= kMappedBlocksPerPeer) {
    const MappedBlock& oldest = peer.mapped.front();
    ::munmap(const_cast<std::uint8_t*>(oldest.data), oldest.bytes);
    peer.mapped.erase(peer.mapped.begin());
  }
  peer.mapped.push_back(
      {block.serial, static_cast<const std::uint8_t*>(data), block.bytes});
  return static_cast<const std::uint8_t*>(data);
}

void LocalPeers::release() {
  close_all();
  for (Peer& peer : peers_) {
    unmap_blocks(peer);
    if (peer.rings != nullptr) ::munmap(peer.rings, peer.rings_bytes);
    if (peer.offer_page != nullptr) {
      ::munmap(peer.offer_page, peer.offer_page_bytes);
    }
    for (int& fd : peer.doorbells) close_fd(fd);
    close_fd(peer.pidfd);
  }
  close_fd(own_pidfd_);
  offer_word_ = &unshared_offer_;
  if (segment_ != nullptr) ::munmap(segment_, segment_bytes_);
  segment_ = nullptr;
  for (Peer& peer : peers_) peer = Peer{};
}

}  // namespace comm::shm
