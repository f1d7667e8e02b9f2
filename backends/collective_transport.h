// comm::CollectiveTransport: what a collective algorithm sees of the ranks
// of one call: its rank, the group's size, steps (CollectiveStep) to run one
// after another, where it knows them the ranks' hosts, and, where the
// transport offers it, direct reads of the peers' memory (PeerMemory).
//
// The TCP backend implements it per call (tcp::CollectiveContext); a
// shared-memory transport is to implement it too, so that both run the
// same algorithms.
#pragma once

#include <string>

#include "backends/collective_step.h"
#include "backends/host_partition.h"
#include "backends/peer_memory.h"
#include "backends/workspace.h"

namespace comm {

class CollectiveTransport {
 public:
  virtual ~CollectiveTransport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Begins the call's next step and returns it, empty. The step returned
  // before is over: it must have run (or thrown), and the reference to it
  // is no longer valid. A transport keeps the step's storage, so that a
  // step costs no allocation beyond its transfers'.
  virtual CollectiveStep& step() = 0;
  // Which of the ranks share a host, the same on every rank of the call,
  // or null where the transport does not say: the algorithms then run flat,
  // as over one host. Hierarchical algorithms (tcp/hierarchy.h) choose
  // their phases from it.
  virtual const HostPartition* hosts() const { return nullptr; }
  // Reads of the peers' memory, or null: a transport offers them only
  // where every rank of the group can read every other's (ranks of one
  // host that the kernel lets read each other), and says the same to
  // every rank of the group, so that all of them choose the same
  // algorithm.
  virtual PeerMemory* peer_memory() { return nullptr; }
  // Where the call's temporary buffers come from (WorkspaceBuffer), kept
  // by the transport from one call to the next and released as the call
  // ends; null where the transport keeps none, and each buffer is then
  // allocated for its scope.
  virtual Workspace* workspace() { return nullptr; }
  // The call, as errors name it: "all_reduce #12 (float32 x 1024, sum)".
  virtual std::string describe() const = 0;

 protected:
  CollectiveTransport() = default;
  CollectiveTransport(const CollectiveTransport&) = default;
  CollectiveTransport& operator=(const CollectiveTransport&) = default;
};

}  // namespace comm
