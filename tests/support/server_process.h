// A TCPStoreServer running in a child process, so that the test process
// stays single-threaded and may fork clients.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "store/tcp_store_server.h"
#include "support/child_process.h"

namespace comm::testing {

class ServerProcess {
 public:
  explicit ServerProcess(TCPStoreServerOptions options = {}) {
    int to_parent[2];
    int from_parent[2];
    if (pipe(to_parent) != 0 || pipe(from_parent) != 0) {
      throw std::runtime_error("pipe failed");
    }
    child_ = std::make_unique<ChildProcess>([&]() -> int {
      close(to_parent[0]);
      close(from_parent[1]);
      TCPStoreServer server(options);
      const std::uint16_t port = server.port();
      if (write(to_parent[1], &port, sizeof(port)) != sizeof(port)) return 3;
      // Serve until the parent closes its end (or dies), then stop cleanly.
      char byte;
      while (read(from_parent[0], &byte, 1) > 0) {
      }
      return server.stop() ? 0 : 4;  // 4: the event loop did not close cleanly
    });
    close(to_parent[1]);
    close(from_parent[0]);
    stop_pipe_ = from_parent[1];
    if (read(to_parent[0], &port_, sizeof(port_)) != sizeof(port_)) {
      close(to_parent[0]);
      throw std::runtime_error("the server process did not report its port");
    }
    close(to_parent[0]);
  }
  ~ServerProcess() {
    if (stop_pipe_ >= 0) close(stop_pipe_);
  }

  std::uint16_t port() const { return port_; }
  ChildProcess& process() { return *child_; }

  // Asks the server to stop and returns the process's exit code: 0 when
  // every libuv handle closed and the loop closed without error.
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    close(stop_pipe_);
    stop_pipe_ = -1;
    return child_->wait(timeout);
  }

 private:
  std::unique_ptr<ChildProcess> child_;
  int stop_pipe_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace comm::testing
