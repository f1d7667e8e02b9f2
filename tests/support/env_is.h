// Sets environment variables (libcomm's knobs, a launcher's placement) for
// the length of a test.
#pragma once

#include <stdlib.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "libcomm/param.h"

namespace comm::testing {

// Sets each variable to its value, or unsets it where the value is null,
// and re-reads the knobs, for as long as it lives; then puts back what the
// process had (a value, or none) and re-reads the knobs again, so that the
// other cases of the process see nothing one case set.
class EnvIs {
 public:
  using Values = std::vector<std::pair<const char*, const char*>>;

  explicit EnvIs(const Values& values) {
    for (const auto& [name, value] : values) {
      const char* before = ::getenv(name);
      saved_.emplace_back(name, before == nullptr
                                    ? std::optional<std::string>()
                                    : std::optional<std::string>(before));
      if (value == nullptr) {
        ::unsetenv(name);
      } else {
        ::setenv(name, value, 1);
      }
    }
    comm::reset_params();
  }
  explicit EnvIs(
      std::initializer_list<std::pair<const char*, const char*>> values)
      : EnvIs(Values(values)) {}
  ~EnvIs() {
    // In reverse, so that a variable named twice gets its first value back.
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        ::setenv(it->first, it->second->c_str(), 1);
      } else {
        ::unsetenv(it->first);
      }
    }
    comm::reset_params();
  }
  EnvIs(const EnvIs&) = delete;
  EnvIs& operator=(const EnvIs&) = delete;

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

}  // namespace comm::testing
