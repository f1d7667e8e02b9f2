// Sets environment variables (libcomm's knobs) for the length of a test.
#pragma once

#include <stdlib.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "libcomm/param.h"

namespace comm::testing {

// Sets each variable, and re-reads the knobs, for as long as it lives; then
// unsets them and re-reads the knobs again.
class EnvIs {
 public:
  explicit EnvIs(
      std::initializer_list<std::pair<const char*, const char*>> values)
      : values_(values) {
    for (const auto& [name, value] : values_) ::setenv(name, value, 1);
    comm::reset_params();
  }
  ~EnvIs() {
    for (const auto& [name, value] : values_) ::unsetenv(name);
    comm::reset_params();
  }
  EnvIs(const EnvIs&) = delete;
  EnvIs& operator=(const EnvIs&) = delete;

 private:
  std::vector<std::pair<const char*, const char*>> values_;
};

}  // namespace comm::testing
