#include "bench/harness/cpus.h"

#include <sched.h>

#include <cerrno>
#include <string>
#include <system_error>

#include "bench/harness/options.h"

namespace comm::bench {

std::vector<int> usable_cpus(std::size_t count) {
  cpu_set_t usable;
  CPU_ZERO(&usable);
  if (::sched_getaffinity(0, sizeof(usable), &usable) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "sched_getaffinity");
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < count; ++cpu) {
    if (CPU_ISSET(cpu, &usable)) cpus.push_back(cpu);
  }
  if (cpus.size() < count) {
    throw UsageError(
        "needs " + std::to_string(count) + " CPUs, and this process may use " +
        std::to_string(CPU_COUNT(&usable)) + " (see its taskset or cgroup)");
  }
  return cpus;
}

void pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
    throw std::system_error(errno, std::generic_category(),
                            "sched_setaffinity to CPU " + std::to_string(cpu));
  }
}

}  // namespace comm::bench
