#include "backends/tcp/collective_context.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "backends/tcp/control_channel.h"
#include "libcomm/detail/copy_bytes.h"
#include "libcomm/error.h"

namespace comm::tcp {

void CollectiveContext::read(int peer, const PeerRegion& region,
                             std::uint64_t offset, void* into,
                             std::size_t bytes) {
  if (bytes == 0) return;
  const std::uint8_t* data =
      offset <= region.bytes && bytes <= region.bytes - offset
          ? mapped(peer, region)
          : nullptr;
  if (data != nullptr) {
    detail::copy_bytes(into, data + offset, bytes);
    return;
  }
  const int error = mesh_.local_peers().read_memory(
      peer, region.address + offset, into, bytes);
  if (error != 0) fail_reading(peer, error, bytes);
}

const std::uint8_t* CollectiveContext::mapped(int peer,
                                              const PeerRegion& region) {
  // A region that its block does not hold (which no rank of libcomm
  // sends) is read through the kernel, which checks it.
  const PeerRegion& r = region;
  if (r.block.serial == 0 || r.address < r.block.base ||
      r.address - r.block.base > r.block.bytes ||
      r.bytes > r.block.bytes - (r.address - r.block.base)) {
    return nullptr;
  }
  int error = 0;
  const std::uint8_t* block = mesh_.local_peers().map_block(
      peer, region.block, region.blocks_freed, error);
  if (error != 0) fail_reading(peer, error, region.bytes);
  if (block == nullptr) return nullptr;
  return block + (region.address - region.block.base);
}

void CollectiveContext::confirm(std::span<const int> peers) {
  int failed = -1;
  const int error = mesh_.local_peers().offered(peers, call_.sequence, failed);
  if (error != 0) fail_reading(failed, error, 0);
}

void CollectiveContext::fail_reading(int peer, int error, std::size_t bytes) {
  if (error == ESRCH) {
    PeerError exited(peer, mesh_.peer_name(peer) + " exited during " +
                               call_.describe() + " (killed, or crashed?)");
    // As in Exchange: a report on the control channel names the first
    // cause better than this rank can.
    raise_pending_report(std::chrono::milliseconds(50));
    throw exited;
  }
  if (error == ECANCELED || error == EFAULT) {
    // The peer left the call (it failed: it withdraws before it reports,
    // and its caller may free the buffer at once), and its report is on
    // its way; it names the cause.
    raise_pending_report(std::min<std::chrono::milliseconds>(
        control_.timeout(), std::chrono::seconds(2)));
    if (error == ECANCELED) {
      throw PeerError(peer, mesh_.peer_name(peer) + " left " +
                                call_.describe() +
                                " while this rank read its buffers, and "
                                "did not say why");
    }
  }
  std::string text = call_.describe() + ": reading " +
                     (bytes > 0 ? std::to_string(bytes) + " bytes of " : "") +
                     "the memory of " + mesh_.peer_name(peer) +
                     " failed: " + std::strerror(error);
  if (error == EPERM || error == ENOSYS) {
    text +=
        " (the kernel allowed process_vm_readv when the group was created "
        "and refuses it now; COMM_SHM_SINGLE_COPY=0 keeps every byte on the "
        "shared-memory rings)";
  }
  throw BackendError(text);
}

void CollectiveContext::raise_pending_report(std::chrono::milliseconds grace) {
  const auto until = detail::deadline_after(grace);
  // Bounded by `until`: each round sleeps in poll until the alarm or the
  // end; an alarm about something else (a query's answer) is checked and
  // the wait goes on.
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - detail::Clock::now());
    if (left.count() <= 0) return;
    pollfd alarm{control_.alarm_fd(), POLLIN, 0};
    if (::poll(&alarm, 1, static_cast<int>(left.count())) <= 0) return;
    if (const auto report = control_.check(call_)) {
      raise_report(call_, *report);
    }
  }
}

}  // namespace comm::tcp
