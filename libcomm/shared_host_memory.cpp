#include "libcomm/shared_host_memory.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>

#include "libcomm/detail/memfd.h"
#include "libcomm/error.h"

namespace comm {
namespace {

// The blocks this process holds, by base address. A collective looks its
// buffers up under the shared lock; allocation and freeing take it
// exclusively.
struct Registry {
  std::shared_mutex mutex;
  std::map<std::uintptr_t, SharedHostBlock> blocks;
  std::uint64_t next_serial = 1;
  std::atomic<std::uint64_t> freed{0};
  // How many blocks are listed: a lookup in a process that holds none
  // takes no lock.
  std::atomic<std::size_t> live{0};
};

Registry& registry() {
  // Never destroyed: a block may be freed by a static's destructor. A fork
  // takes the lock first, so that the registry is whole in the child; the
  // child, whose only thread is not the one that took it, gets a lock of
  // its own, unheld, in place of its copy.
  static Registry* const instance = [] {
    auto* created = new Registry;
    ::pthread_atfork([] { registry().mutex.lock(); },
                     [] { registry().mutex.unlock(); },
                     [] { new (&registry().mutex) std::shared_mutex; });
    return created;
  }();
  return *instance;
}

std::size_t page_bytes() {
  static const auto bytes = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return bytes;
}

// Closes a descriptor on every way out unless released.
struct OwnedFd {
  int fd;
  ~OwnedFd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void* allocate_shared_host(std::size_t bytes) {
  const std::size_t page = page_bytes();
  if (bytes > static_cast<std::size_t>(INT64_MAX) - page) {
    throw InvalidArgument("allocate_shared_host: " + std::to_string(bytes) +
                          " bytes is more than any address space holds");
  }
  const std::size_t rounded =
      bytes == 0 ? page : (bytes + page - 1) / page * page;
  OwnedFd memfd{
      static_cast<int>(::syscall(SYS_memfd_create, "libcomm-shared-host",
                                 MFD_CLOEXEC | MFD_ALLOW_SEALING))};
  if (memfd.fd < 0) {
    throw SystemError(errno,
                      "allocate_shared_host: memfd_create (each block of "
                      "shared host memory holds a descriptor until it is "
                      "freed: free blocks, or allocate fewer, larger ones)");
  }
  detail::size_memfd(memfd.fd, rounded, "allocate_shared_host");
  // Sealed at its size, so that a peer's mapping of the whole block never
  // reaches past the file's end (which would be SIGBUS), whatever this
  // process does with the descriptor.
  if (::fcntl(memfd.fd, F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw SystemError(errno, "allocate_shared_host: sealing the memfd");
  }
  struct stat status {};
  if (::fstat(memfd.fd, &status) != 0) {
    throw SystemError(errno, "allocate_shared_host: fstat");
  }
  void* data =
      ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.fd, 0);
  if (data == MAP_FAILED) {
    throw SystemError(errno, "allocate_shared_host: mmap of " +
                                 std::to_string(rounded) + " bytes");
  }
  Registry& blocks = registry();
  const std::unique_lock lock(blocks.mutex);
  SharedHostBlock block;
  block.serial = blocks.next_serial++;
  block.base = reinterpret_cast<std::uintptr_t>(data);
  block.bytes = rounded;
  block.inode = status.st_ino;
  block.fd = memfd.fd;
  blocks.blocks.emplace(block.base, block);
  blocks.live.fetch_add(1, std::memory_order_release);
  memfd.fd = -1;
  return data;
}

void free_shared_host(void* data) {
  Registry& blocks = registry();
  SharedHostBlock block;
  {
    const std::unique_lock lock(blocks.mutex);
    const auto found =
        blocks.blocks.find(reinterpret_cast<std::uintptr_t>(data));
    if (found == blocks.blocks.end()) {
      throw InvalidArgument(
          "free_shared_host: " +
          std::string(data == nullptr ? "a null pointer" : "this pointer") +
          " is not a block of shared host memory (one that "
          "allocate_shared_host returned and that was not freed since)");
    }
    block = found->second;
    blocks.blocks.erase(found);
    blocks.live.fetch_sub(1, std::memory_order_release);
    blocks.freed.fetch_add(1, std::memory_order_release);
  }
  ::munmap(data, block.bytes);
  ::close(static_cast<int>(block.fd));
}

std::optional<SharedHostBlock> find_shared_host(const void* data,
                                                std::size_t bytes) {
  if (data == nullptr) return std::nullopt;
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  Registry& blocks = registry();
  if (blocks.live.load(std::memory_order_acquire) == 0) return std::nullopt;
  const std::shared_lock lock(blocks.mutex);
  if (blocks.blocks.empty()) return std::nullopt;
  auto after = blocks.blocks.upper_bound(begin);
  if (after == blocks.blocks.begin()) return std::nullopt;
  const SharedHostBlock& block = std::prev(after)->second;
  const std::uint64_t offset = begin - block.base;
  if (offset > block.bytes || bytes > block.bytes - offset) return std::nullopt;
  // An empty range at the block's very end belongs to nothing one reads.
  if (offset == block.bytes) return std::nullopt;
  return block;
}

std::uint64_t shared_host_blocks_freed() {
  return registry().freed.load(std::memory_order_acquire);
}

}  // namespace comm
