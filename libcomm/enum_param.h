// A knob that takes one word of a fixed list.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "libcomm/param.h"

namespace comm {

// Declared at namespace scope, in one line, where the knob is used:
//   const EnumParam kKernels{"COMM_REDUCE_KERNELS", {"auto", "portable"},
//                            "auto", "meaning"};
// get() is the word from the environment when set, else `default_word`, in
// the spelling of `words`: the environment's value is matched ignoring case,
// and any other value is an InvalidArgument listing the words (see param.h).
class COMM_API EnumParam final : public Param {
 public:
  EnumParam(std::string name, std::initializer_list<const char*> words,
            std::string default_word, std::string meaning);

  // The word in force. Throws InvalidArgument when the environment's value
  // is none of the words.
  const std::string& get() const;

 private:
  std::string type_text() const override;
  std::string default_text() const override;
  void parse(const std::string& text) const override;
  void clear() const override;
  std::string value_text() const override;

  // "a, b, c": the words in their declared order.
  std::string word_list() const;

  std::vector<std::string> words_;
  std::string default_;
  mutable std::string value_;
};

}  // namespace comm
