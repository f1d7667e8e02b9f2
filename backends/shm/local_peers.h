// comm::shm::LocalPeers: the shared-memory links of one rank to the ranks
// of its group that run on the same host, set up through the group's Store.
//
// Locality. Every rank publishes its host identity: the kernel's boot id
// and the inodes of its IPC, network and PID namespaces (a rank in another
// network namespace counts as another host, which is also how the tests
// emulate two hosts), with its process id, its COMM_TRANSPORT and the CPUs
// it may run on. Two ranks are local to each other when their identities
// are equal and neither asked for `tcp`; the relation is symmetric, so both
// ends agree.
// Every rank, `tcp` ones included (read_hosts), reads every rank's
// identity, so that every rank knows the same partition of the whole group
// into hosts (hosts()), for the hierarchical algorithms: the classes of
// that relation, a rank that asked for `tcp` being a host of its own.
//
// Memory. Each rank makes one memfd (never a file: nothing is left in
// /dev/shm or elsewhere when a rank dies) holding the rings its local
// peers write to it: kLanes rings per local peer of ring_bytes() each, so
// a rank's segment is O(ring x local peers), and by default holds no more
// than 32 MiB of ring data up to 1,024 local peers (the rings shrink past
// 64). Each rank
// publishes the ring size it asked for and the memory it found available
// before any rank of the group makes its segment, so every local rank
// adds up the same total for the host; where the rings would take more
// than half of that memory, a rank that asked for shm fails with
// InvalidArgument saying so, and the others use TCP, with a warning,
// rather than have the kernel kill processes to find it. It passes the memfd,
// with an eventfd doorbell per lane, to each local peer in one datagram
// over an abstract Unix-domain socket (SCM_RIGHTS; the kernel adds the
// sender's credentials, which must match the published process id). Each
// peer maps it and closes the descriptor, so the memory lives exactly as
// long as a rank has it mapped.
//
// Liveness. A pidfd per local peer becomes readable when that process
// ends, however it ends. Each peer sends its own beside its segment, so
// that it is the peer's, where a pidfd opened for the pid its datagram
// came from could be that of a process that took the pid since the peer
// died. A rank that destroys its links while its process
// lives closes every ring it shares instead. Both are what a closed socket
// is to the TCP channels. Until a peer's own pidfd arrives, one opened
// from the pid the peer published moments before watches it, so that the
// set-up's waits (for the peer's inbox, its segment, its word on single
// copy, and the mesh's connections after them: throw_if_exited) end with
// a PeerError naming a peer that died, rather than at the deadline. Only
// a peer that died and whose pid another process took before this rank
// opened it escapes that watch; once it has published its address, the
// mesh finds it as it finds a rank of another host (tcp/mesh.h,
// "Liveness during the set-up").
//
// Single copy. Where every rank of the group is local, each rank also
// tries to read a word that each peer published the address of
// (process_vm_readv, which needs the same user and no ptrace restriction
// such as Yama's or a seccomp profile's), and publishes whether every read
// gave the word; the group reads its peers' memory (read_memory) only when
// every rank says yes, so that all ranks choose the same algorithms. A
// refusal costs one log line and leaves every byte on the rings.
// COMM_SHM_SINGLE_COPY=0 turns it off. With the same word each rank says
// whether the kernel's copy keeps up with memcpy here (kernel_copy.h), and
// the group counts it as keeping up only when every rank says so.
//
// Offering. A rank whose buffers its peers may read in a collective says
// so in a word of its segment (offer) until it leaves the call (withdraw),
// and a reader checks that word after it read (offered), with a load from
// its mapping of the segment rather than a system call: a rank that
// fails leaves its call without waiting for its readers, and its caller
// may then free or rewrite the buffers, so what was read from a rank that
// no longer offers them is never taken for its data.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/host_partition.h"
#include "backends/shm/doorbell.h"
#include "backends/shm/ring.h"
#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "libcomm/shared_host_memory.h"
#include "store/store.h"

namespace comm::shm {

// The independent byte streams between two local ranks: lane 0 carries
// collectives, lane 1 point-to-point messages (as the TCP channels do).
inline constexpr int kLanes = 2;

// A PeerError that says the peer's process has gone: it exited (its
// pidfd said so), or it closed its connection during the set-up with no
// reason posted. The set-up reports it to the other ranks as the peer's
// death, which they name it for; any other PeerError travels as a reason.
class PeerGone : public PeerError {
 public:
  using PeerError::PeerError;
};

// What COMM_TRANSPORT asks for.
enum class Transport { kAuto, kTcp, kShm };
Transport transport_choice();
// The data bytes of each ring a rank owns that has `local_peers` local
// peers and asked for `asked` (COMM_SHM_RING_BYTES, or 0 where unset): a
// power of two, `asked` rounded down, or by default 256 KiB where the
// rank's 2 x local_peers rings take no more than kDefaultRingsBytes, else
// the largest power of two that keeps them within it, but at least 16 KiB.
inline constexpr std::size_t kDefaultRingsBytes = std::size_t{32} << 20;
std::size_t ring_bytes(std::size_t asked, int local_peers);
// What this process's COMM_SHM_RING_BYTES asks for, or 0 where it is unset.
std::size_t ring_bytes_asked();

// The memory this process may still take, in bytes: the kernel's estimate
// of what it can give without swapping (MemAvailable), or less where a
// memory cgroup (v1 or v2) of this process limits it, its reclaimable
// page cache not counted as used; 0 where none can be read.
std::uint64_t available_memory();
// What the memory cgroups listed in `membership` (/proc/self/cgroup's form)
// let a process take before the lowest of their limits, v1 or v2 (a hybrid
// host may have both), with the cgroup file systems under `root`
// (/sys/fs/cgroup, v1 controllers in directories of their names); 0 where
// none sets one or none can be read. Unparsable numbers throw.
std::uint64_t cgroup_room(const std::string& membership,
                          const std::string& root);
// Whether rings of `needed` bytes in all fit in `available` bytes of a
// host's memory (0: unknown, and so they fit): they take at most half,
// leaving the rest to the ranks' own buffers.
bool rings_fit(std::uint64_t needed, std::uint64_t available);

// This process's host identity as published (boot id and namespaces; the
// process id is not part of it).
std::string host_identity();

class LocalPeers {
 public:
  // Publishes this rank's identity under "shm/" in `store`, reads every
  // other rank's, and sets up shared memory with the local ones. `job`
  // tells this group's datagrams from any other's. Throws InvalidArgument
  // when COMM_TRANSPORT=shm and some rank is not local (naming it),
  // PeerError naming a local rank whose process ended or that failed to set
  // up (see publish_failure), and TimeoutError naming the local ranks not
  // heard from by `deadline`.
  LocalPeers(Store& store, int rank, int size, std::uint64_t job,
             detail::Clock::time_point deadline);
  // Closes every ring (waking the peers), then unmaps and closes.
  ~LocalPeers();
  // Tells the local peers of rank `rank`, which wait for it while they set
  // up, that it failed to and why, where it has not yet told them where to
  // reach it: they fail at once with a PeerError carrying `why`, rather
  // than at the set-up's deadline. The caller of the constructor calls it
  // when that throws; it never throws itself.
  static void publish_failure(Store& store, int rank,
                              const std::string& why) noexcept;
  LocalPeers(const LocalPeers&) = delete;
  LocalPeers& operator=(const LocalPeers&) = delete;

  bool is_local(int peer) const { return peers_[peer].local; }
  // The ranks local to this one, this one included, in order.
  const std::vector<int>& local_ranks() const { return local_ranks_; }
  // The ranks local to this one, itself included.
  int local_count() const { return local_count_; }
  // Whether this host's ranks of the group outnumber the CPUs they may run
  // on together (each rank publishes its affinity mask), or the group's
  // ranks on this machine's kernel (in this host's namespaces and in
  // others: containers, or emulated hosts) outnumber theirs, so that a
  // rank waiting for another may be keeping it, or a rank of another
  // namespace that it waits for through TCP, off its CPU. Every local rank
  // computes the same answer.
  bool oversubscribed() const { return oversubscribed_; }
  // Reads what every rank published, where set-up did not (a rank that
  // asked for tcp reads nothing then, so that it waits for no one before
  // the mesh connects), for hosts(). Called once the mesh is connected:
  // every rank publishes its identity before its address, so nothing is
  // waited for then. Throws TimeoutError naming the ranks that published
  // nothing by `deadline`.
  void read_hosts(Store& store, detail::Clock::time_point deadline);
  // The whole group's hosts, the same on every rank (after read_hosts):
  // ranks share a host where they published the same identity and neither
  // asked for tcp, whether or not their rings fit (see "Memory" above).
  const HostPartition& hosts() const { return hosts_; }
  // Whether `peer` runs on this rank's kernel (the same boot id), local
  // or not: in another network namespace of this machine, a container
  // joined to this one by a veth pair or a bridge, or this rank's own
  // host. TCP between the two then never leaves this machine's memory.
  // Known after read_hosts.
  bool same_kernel(int peer) const { return peers_[peer].same_kernel; }

  // This rank's end of the ring to `peer` (writer) and from `peer`
  // (reader) on `lane`; peer must be local.
  Ring& outgoing(int peer, int lane) { return peers_[peer].out[lane]; }
  Ring& incoming(int peer, int lane) { return peers_[peer].in[lane]; }
  // The doorbell this rank sleeps on while waiting on `lane`.
  const Doorbell& doorbell(int lane) const { return *doorbells_[lane]; }
  // Readable once `peer`'s process has ended.
  int pidfd(int peer) const { return peers_[peer].pidfd; }
  // Throws PeerError naming the first rank of `peers` that is local and
  // whose process has ended, saying that this rank was `doing` ("waiting
  // for its address") when it found out; returns where none has. One poll.
  void throw_if_exited(std::span<const int> peers,
                       const std::string& doing) const;
  pid_t pid(int peer) const { return peers_[peer].pid; }

  // Whether every rank of the group is local and every one of them can
  // read every other's memory (see "Single copy" above); the same answer
  // on every rank of the group.
  bool single_copy() const { return single_copy_; }
  // Where single_copy(): whether every rank found that the kernel's copy
  // between processes keeps up with memcpy on this host (kernel_copy.h),
  // which decides where the collectives read each other's buffers
  // (backends/tcp/single_copy.h); the same answer on every rank of the
  // group.
  bool kernel_copy_keeps_up() const { return kernel_copy_keeps_up_; }
  // Copies `bytes` at `address` in rank `peer`'s process into `into`
  // (process_vm_readv); `peer` is local, or this rank. Returns 0, or the
  // errno of the failure: ESRCH when the peer's process has ended (its
  // pidfd says so), EPERM or ENOSYS where the kernel refuses, EFAULT where
  // the range is not mapped in the peer. A read that succeeded copied the
  // peer's memory only if the peer had not ended by then: after that its
  // id may be another process's (offered() checks).
  int read_memory(int peer, std::uint64_t address, void* into,
                  std::size_t bytes) const;
  // Where `block` of shared host memory (libcomm/shared_host_memory.h) of
  // `peer` (local, not this rank) lies in this process: mapped read-only
  // at its first use, through a duplicate of the peer's descriptor
  // (pidfd_getfd), and kept while the peer has freed no block since
  // (`blocks_freed`, as the peer counted when it offered the block), up to
  // kMappedBlocksPerPeer blocks, the least recently used unmapped first.
  // Returns the block's first byte, or null with `error` set: ESRCH when
  // the peer's process has ended, EFAULT when the peer's descriptor is no
  // longer the block's (the peer left the call and freed it), or 0 where
  // the kernel refuses to duplicate the descriptor (an older kernel, or a
  // stricter ptrace policy than process_vm_readv meets; read_memory then
  // reads the block, and this peer's blocks are not asked for again).
  const std::uint8_t* map_block(int peer, const SharedHostBlock& block,
                                std::uint64_t blocks_freed, int& error);
  static constexpr std::size_t kMappedBlocksPerPeer = 64;

  // This rank's buffers are readable in collective `sequence`, until
  // withdraw(). Both are stores to a word that the peers read, and are
  // made before the buffers' addresses are sent and before a rank that
  // leaves the call lets anything free or rewrite them; the fence keeps
  // the caller's later writes to the buffers after the withdrawal on
  // every architecture, as a reader's fence keeps its reads before its
  // look at the word.
  void offer(std::uint64_t sequence) { offer_word_->store(sequence + 1); }
  void withdraw() {
    offer_word_->store(0);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  // Whether every rank in `peers` (local, or this rank) offers its
  // buffers in collective `sequence` and its process lives: 0 when all
  // do; otherwise ECANCELED when one does not offer them (any more) or
  // ESRCH when one has ended, with `failed` set to the first such rank in
  // `peers`. Asked after reading, a yes means that the reads copied the
  // peers' memory while they were still in the call. Each word is a load;
  // the liveness of every peer is one poll.
  int offered(std::span<const int> peers, std::uint64_t sequence,
              int& failed) const;
  // Scratch memory of `bytes` or more, kept until the next call.
  std::uint8_t* scratch(std::size_t bytes);

  // Closes every ring in both directions and wakes the peers, so that
  // their waits end with an error (as shutting a socket down does).
  void close_all();

 private:
  // A block of a peer's shared host memory mapped in this process.
  struct MappedBlock {
    std::uint64_t serial = 0;
    const std::uint8_t* data = nullptr;
    std::size_t bytes = 0;
  };

  struct Peer {
    bool local = false;
    bool same_kernel = false;
    pid_t pid = 0;
    int pidfd = -1;
    std::array<int, kLanes> doorbells{-1, -1};  // the peer's, duplicated
    // Of the peer's segment, this rank maps the first page, which holds
    // the peer's offer word (see offer()), and its own rings.
    void* offer_page = nullptr;
    std::size_t offer_page_bytes = 0;
    void* rings = nullptr;
    std::size_t rings_bytes = 0;
    const std::atomic<std::uint64_t>* offer_word = nullptr;
    std::array<Ring, kLanes> out;
    std::array<Ring, kLanes> in;
    // The peer's blocks of shared host memory that this rank maps, the
    // most recently used last; the peer's count of freed blocks when they
    // were mapped; and whether the kernel refused to duplicate its
    // descriptors.
    std::vector<MappedBlock> mapped;
    std::uint64_t blocks_freed = 0;
    bool mapping_refused = false;
  };
  // Unmaps every block of `peer`'s this rank maps.
  static void unmap_blocks(Peer& peer);

  // What a rank published: its COMM_TRANSPORT, identity, process id, the
  // ring capacity it asked for (ring_bytes_asked), the memory it found
  // available (available_memory), and its CPUs (cpu_mask_hex's form; empty
  // from a rank that did not say).
  struct Published {
    std::string choice;
    std::string identity;
    pid_t pid = 0;
    std::size_t ring_asked = 0;
    std::uint64_t available = 0;
    std::string cpus;
  };

  void set_up(Store& store, int size, std::uint64_t job,
              detail::Clock::time_point deadline);
  // Every rank's published identity, waiting for it until `deadline`.
  std::vector<Published> read_published(
      Store& store, int size, detail::Clock::time_point deadline) const;
  static HostPartition partition(const std::vector<Published>& published);
  // Sets hosts_ and each peer's same_kernel from what every rank published.
  void learn_hosts(const std::vector<Published>& published);
  // Publishes whether this rank is `able` to read every peer's memory, and
  // whether its kernel's copy keeps up, and sets single_copy_ and
  // kernel_copy_keeps_up_ to whether every rank said so.
  void agree_on_single_copy(Store& store, int size, bool able,
                            detail::Clock::time_point deadline);
  // Whether `peer`'s process has ended (its pidfd is readable).
  bool exited(int peer) const;
  // Unmaps and closes everything (the destructor, or a failed set-up).
  void release();
  // The place of local rank `writer`'s rings in the segment of local rank
  // `owner`: the peers of `owner` in rank order.
  std::size_t writer_slot(int owner, int writer) const;

  int rank_;
  int local_count_ = 1;
  bool oversubscribed_ = false;
  std::vector<int> local_ranks_;  // sorted, this rank included
  HostPartition hosts_;
  bool hosts_known_ = false;
  std::vector<Peer> peers_;
  std::array<std::unique_ptr<Doorbell>, kLanes> doorbells_;
  // A pidfd of this process, which its hellos carry (see set_up), until
  // release().
  int own_pidfd_ = -1;
  void* segment_ = nullptr;
  std::size_t segment_bytes_ = 0;
  // The word the peers read to learn whether they can read this process's
  // memory; its address travels in the hello.
  std::uint64_t probe_word_ = 0;
  bool single_copy_ = false;
  bool kernel_copy_keeps_up_ = false;
  // What offer() and withdraw() store: the start of this rank's segment,
  // whose first page its peers map, or `unshared_offer_` without one.
  std::atomic<std::uint64_t> unshared_offer_{0};
  std::atomic<std::uint64_t>* offer_word_ = &unshared_offer_;
  std::vector<std::uint8_t> scratch_;
};

}  // namespace comm::shm
