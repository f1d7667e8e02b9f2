// The JSON header of a safetensors file, parsed and checked against the
// file's data section. Internal to libcomm (not installed): the checkpoint
// loader reads files through it, and the unit tests and the fuzzer call it
// directly on header text.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "libcomm/dtype.h"
#include "libcomm/tensor.h"

namespace comm::detail {

// One tensor of the file: its bytes are data[begin, end) of the data
// section that follows the header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

// safetensors' name of a dtype ("F32", "BF16", ...).
const char* safetensors_dtype(DType dtype);

// Parses `header` (the JSON object of a safetensors file, whose data
// section holds `data_bytes` bytes) into its entries, in file order, and
// fills `metadata` (when not null) with the "__metadata__" strings. Every
// entry it returns has a dtype libcomm knows, non-negative dimensions whose
// product times the dtype's size is end - begin without overflow, and
// end <= data_bytes. Throws InvalidArgument naming `path` and the byte
// where the header went wrong, and nothing else, for any input.
std::vector<SafetensorsEntry> parse_safetensors_header(
    const std::string& header, std::uint64_t data_bytes,
    const std::string& path, std::map<std::string, std::string>* metadata);

}  // namespace comm::detail
