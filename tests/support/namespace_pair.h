// Two network namespaces joined by a veth pair, standing for two hosts in
// the tests that need them: address(0) (10.213.0.1) in the first,
// address(1) (10.213.0.2) in the second, each with its loopback up. They
// are made for one test and removed after it; ok() is false, with the reason
// in why(), where they cannot be made (not root, no iproute2), and the test
// then skips saying so.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace comm::testing {

class NamespacePair {
 public:
  NamespacePair() {
    // The process id and a count keep the names apart between the test
    // processes of a parallel run, and between pairs of one process.
    static std::atomic<int> made{0};
    const std::string id = std::to_string(getpid()) + "x" +
                           std::to_string(made.fetch_add(1) % 100);
    names_[0] = "lcomm-" + id + "-a";
    names_[1] = "lcomm-" + id + "-b";
    // An interface name has at most 15 characters.
    links_[0] = "lcv" + id + "a";
    links_[1] = "lcv" + id + "b";
    const std::vector<std::string> steps = {
        "ip netns add " + names_[0],
        "ip netns add " + names_[1],
        "ip link add " + links_[0] + " netns " + names_[0] +
            " type veth peer name " + links_[1] + " netns " + names_[1],
        "ip -n " + names_[0] + " addr add " + address(0) + "/24 dev " +
            links_[0],
        "ip -n " + names_[1] + " addr add " + address(1) + "/24 dev " +
            links_[1],
        "ip -n " + names_[0] + " link set " + links_[0] + " up",
        "ip -n " + names_[1] + " link set " + links_[1] + " up",
        "ip -n " + names_[0] + " link set lo up",
        "ip -n " + names_[1] + " link set lo up",
    };
    for (const std::string& step : steps) {
      if (std::system((step + " >/dev/null 2>&1").c_str()) != 0) {
        why_ = "'" + step + "' failed (root and iproute2 are needed)";
        return;
      }
    }
    ok_ = true;
  }
  ~NamespacePair() {
    // Removing a namespace removes its end of the veth pair, and so both.
    for (const std::string& name : names_) {
      (void)!std::system(("ip netns del " + name + " >/dev/null 2>&1").c_str());
    }
  }
  NamespacePair(const NamespacePair&) = delete;
  NamespacePair& operator=(const NamespacePair&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  static std::string address(int side) {
    return side == 0 ? "10.213.0.1" : "10.213.0.2";
  }
  // Moves the calling process (single-threaded) into namespace `side`.
  bool enter(int side) const {
    const int fd =
        open(("/run/netns/" + names_[side]).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool entered = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return entered;
  }
  // The bytes side `side`'s end of the link has sent to the other side, as
  // a process inside that side (one that entered it) reads them.
  std::uint64_t bytes_sent(int side) const {
    std::ifstream dev("/proc/self/net/dev");
    std::string line;
    while (std::getline(dev, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      name.erase(0, name.find_first_not_of(' '));
      if (name != links_[side]) continue;
      // Received: bytes packets errs drop fifo frame compressed multicast;
      // then sent: bytes ...
      std::istringstream fields(line.substr(colon + 1));
      std::uint64_t value = 0;
      for (int i = 0; i <= 8; ++i) fields >> value;
      return value;
    }
    throw std::runtime_error("no " + links_[side] + " in /proc/self/net/dev");
  }
  // Takes side 0's end of the link down: nothing passes between them.
  bool cut() const {
    return std::system(("ip -n " + names_[0] + " link set " + links_[0] +
                        " down >/dev/null 2>&1")
                           .c_str()) == 0;
  }

 private:
  std::string names_[2];
  std::string links_[2];
  bool ok_ = false;
  std::string why_;
};

}  // namespace comm::testing
