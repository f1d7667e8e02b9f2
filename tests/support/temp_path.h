// A unique path under /tmp for one test, removed (if still there) at the end.
#pragma once

#include <unistd.h>

#include <atomic>
#include <string>

namespace comm::testing {

class TempPath {
 public:
  explicit TempPath(const std::string& stem) {
    static std::atomic<int> counter{0};
    path_ = "/tmp/" + stem + "_" + std::to_string(getpid()) + "_" +
            std::to_string(counter++);
    ::unlink(path_.c_str());
  }
  ~TempPath() { ::unlink(path_.c_str()); }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;

  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

}  // namespace comm::testing
