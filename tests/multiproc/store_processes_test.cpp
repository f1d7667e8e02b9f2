// Stores and rendezvous across real processes: FileStore under concurrent
// writers, env:// joins, a rank claimed twice, and the comm-store tool.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "libcomm/detail/socket.h"
#include "libcomm/distributed/rendezvous.h"
#include "libcomm/error.h"
#include "store/file_store.h"
#include "store/tcp_store.h"
#include "support/child_process.h"
#include "support/temp_path.h"

using comm::testing::ChildProcess;
using namespace std::chrono_literals;

namespace {

// Runs rendezvous("env://") in a child with the given RANK; the child exits
// 0 on success, 10 when it failed naming a rank claimed twice, 11 for any
// other error (printed).
std::unique_ptr<ChildProcess> env_rank(std::uint16_t port, int rank,
                                       int world) {
  return std::make_unique<ChildProcess>([=] {
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    try {
      auto joined = comm::rendezvous("env://", -1, -1, 30s);
      // Everyone reports in, and rank 0 (the server) stays until all have.
      joined.store->set_string("done/" + std::to_string(joined.rank), "1");
      if (joined.rank == 0) {
        for (int r = 0; r < world; ++r) {
          joined.store->wait({"done/" + std::to_string(r)}, 30s);
        }
      }
      return joined.rank == rank ? 0 : 12;
    } catch (const comm::InvalidArgument& e) {
      const std::string message = e.what();
      if (message.find("claimed twice") != std::string::npos) return 10;
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return 11;
    }
  });
}

}  // namespace

TEST_CASE(
    "FileStore: concurrent processes add exactly, last one removes the file",
    "[file_store][multiproc]") {
  comm::testing::TempPath path("file_store_processes");
  constexpr int kProcesses = 4;
  constexpr int kAdds = 200;
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (int p = 0; p < kProcesses; ++p) {
    children.push_back(std::make_unique<ChildProcess>([&, p] {
      comm::FileStore store(path.str(), 30s);
      for (int i = 0; i < kAdds; ++i) store.add("counter", 1);
      store.set_string("process/" + std::to_string(p), "done");
      // Stay until all have finished, so the file outlives every writer.
      for (int q = 0; q < kProcesses; ++q) {
        store.wait({"process/" + std::to_string(q)}, 30s);
      }
      return store.add("counter", 0) == kProcesses * kAdds ? 0 : 1;
    }));
  }
  for (auto& child : children) CHECK(child->wait(60s) == 0);
  CHECK(access(path.str().c_str(), F_OK) != 0);
}

TEST_CASE("FileStore: a wait wakes on a set from another process",
          "[file_store][multiproc]") {
  comm::testing::TempPath path("file_store_wait");
  comm::FileStore store(path.str(), 30s);
  ChildProcess setter([&] {
    std::this_thread::sleep_for(150ms);
    comm::FileStore other(path.str(), 30s);
    other.set_string("ready", "yes");
    return 0;
  });
  CHECK(store.get_string("ready", 20s) == "yes");
  CHECK(setter.wait(20s) == 0);
}

TEST_CASE("env:// joins 4 processes with rank 0 hosting the store",
          "[rendezvous][multiproc]") {
  const std::uint16_t port = comm::detail::free_loopback_port();
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  // Rank 0 last: the others retry their connection until it is up.
  for (int rank : {3, 1, 2, 0}) ranks.push_back(env_rank(port, rank, 4));
  for (auto& rank : ranks) CHECK(rank->wait(60s) == 0);
}

TEST_CASE("two processes claiming one rank both fail, saying so",
          "[rendezvous][multiproc]") {
  const std::uint16_t port = comm::detail::free_loopback_port();
  auto rank0 = env_rank(port, 0, 3);
  auto first = env_rank(port, 1, 3);
  auto second = env_rank(port, 1, 3);
  CHECK(first->wait(60s) == 10);
  CHECK(second->wait(60s) == 10);
  CHECK(rank0->wait(60s) == 10);
}

TEST_CASE("comm-store serves clients and stops cleanly on SIGTERM",
          "[tools][multiproc]") {
  const char* binary = std::getenv("COMM_STORE_BIN");
  REQUIRE(binary != nullptr);
  int output[2];
  REQUIRE(pipe(output) == 0);
  ChildProcess server([&] {
    dup2(output[1], 1);
    close(output[0]);
    execl(binary, binary, "--host", "127.0.0.1", "--port", "0", nullptr);
    return 127;
  });
  close(output[1]);
  // Read "comm-store listening on 127.0.0.1:PORT\n".
  std::string line;
  char c = 0;
  pollfd entry{output[0], POLLIN, 0};
  while (line.size() < 200 && poll(&entry, 1, 10000) > 0 &&
         read(output[0], &c, 1) == 1 && c != '\n') {
    line += c;
  }
  close(output[0]);
  REQUIRE_THAT(line, Catch::StartsWith("comm-store listening on 127.0.0.1:"));
  const auto port =
      static_cast<std::uint16_t>(std::stoi(line.substr(line.rfind(':') + 1)));
  {
    comm::TCPStoreOptions options;
    options.port = port;
    options.timeout = 10s;
    options.token = "";
    comm::TCPStore store(options);
    store.set_string("via", "tool");
    CHECK(store.get_string("via") == "tool");
  }
  server.kill(SIGTERM);
  CHECK(server.wait(10s) == 0);
}

TEST_CASE("comm-store rejects bad arguments with exit code 2",
          "[tools][multiproc]") {
  const char* binary = std::getenv("COMM_STORE_BIN");
  REQUIRE(binary != nullptr);
  ChildProcess bad([&] {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl(binary, binary, "--port", "not-a-port", nullptr);
    return 127;
  });
  CHECK(bad.wait(10s) == 2);
}
