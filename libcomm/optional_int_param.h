// An integer knob whose default, when it is unset, the caller computes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "libcomm/param.h"

namespace comm {

// Declared at namespace scope, in one line, where the knob is used:
//   const OptionalIntParam kThreshold{"COMM_X_BYTES", "65536 at world size
//       2, else 4096", 0, 1 << 30, "meaning"};
// `default_text` says, for listings and the README, what the caller uses
// when the knob is unset. get() is the value from the environment, or
// nullopt when unset; a value that is not a whole decimal integer from `min`
// to `max` is an InvalidArgument (see param.h).
class COMM_API OptionalIntParam final : public Param {
 public:
  OptionalIntParam(std::string name, std::string default_text, std::int64_t min,
                   std::int64_t max, std::string meaning);

  // The value set in the environment, or nullopt. Throws InvalidArgument
  // when the environment's value is bad.
  std::optional<std::int64_t> get() const;

 private:
  std::string type_text() const override;
  std::string default_text() const override;
  void parse(const std::string& text) const override;
  void clear() const override;
  std::string value_text() const override;

  std::string default_text_;
  std::int64_t min_;
  std::int64_t max_;
  mutable std::optional<std::int64_t> value_;
};

}  // namespace comm
