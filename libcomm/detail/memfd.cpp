#include "libcomm/detail/memfd.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

#include "libcomm/error.h"

namespace comm::detail {

void size_memfd(int fd, std::size_t bytes, const std::string& what) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY &&
      bytes > static_cast<std::size_t>(limit.rlim_cur)) {
    throw SystemError(
        EFBIG, what + ": " + std::to_string(bytes) +
                   " bytes pass this process's file size limit of " +
                   std::to_string(limit.rlim_cur) +
                   " bytes (ulimit -f counts 1024-byte blocks); raise it");
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    throw SystemError(errno,
                      what + ": sizing to " + std::to_string(bytes) + " bytes");
  }
}

}  // namespace comm::detail
