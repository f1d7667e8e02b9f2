// How many mappings of libcomm's shared host memory (libcomm/
// shared_host_memory.h) this process has: its own blocks, and the peers'
// blocks it mapped to read them.
#pragma once

#include <fstream>
#include <string>

namespace comm::testing {

inline int shared_host_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int count = 0;
  while (std::getline(maps, line)) {
    if (line.find("memfd:libcomm-shared-host") != std::string::npos) ++count;
  }
  return count;
}

}  // namespace comm::testing
