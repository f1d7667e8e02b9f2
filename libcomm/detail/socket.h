// A TCP socket with deadlines, shared by the TCPStore client and the TCP
// backend. Every call that can block takes a deadline and waits with poll(),
// so a dead or stuck peer becomes an error, never a hang or a busy loop.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "libcomm/export.h"

namespace comm::detail {

using Clock = std::chrono::steady_clock;

class COMM_API Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Connects to host:port (any address getaddrinfo gives, IPv4 or IPv6),
  // retrying while the peer is not there yet (refused, unreachable, reset)
  // with exponential backoff and jitter, until `deadline`. Then throws
  // TimeoutError naming `what`, host:port, the attempts, the time spent and
  // the last error, which it also leaves in `*last_error` where given (a
  // caller that connects in slices tells a refusal from silence by it). A
  // host name that does not resolve is InvalidArgument.
  static Socket connect(const std::string& host, std::uint16_t port,
                        Clock::time_point deadline, const std::string& what,
                        int* last_error = nullptr);

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() noexcept;
  void close() noexcept;

  void set_no_delay();

  // Sends or receives exactly `size` bytes before `deadline`. `peer` names
  // the other side in errors ("TCPStore server 127.0.0.1:29500"); a closed or
  // reset connection is PeerError(peer_rank), a deadline TimeoutError.
  void send_all(const void* data, std::size_t size, Clock::time_point deadline,
                const std::string& peer, int peer_rank = -1);
  void recv_all(void* data, std::size_t size, Clock::time_point deadline,
                const std::string& peer, int peer_rank = -1);

  // Waits until there is something to read, then reads what is there, up to
  // `capacity` bytes; returns how many (at least 1). Errors as recv_all.
  std::size_t recv_some(void* data, std::size_t capacity,
                        Clock::time_point deadline, const std::string& peer,
                        int peer_rank = -1);

  // Waits until there is something to read (or the peer closed); false when
  // the deadline came first.
  bool wait_readable(Clock::time_point deadline);

 private:
  bool wait_ready(short events, Clock::time_point deadline);

  int fd_ = -1;
};

// Deadline arithmetic that saturates instead of overflowing for "forever"
// timeouts.
COMM_API Clock::time_point deadline_after(std::chrono::milliseconds timeout);

// A TCP port on 127.0.0.1 that was free a moment ago, for tests and
// benchmarks whose ranks must agree on rank 0's port before it binds it.
COMM_API std::uint16_t free_loopback_port();

// "host:port", with brackets around IPv6 addresses.
COMM_API std::string host_port(const std::string& host, std::uint16_t port);

}  // namespace comm::detail
