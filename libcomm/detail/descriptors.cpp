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

// Held while the limit is read and raised and while claims change, so that
// two groups set up by two threads at once do not lower each other's raise
// nor miss each other's claim.
std::mutex limit_mutex;
// The descriptors the live DescriptorClaims of this process hold.
std::uint64_t claimed = 0;

// Descriptors kept beyond a set-up's count, for what the process opens
// meanwhile: logs, a store connection, the transient descriptors of a
// set-up.
constexpr std::uint64_t kSpare = 32;

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

// With limit_mutex held: raises the soft limit for `needed` descriptors.
std::uint64_t raise_locked(std::uint64_t needed) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) {
    return std::numeric_limits<std::uint64_t>::max();
  }
  const std::uint64_t soft = as_count(files.rlim_cur);
  const std::uint64_t hard = as_count(files.rlim_max);
  if (needed <= soft) return soft;
  const std::uint64_t target =
      std::min(hard, needed > hard / 2 ? hard : 2 * needed);
  files.rlim_cur = static_cast<rlim_t>(target);
  if (setrlimit(RLIMIT_NOFILE, &files) != 0) return soft;
  COMM_LOG_INFO(
      "raised this process's soft limit of open files (ulimit -n) from {} to "
      "{}",
      soft, target);
  return target;
}

// With limit_mutex held: checks room for `count` more descriptors beyond
// the open ones and the other claims, raising the soft limit.
void claim_locked(std::uint64_t count, const std::string& who,
                  const std::string& what_for) {
  const std::uint64_t open = open_descriptors();
  const std::uint64_t needed = open + claimed + count + kSpare;
  if (raise_locked(needed) >= needed) return;
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  throw InvalidArgument(
      who + " needs a limit of at least " + std::to_string(needed) +
      " open files (" + std::to_string(open) + " open, " +
      std::to_string(count) + " for " + what_for +
      (claimed > 0 ? ", " + std::to_string(claimed) +
                         " for other groups being set up in this process"
                   : "") +
      ", " + std::to_string(kSpare) +
      " spare), and this process's hard limit is " +
      limit_text(as_count(files.rlim_max)) +
      " (ulimit -Hn); raise it (as root with ulimit -Hn, in limits.conf, or "
      "with LimitNOFILE= of a systemd unit) or run fewer ranks");
}

}  // namespace

std::uint64_t raise_descriptor_limit(std::uint64_t needed) {
  std::lock_guard<std::mutex> lock(limit_mutex);
  return raise_locked(needed);
}

DescriptorClaim::DescriptorClaim(std::uint64_t count, const std::string& who,
                                 const std::string& what_for)
    : who_(who) {
  update(count, what_for);
}

DescriptorClaim::~DescriptorClaim() {
  std::lock_guard<std::mutex> lock(limit_mutex);
  claimed -= count_;
}

void DescriptorClaim::update(std::uint64_t count, const std::string& what_for) {
  std::lock_guard<std::mutex> lock(limit_mutex);
  claimed -= count_;
  count_ = 0;
  claim_locked(count, who_, what_for);
  claimed += count;
  count_ = count;
}

std::string descriptor_limit_hint(int error) {
  if (error == ENFILE) {
    return " (the system's table of open files is full: sysctl fs.file-max)";
  }
  if (error != EMFILE) return "";
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return "";
  const std::string soft = limit_text(as_count(files.rlim_cur));
  if (files.rlim_cur < files.rlim_max) {
    return " (this process has reached its limit of " + soft +
           " open files, ulimit -n; raise it, up to the hard limit of " +
           limit_text(as_count(files.rlim_max)) +
           " (ulimit -Hn), or run fewer ranks)";
  }
  return " (this process has reached its limit of " + soft +
         " open files, which is also its hard limit, ulimit -Hn; raise that "
         "as root, or run fewer ranks)";
}

}  // namespace comm::detail
