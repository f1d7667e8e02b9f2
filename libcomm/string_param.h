// A knob whose value is free text: an address, a secret.
#pragma once

#include <optional>
#include <string>

#include "libcomm/param.h"

namespace comm {

// Whether listings may show a knob's value.
enum class ParamVisibility {
  kShown,
  // Listings and errors say only "set" or "unset"; for secrets.
  kSecret,
};

// Declared at namespace scope, in one line, where the knob is used:
//   const StringParam kAddr{"COMM_TCP_ADDR", "the address that routes to
//       MASTER_ADDR", "meaning"};
// get() is the value from the environment, or nullopt when it is unset or
// empty; `default_text` says, for listings and the README, what the caller
// does then. Every non-empty value is accepted.
class COMM_API StringParam final : public Param {
 public:
  StringParam(std::string name, std::string default_text, std::string meaning,
              ParamVisibility visibility = ParamVisibility::kShown);

  // The value set in the environment, or nullopt.
  std::optional<std::string> get() const;

 private:
  std::string type_text() const override;
  std::string default_text() const override;
  void parse(const std::string& text) const override;
  void clear() const override;
  std::string value_text() const override;

  std::string default_text_;
  mutable std::optional<std::string> value_;
};

}  // namespace comm
