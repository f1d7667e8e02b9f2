#include "backends/shm/doorbell.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "libcomm/error.h"

namespace comm::shm {

Doorbell::Doorbell() {
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw SystemError(errno, "shared memory: eventfd");
}

Doorbell::~Doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

void Doorbell::drain() const {
  std::uint64_t count;
  (void)!::read(fd_, &count, sizeof(count));
}

void Doorbell::ring(int fd) {
  if (fd < 0) return;
  const std::uint64_t one = 1;
  (void)!::write(fd, &one, sizeof(one));
}

}  // namespace comm::shm
