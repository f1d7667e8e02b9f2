#include "libcomm/detail/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <random>
#include <system_error>
#include <thread>

#include "libcomm/detail/log.h"
#include "libcomm/error.h"

namespace comm::detail {
namespace {

// Errors that mean "nobody is listening there yet": keep trying.
bool is_transient_connect_error(int error) {
  return error == ECONNREFUSED || error == ECONNRESET || error == ETIMEDOUT ||
         error == EHOSTUNREACH || error == ENETUNREACH || error == EAGAIN ||
         error == ECONNABORTED || error == EINTR;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1 << 30));
}

// One non-blocking connect attempt to one address, bounded by `deadline`.
// Returns the connected socket, or an invalid one with `*error` set.
Socket try_connect(const addrinfo& address, Clock::time_point deadline,
                   int* error) {
  Socket socket(::socket(address.ai_family,
                         address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         address.ai_protocol));
  if (!socket.valid()) {
    *error = errno;
    return Socket();
  }
  if (::connect(socket.fd(), address.ai_addr, address.ai_addrlen) == 0) {
    return socket;
  }
  if (errno != EINPROGRESS) {
    *error = errno;
    return Socket();
  }
  pollfd entry{socket.fd(), POLLOUT, 0};
  const int ready = ::poll(&entry, 1, remaining_ms(deadline));
  if (ready <= 0) {
    *error = ready == 0 ? ETIMEDOUT : errno;
    return Socket();
  }
  socklen_t length = sizeof(*error);
  if (getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, error, &length) != 0) {
    *error = errno;
    return Socket();
  }
  return *error == 0 ? std::move(socket) : Socket();
}

}  // namespace

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(
                     Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + timeout;
}

std::uint16_t free_loopback_port() {
  Socket probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (!probe.valid() ||
      ::bind(probe.fd(), reinterpret_cast<sockaddr*>(&address),
             sizeof(address)) != 0 ||
      getsockname(probe.fd(), reinterpret_cast<sockaddr*>(&address), &length) !=
          0) {
    throw SystemError(errno, "finding a free port on 127.0.0.1");
  }
  return ntohs(address.sin_port);
}

std::string host_port(const std::string& host, std::uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Socket::~Socket() { close(); }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::set_no_delay() {
  const int one = 1;
  if (setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    throw SystemError(errno, "setsockopt(TCP_NODELAY)");
  }
}

Socket Socket::connect(const std::string& host, std::uint16_t port,
                       Clock::time_point deadline, const std::string& what,
                       int* last_error_out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const std::string service = std::to_string(port);
  const int status =
      getaddrinfo(host.c_str(), service.c_str(), &hints, &addresses);
  if (status != 0) {
    throw InvalidArgument(what + ": cannot resolve host '" + host +
                          "': " + gai_strerror(status));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(addresses,
                                                           freeaddrinfo);
  const auto start = Clock::now();
  std::minstd_rand jitter(static_cast<unsigned>(
      std::hash<std::thread::id>()(std::this_thread::get_id()) ^
      static_cast<unsigned>(start.time_since_epoch().count())));
  auto backoff = std::chrono::milliseconds(10);
  int attempts = 0;
  int last_error = 0;
  while (true) {
    for (const addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
      ++attempts;
      Socket socket = try_connect(*a, deadline, &last_error);
      if (socket.valid()) {
        socket.set_no_delay();
        return socket;
      }
      if (!is_transient_connect_error(last_error)) {
        throw SystemError(last_error,
                          what + ": connect to " + host_port(host, port));
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    // Sleep backoff * [0.5, 1.5), so that many ranks starting together do
    // not retry in lockstep, and never past the deadline.
    const auto sleep = std::chrono::milliseconds(
        backoff.count() / 2 +
        static_cast<std::int64_t>(jitter() %
                                  static_cast<unsigned>(backoff.count())));
    COMM_LOG_DEBUG("{}: {} not reachable yet ({}); retrying in {} ms", what,
                   host_port(host, port),
                   std::system_category().message(last_error), sleep.count());
    std::this_thread::sleep_for(
        std::min<Clock::duration>(sleep, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  if (last_error_out != nullptr) *last_error_out = last_error;
  throw TimeoutError(
      what + ": could not connect to " + host_port(host, port) + " after " +
      std::to_string(attempts) + " attempts over " +
      format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(
          Clock::now() - start)) +
      " (last error: " + std::system_category().message(last_error) +
      "); check that the server is running and that the address and port "
      "(MASTER_ADDR, MASTER_PORT) are right");
}

bool Socket::wait_ready(short events, Clock::time_point deadline) {
  while (true) {
    pollfd entry{fd_, events, 0};
    const int ready = ::poll(&entry, 1, remaining_ms(deadline));
    if (ready > 0) return true;
    if (ready == 0) {
      if (Clock::now() >= deadline) return false;
      continue;  // poll's millisecond rounding woke us early
    }
    if (errno != EINTR) throw SystemError(errno, "poll");
  }
}

bool Socket::wait_readable(Clock::time_point deadline) {
  return wait_ready(POLLIN, deadline);
}

void Socket::send_all(const void* data, std::size_t size,
                      Clock::time_point deadline, const std::string& peer,
                      int peer_rank) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n =
        ::send(fd_, bytes + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(POLLOUT, deadline)) {
        throw TimeoutError("timed out sending to " + peer + " (" +
                           std::to_string(done) + " of " +
                           std::to_string(size) + " bytes sent)");
      }
      continue;
    }
    throw PeerError(peer_rank, "connection to " + peer +
                                   " failed while sending: " +
                                   std::system_category().message(errno));
  }
}

std::size_t Socket::recv_some(void* data, std::size_t capacity,
                              Clock::time_point deadline,
                              const std::string& peer, int peer_rank) {
  while (true) {
    if (!wait_ready(POLLIN, deadline)) {
      throw TimeoutError("timed out waiting for " + peer);
    }
    const ssize_t n = ::recv(fd_, data, capacity, MSG_DONTWAIT);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n == 0) throw PeerError(peer_rank, peer + " closed the connection");
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    throw PeerError(peer_rank, "connection to " + peer +
                                   " failed while receiving: " +
                                   std::system_category().message(errno));
  }
}

void Socket::recv_all(void* data, std::size_t size, Clock::time_point deadline,
                      const std::string& peer, int peer_rank) {
  auto* bytes = static_cast<std::uint8_t*>(data);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(fd_, bytes + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) {
      throw PeerError(peer_rank, peer + " closed the connection");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(POLLIN, deadline)) {
        throw TimeoutError("timed out waiting for " + peer + " (" +
                           std::to_string(done) + " of " +
                           std::to_string(size) + " bytes received)");
      }
      continue;
    }
    throw PeerError(peer_rank, "connection to " + peer +
                                   " failed while receiving: " +
                                   std::system_category().message(errno));
  }
}

}  // namespace comm::detail
