#include "libcomm/detail/descriptors.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <mutex>

#include "libcomm/detail/log.h"
#include "libcomm/error.h"

namespace comm::detail {
namespace {

// Held while the limit is read and raised, so that two groups set up by two
// threads at once do not lower each other's raise.
std::mutex limit_mutex;

std::uint64_t as_count(rlim_t limit) {
  return limit == RLIM_INFINITY ? std::numeric_limits<std::uint64_t>::max()
                                : static_cast<std::uint64_t>(limit);
}

std::string limit_text(std::uint64_t limit) {
  return limit == std::numeric_limits<std::uint64_t>::max()
             ? "unlimited"
             : std::to_string(limit);
}

// The descriptors this process has open, or 0 where /proc cannot say.
std::uint64_t open_descriptors() {
  DIR* directory = opendir("/proc/self/fd");
  if (directory == nullptr) return 0;
  std::uint64_t count = 0;
  while (const dirent* entry = readdir(directory)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(directory);
  return count > 0 ? count - 1 : 0;  // less the directory's own
}

}  // namespace

std::uint64_t raise_descriptor_limit(std::uint64_t wanted) {
  std::lock_guard<std::mutex> lock(limit_mutex);
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) {
    return std::numeric_limits<std::uint64_t>::max();
  }
  const std::uint64_t soft = as_count(files.rlim_cur);
  const std::uint64_t hard = as_count(files.rlim_max);
  const std::uint64_t target = std::min(wanted, hard);
  if (target <= soft) return soft;
  files.rlim_cur = static_cast<rlim_t>(target);
  if (setrlimit(RLIMIT_NOFILE, &files) != 0) return soft;
  COMM_LOG_INFO(
      "raised this process's soft limit of open files (ulimit -n) from {} to "
      "{}",
      soft, target);
  return target;
}

void reserve_descriptors(std::uint64_t more, const std::string& who,
                         const std::string& why_needed) {
  // Slack for what the process opens meanwhile: logs, a store connection,
  // the transient descriptors of a set-up.
  constexpr std::uint64_t kSlack = 32;
  const std::uint64_t open = open_descriptors();
  const std::uint64_t wanted = open + more + kSlack;
  if (raise_descriptor_limit(wanted) >= wanted) return;
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  throw InvalidArgument(
      who + " needs " + std::to_string(more) + " more open files (" +
      why_needed + "), and with " + std::to_string(open) +
      " open, this process's hard limit of " +
      limit_text(as_count(files.rlim_max)) +
      " (ulimit -Hn) leaves too few; raise the hard limit (ulimit -Hn as "
      "root, limits.conf, or LimitNOFILE= of a systemd unit) or run fewer "
      "ranks");
}

std::string descriptor_limit_hint(int error) {
  if (error == ENFILE) {
    return " (the system's table of open files is full: sysctl fs.file-max)";
  }
  if (error != EMFILE) return "";
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return "";
  return " (this process has reached its limit of " +
         limit_text(as_count(files.rlim_cur)) +
         " open files, ulimit -n; raise it or run fewer ranks)";
}

}  // namespace comm::detail
