// copy_bytes: memcpy for the library's bulk copies, without the distances
// at which some CPUs' `rep movsb` crawls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace comm::detail {

// Copies `bytes` bytes from `source` to `destination`, which are either the
// same address (nothing is copied) or regions that do not overlap.
//
// glibc copies a few KiB and more with `rep movsb` on x86 CPUs that
// advertise fast string moves, and some of them (AMD EPYC of the Zen
// generations; bench/README.md, "Copy distance") then move about a
// twentieth of the bytes per second when the destination lies 1 to 31
// bytes past the source modulo 4 KiB. A copy between a ring and a user's
// buffer, or between two blocks of a user's buffers, lands there whenever
// the two addresses happen to. So where the distance modulo 4 KiB is under
// 32 bytes, the copy goes in pieces of kPieceBytes, below any size
// glibc hands to `rep movsb` by default, which its vector loops copy at
// full speed at any distance; elsewhere it is one memcpy.
inline void copy_bytes(void* destination, const void* source,
                       std::size_t bytes) {
  if (destination == source) return;
#if defined(__x86_64__)
  constexpr std::size_t kPage = 4096;
  constexpr std::size_t kNear = 32;
  constexpr std::size_t kPieceBytes = 1024;
  const std::size_t distance = (reinterpret_cast<std::uintptr_t>(destination) -
                                reinterpret_cast<std::uintptr_t>(source)) %
                               kPage;
  if (bytes > kPieceBytes && distance > 0 && distance < kNear) {
    // Read through a volatile so that the compiler never learns the
    // piece's size: knowing it, GCC inlines each memcpy as a `rep movsq`,
    // which crawls at the same distances.
    volatile std::size_t piece_bytes = kPieceBytes;
    const std::size_t piece = piece_bytes;
    auto* to = static_cast<std::uint8_t*>(destination);
    const auto* from = static_cast<const std::uint8_t*>(source);
    while (bytes > piece) {
      std::memcpy(to, from, piece);
      to += piece;
      from += piece;
      bytes -= piece;
    }
    std::memcpy(to, from, bytes);
    return;
  }
#endif
  std::memcpy(destination, source, bytes);
}

}  // namespace comm::detail
