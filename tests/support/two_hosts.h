// Two emulated hosts for multi-process tests: two network namespaces
// joined by a veth pair, made by the test and removed at its end. Ranks in
// different network namespaces are different hosts to libcomm (see
// backends/shm/local_peers.h). Making them needs root (or CAP_NET_ADMIN)
// and iproute2; where that fails, `ok` is false and `why` says why, and
// the test skips.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace comm::testing {

// Runs `command` through the shell; true when it exits 0.
inline bool shell(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// 10.77.0.1 in the first namespace and 10.77.0.2 in the second, each with
// its loopback up. The names carry this process's id, so that tests
// running at once make namespaces of their own.
struct TwoHosts {
  std::string names[2];
  std::string veths[2];
  bool ok = false;
  std::string why;

  TwoHosts() {
    const std::string tag = std::to_string(getpid());
    names[0] = "lcshm" + tag + "a";
    names[1] = "lcshm" + tag + "b";
    veths[0] = "lcv" + tag + "a";
    veths[1] = "lcv" + tag + "b";
    if (!shell("ip netns add " + names[0]) ||
        !shell("ip netns add " + names[1])) {
      why =
          "cannot create network namespaces (`ip netns add` failed: not "
          "root, or no iproute2)";
      return;
    }
    ok =
        shell("ip link add " + veths[0] + " netns " + names[0] +
              " type veth peer name " + veths[1] + " netns " + names[1]) &&
        shell("ip -n " + names[0] + " addr add 10.77.0.1/24 dev " + veths[0]) &&
        shell("ip -n " + names[1] + " addr add 10.77.0.2/24 dev " + veths[1]) &&
        shell("ip -n " + names[0] + " link set " + veths[0] + " up") &&
        shell("ip -n " + names[1] + " link set " + veths[1] + " up") &&
        shell("ip -n " + names[0] + " link set lo up") &&
        shell("ip -n " + names[1] + " link set lo up");
    if (!ok) why = "cannot join the namespaces with a veth pair";
  }
  ~TwoHosts() {
    for (const auto& name : names) shell("ip netns del " + name);
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  static std::string address(int h) {
    return h == 0 ? "10.77.0.1" : "10.77.0.2";
  }

  // Moves the calling (single-threaded, child) process into host `h`.
  void enter(int h) const {
    const int fd = open(("/var/run/netns/" + names[h]).c_str(), O_RDONLY);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      throw std::runtime_error("setns into " + names[h] + " failed");
    }
    close(fd);
  }

  // The bytes host `h`'s end of the veth pair has sent to the other host,
  // read from inside host `h` (a process that entered it).
  std::uint64_t bytes_sent(int h) const {
    std::ifstream dev("/proc/self/net/dev");
    std::string line;
    while (std::getline(dev, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      name.erase(0, name.find_first_not_of(' '));
      if (name != veths[h]) continue;
      // Receive: bytes packets errs drop fifo frame compressed multicast;
      // then transmit: bytes ...
      std::istringstream fields(line.substr(colon + 1));
      std::uint64_t value = 0;
      for (int i = 0; i <= 8; ++i) fields >> value;
      return value;
    }
    throw std::runtime_error("no " + veths[h] + " in /proc/self/net/dev");
  }
};

}  // namespace comm::testing
