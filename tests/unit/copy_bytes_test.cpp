// comm::detail::copy_bytes: every byte arrives, and nothing outside the
// destination changes, at every distance from source to destination modulo
// 4 KiB under two cache lines and around the page, for sizes on both sides
// of its piece size.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "libcomm/detail/copy_bytes.h"

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::uint8_t kGuard = 0xee;

std::uint8_t pattern(std::size_t i) {
  return static_cast<std::uint8_t>(i * 131 + 7);
}

}  // namespace

TEST_CASE("copy_bytes copies exactly the bytes asked at every distance",
          "[copy_bytes]") {
  const std::size_t sizes[] = {0,    1,    63,   1023, 1024, 1025,
                               2048, 2112, 4096, 4097, 70001};
  std::vector<std::size_t> distances;
  for (std::size_t d = 0; d < 128; ++d) distances.push_back(d);
  for (std::size_t d = kPage - 64; d < kPage + 64; d += 3) {
    distances.push_back(d);
  }
  constexpr std::size_t kLargest = 70001;
  std::vector<std::uint8_t> source(kLargest);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = pattern(i);
  // Room for the largest copy at the largest distance, with guard bytes on
  // both sides.
  std::vector<std::uint8_t> destination(kLargest + 2 * kPage + 256);
  // The distance is measured from the source's address modulo 4 KiB, so
  // the destination starts where the source does within a page.
  const auto source_offset =
      reinterpret_cast<std::uintptr_t>(source.data()) % kPage;
  const auto destination_offset =
      reinterpret_cast<std::uintptr_t>(destination.data()) % kPage;
  const std::size_t base =
      64 + (source_offset + kPage - (destination_offset + 64) % kPage) % kPage;
  for (std::size_t bytes : sizes) {
    for (std::size_t distance : distances) {
      INFO(bytes << " bytes, " << distance << " bytes past the source");
      std::uint8_t* to = destination.data() + base + distance;
      REQUIRE((reinterpret_cast<std::uintptr_t>(to) -
               reinterpret_cast<std::uintptr_t>(source.data())) %
                  kPage ==
              distance % kPage);
      std::fill(destination.begin(), destination.end(), kGuard);
      comm::detail::copy_bytes(to, source.data(), bytes);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < bytes; ++i) wrong += to[i] != pattern(i);
      CHECK(wrong == 0);
      std::size_t touched = 0;
      for (std::uint8_t* p = destination.data(); p < to; ++p) {
        touched += *p != kGuard;
      }
      for (std::uint8_t* p = to + bytes;
           p < destination.data() + destination.size(); ++p) {
        touched += *p != kGuard;
      }
      CHECK(touched == 0);
    }
  }
}

TEST_CASE("copy_bytes onto its own source changes nothing", "[copy_bytes]") {
  std::vector<std::uint8_t> buffer(5000);
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = pattern(i);
  comm::detail::copy_bytes(buffer.data(), buffer.data(), buffer.size());
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    REQUIRE(buffer[i] == pattern(i));
  }
}

#if defined(__x86_64__)
TEST_CASE("copy_bytes splits exactly the distances rep movsb crawls at",
          "[copy_bytes]") {
  using comm::detail::copies_in_pieces;
  alignas(4096) static std::uint8_t page[3 * kPage];
  const std::uint8_t* source = page + kPage;
  constexpr std::size_t kBytes = 64 << 10;
  // Destination past the source by 1-31 bytes, modulo 4 KiB: in pieces.
  for (std::size_t d : {std::size_t{1}, std::size_t{16}, std::size_t{31},
                        kPage + 1, kPage + 31}) {
    INFO("destination " << d << " bytes past the source");
    CHECK(copies_in_pieces(page + kPage + d, source, kBytes));
  }
  // The same address modulo 4 KiB, 32 bytes and more past it, or before
  // it: whole.
  for (std::size_t d : {std::size_t{0}, std::size_t{32}, std::size_t{64},
                        kPage - 1, kPage, kPage + 32}) {
    INFO("destination " << d << " bytes past the source");
    CHECK_FALSE(copies_in_pieces(page + kPage + d, source, kBytes));
  }
  CHECK_FALSE(copies_in_pieces(page + kPage - 16, source, kBytes));
  // A copy of one piece or less, or larger than 4 MiB, is whole whatever
  // the distance.
  CHECK_FALSE(copies_in_pieces(page + kPage + 16, source,
                               comm::detail::kCopyPieceBytes));
  CHECK(copies_in_pieces(page + kPage + 16, source,
                         comm::detail::kCopyPieceBytes + 1));
  CHECK(copies_in_pieces(page + kPage + 16, source, std::size_t{4} << 20));
  CHECK_FALSE(
      copies_in_pieces(page + kPage + 16, source, (std::size_t{4} << 20) + 1));
}
#endif
