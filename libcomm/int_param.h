// An integer knob with a fixed default and an accepted range.
#pragma once

#include <cstdint>
#include <string>

#include "libcomm/param.h"

namespace comm {

// Declared at namespace scope, in one line, where the knob is used:
//   const IntParam kSpinUs{"COMM_TCP_SPIN_US", 50, 0, 10000, "meaning"};
// get() is the value from the environment when set, else `default_value`; a
// value that is not a whole decimal integer from `min` to `max` is an
// InvalidArgument (see param.h).
class COMM_API IntParam final : public Param {
 public:
  IntParam(std::string name, std::int64_t default_value, std::int64_t min,
           std::int64_t max, std::string meaning);

  // The value in force. Throws InvalidArgument when the environment's value
  // is bad.
  std::int64_t get() const;

 private:
  std::string type_text() const override;
  std::string default_text() const override;
  void parse(const std::string& text) const override;
  void clear() const override;
  std::string value_text() const override;

  std::int64_t default_;
  std::int64_t min_;
  std::int64_t max_;
  mutable std::int64_t value_;
};

}  // namespace comm
