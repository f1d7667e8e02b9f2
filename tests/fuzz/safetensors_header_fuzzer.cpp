// libFuzzer target for the checkpoint loader's safetensors header parser
// (comm::detail::parse_safetensors_header, the function load_checkpoint
// calls): the input's first 8 bytes are the size of the data section (as a
// little-endian integer), the rest is the JSON header. The parser must
// return or throw InvalidArgument, nothing else; any other exception
// escapes and fails the run. What it returns must keep its promises: a
// byte range inside the data section that fits the shape and dtype.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "libcomm/distributed/ddp/safetensors_header.h"
#include "libcomm/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t data_bytes = 0;
  for (int i = 0; i < 8; ++i) data_bytes |= std::uint64_t{data[i]} << (8 * i);
  const std::string header(reinterpret_cast<const char*>(data) + 8, size - 8);
  std::map<std::string, std::string> metadata;
  std::vector<comm::detail::SafetensorsEntry> entries;
  try {
    entries = comm::detail::parse_safetensors_header(header, data_bytes, "fuzz",
                                                     &metadata);
  } catch (const comm::InvalidArgument&) {
    return 0;
  }
  for (const auto& e : entries) {
    std::uint64_t bytes = comm::dtype_size(e.dtype);
    for (std::int64_t d : e.shape) {
      if (d < 0) std::abort();
      const auto extent = static_cast<std::uint64_t>(d);
      if (extent != 0 && bytes > UINT64_MAX / extent) std::abort();
      bytes *= extent;
    }
    if (e.begin > e.end || e.end > data_bytes || e.end - e.begin != bytes) {
      std::abort();
    }
  }
  return 0;
}
