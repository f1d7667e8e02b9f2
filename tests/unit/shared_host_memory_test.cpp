// Shared host memory (libcomm/shared_host_memory.h): what allocation gives,
// which ranges a lookup finds in a block, what freeing refuses, and the
// tensors made of it. Reading it from another rank is single_copy_test's
// and the multi-process shm test's.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "libcomm/error.h"
#include "libcomm/shared_host_memory.h"
#include "libcomm/tensor.h"

namespace {

std::size_t page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

TEST_CASE("a block is zeroed whole pages, and a lookup finds it",
          "[shared_host]") {
  const std::size_t bytes = page() + 100;
  auto* data = static_cast<std::uint8_t*>(comm::allocate_shared_host(bytes));
  REQUIRE(data != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(data) % page() == 0);
  CHECK(std::all_of(data, data + 2 * page(),
                    [](std::uint8_t b) { return b == 0; }));
  std::memset(data, 0xab, 2 * page());  // the rounded-up page is ours too

  const auto whole = comm::find_shared_host(data, bytes);
  REQUIRE(whole.has_value());
  CHECK(whole->base == reinterpret_cast<std::uintptr_t>(data));
  CHECK(whole->bytes == 2 * page());
  CHECK(whole->serial != 0);
  CHECK(whole->fd >= 0);
  CHECK(comm::find_shared_host(data + 10, 2 * page() - 10)->serial ==
        whole->serial);
  // A range that runs past the block's end, or lies outside it, is in none.
  CHECK_FALSE(comm::find_shared_host(data + 10, 2 * page()).has_value());
  CHECK_FALSE(comm::find_shared_host(data + 2 * page(), 1).has_value());
  CHECK_FALSE(comm::find_shared_host(data - 1, 1).has_value());
  CHECK_FALSE(comm::find_shared_host(nullptr, 0).has_value());
  int ordinary = 0;
  CHECK_FALSE(comm::find_shared_host(&ordinary, sizeof(ordinary)).has_value());

  const std::uint64_t freed = comm::shared_host_blocks_freed();
  comm::free_shared_host(data);
  CHECK(comm::shared_host_blocks_freed() == freed + 1);
  CHECK_FALSE(comm::find_shared_host(data, 1).has_value());
}

TEST_CASE("blocks have serials of their own, never reused", "[shared_host]") {
  void* first = comm::allocate_shared_host(1);
  const std::uint64_t serial = comm::find_shared_host(first, 1)->serial;
  comm::free_shared_host(first);
  void* second = comm::allocate_shared_host(1);
  CHECK(comm::find_shared_host(second, 1)->serial > serial);
  // Zero bytes still get a page of their own.
  void* empty = comm::allocate_shared_host(0);
  CHECK(empty != second);
  CHECK(comm::find_shared_host(empty, 0).has_value());
  comm::free_shared_host(empty);
  comm::free_shared_host(second);
}

TEST_CASE("freeing what is not a live block is refused and frees nothing",
          "[shared_host]") {
  void* data = comm::allocate_shared_host(64);
  int ordinary = 0;
  CHECK_THROWS_AS(comm::free_shared_host(&ordinary), comm::InvalidArgument);
  CHECK_THROWS_AS(comm::free_shared_host(nullptr), comm::InvalidArgument);
  CHECK_THROWS_AS(comm::free_shared_host(static_cast<char*>(data) + 8),
                  comm::InvalidArgument);
  CHECK(comm::find_shared_host(data, 64).has_value());
  comm::free_shared_host(data);
  CHECK_THROWS_WITH(comm::free_shared_host(data),
                    Catch::Contains("allocate_shared_host"));
}

TEST_CASE("a block is sealed at its size, so a peer's mapping never faults",
          "[shared_host]") {
  void* data = comm::allocate_shared_host(page());
  const auto block = comm::find_shared_host(data, page());
  REQUIRE(block.has_value());
  const int fd = static_cast<int>(block->fd);
  CHECK(ftruncate(fd, 0) != 0);
  CHECK(ftruncate(fd, static_cast<off_t>(4 * page())) != 0);
  comm::free_shared_host(data);
}

TEST_CASE("a shared host tensor is zeros in a block, freed with its last view",
          "[shared_host]") {
  const std::uint64_t freed = comm::shared_host_blocks_freed();
  {
    comm::Tensor t = comm::Tensor::shared_host_zeros({3, 5}, comm::DType::kF64);
    CHECK(t.device().is_cpu());
    CHECK(t.numel() == 15);
    CHECK(t.is_contiguous());
    const auto* values = static_cast<const double*>(t.data_ptr());
    CHECK(std::all_of(values, values + 15, [](double v) { return v == 0.0; }));
    CHECK(comm::find_shared_host(t.data_ptr(), t.nbytes()).has_value());
    comm::Tensor view = t.slice(1, 2);
    t = comm::Tensor();
    CHECK(comm::shared_host_blocks_freed() == freed);
    CHECK(comm::find_shared_host(view.data_ptr(), view.nbytes()).has_value());
  }
  CHECK(comm::shared_host_blocks_freed() == freed + 1);
}

TEST_CASE("more bytes than a file holds is an InvalidArgument",
          "[shared_host]") {
  CHECK_THROWS_AS(comm::allocate_shared_host(SIZE_MAX - 8192),
                  comm::InvalidArgument);
  CHECK_THROWS_AS(comm::allocate_shared_host(SIZE_MAX), comm::InvalidArgument);
}

TEST_CASE(
    "a child forked while another thread looks blocks up allocates and "
    "frees, and shares the blocks it inherited",
    "[shared_host]") {
#if defined(__SANITIZE_THREAD__)
  // Its children allocate (malloc included) after a fork from a process
  // of several threads, which ThreadSanitizer's own state does not
  // survive; the other builds run it.
  WARN(
      "skipped: fork from a process of several threads under "
      "ThreadSanitizer");
  return;
#endif
  auto* inherited = static_cast<char*>(comm::allocate_shared_host(64));
  std::atomic<bool> stop{false};
  // Takes the registry's lock over and over, as every collective does.
  std::thread looker([&] {
    while (!stop.load()) (void)comm::find_shared_host(inherited, 64);
  });
  int hung = 0, failed = 0;
  for (int child = 0; child < 20; ++child) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(5);  // a child that deadlocks dies of SIGALRM
      void* fresh = comm::allocate_shared_host(64);
      comm::free_shared_host(fresh);
      std::strcpy(inherited, "child wrote");
      comm::free_shared_host(inherited);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) ++hung;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop = true;
  looker.join();
  CHECK(hung == 0);
  CHECK(failed == 0);
  // The blocks are shared mappings: the children's writes show here.
  CHECK(std::string(inherited) == "child wrote");
  comm::free_shared_host(inherited);
}
