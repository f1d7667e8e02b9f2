// copy_bytes: memcpy for the library's bulk copies, without the distances
// at which some CPUs' `rep movsb` crawls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace comm::detail {

// The size of copy_bytes' pieces: below the smallest size at which glibc's
// default tuning copies with `rep movsb` (2048 bytes).
inline constexpr std::size_t kCopyPieceBytes = 1024;

// Whether copy_bytes copies `bytes` bytes from `source` to `destination` in
// pieces rather than in one memcpy.
//
// glibc copies from a few KiB up to about the size of a core's L2 cache
// with `rep movsb` on x86 CPUs that advertise fast string moves, and some
// of them (bench/README.md, "Copy distance") move bytes an order of
// magnitude slower when the destination lies 1 to 31 bytes past the source
// modulo 4 KiB. Where a ring's payload lies against a user's buffer is
// chance, so those distances go in pieces below any size glibc hands to
// `rep movsb` by default, which its vector loops copy near full speed at
// any distance. kMostSplitBytes lies above the L2 sizes of the CPUs
// concerned, where glibc has switched to vector loops that outrun a series
// of pieces, so larger copies stay whole.
inline bool copies_in_pieces(const void* destination, const void* source,
                             std::size_t bytes) {
#if defined(__x86_64__)
  constexpr std::size_t kPage = 4096;
  constexpr std::size_t kSlowDistanceEnd = 32;
  constexpr std::size_t kMostSplitBytes = std::size_t{4} << 20;
  const std::size_t distance = (reinterpret_cast<std::uintptr_t>(destination) -
                                reinterpret_cast<std::uintptr_t>(source)) %
                               kPage;
  return bytes > kCopyPieceBytes && bytes <= kMostSplitBytes && distance > 0 &&
         distance < kSlowDistanceEnd;
#else
  (void)destination;
  (void)source;
  (void)bytes;
  return false;
#endif
}

// Copies `bytes` bytes from `source` to `destination`, which are either the
// same address (nothing is copied) or regions that do not overlap: one
// memcpy, or where copies_in_pieces says so, memcpy calls of kCopyPieceBytes.
inline void copy_bytes(void* destination, const void* source,
                       std::size_t bytes) {
  if (bytes == 0 || destination == source) return;
  if (!copies_in_pieces(destination, source, bytes)) {
    std::memcpy(destination, source, bytes);
    return;
  }
  // Read through a volatile so that the compiler does not learn the
  // piece's size: knowing it, GCC may inline each memcpy as a `rep movsq`,
  // which crawls at the same distances.
  volatile std::size_t piece_bytes = kCopyPieceBytes;
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
}

}  // namespace comm::detail
