// Where a tensor's memory lives.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "libcomm/export.h"

namespace comm {

enum class DeviceType : std::uint8_t { kCPU, kCUDA };

struct COMM_API Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // the CUDA ordinal; always 0 for the CPU

  static constexpr Device cpu() { return Device{}; }
  static constexpr Device cuda(int ordinal) {
    return Device{DeviceType::kCUDA, ordinal};
  }
  constexpr bool is_cpu() const { return type == DeviceType::kCPU; }
  constexpr bool is_cuda() const { return type == DeviceType::kCUDA; }
  friend constexpr bool operator==(Device, Device) = default;

  // "cpu" or "cuda:N".
  std::string str() const;

  // Parses "cpu", "cuda" (ordinal 0) or "cuda:N". Throws InvalidArgument.
  static Device parse(std::string_view text);
};

}  // namespace comm
