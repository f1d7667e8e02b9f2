// comm::shm::Doorbell: the eventfd on which one rank's thread sleeps while
// it waits for shared-memory rings, polled together with its sockets.
// Peers ring it through a duplicate of the descriptor passed to them (see
// local_peers.h); ring.h says when they ring it and why no wake-up is lost.
#pragma once

namespace comm::shm {

class Doorbell {
 public:
  // A non-blocking eventfd. Throws SystemError when none can be made.
  Doorbell();
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  int fd() const { return fd_; }
  // Forgets the rings so far, so that the next poll sleeps until a new one.
  void drain() const;

  // Wakes whoever polls the eventfd `fd`. Never fails: the counter only
  // saturates, and a full counter is a pending wake-up already.
  static void ring(int fd);

 private:
  int fd_ = -1;
};

}  // namespace comm::shm
