#include "libcomm/distributed/ddp/safetensors_header.h"

#include <cctype>
#include <cstdint>

#include "libcomm/error.h"

namespace comm::detail {
namespace {

// A reader of the one JSON shape a safetensors header has: an object whose
// values are objects of strings, integer arrays and strings.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path)
      : text_(text), path_(path) {}

  struct Entry {
    std::string name;
    std::string dtype;
    Shape shape;
    std::uint64_t begin = 0, end = 0;
  };

  std::vector<Entry> parse(std::map<std::string, std::string>* metadata) {
    std::vector<Entry> entries;
    expect('{');
    if (peek() == '}') {
      ++at_;
      return entries;
    }
    while (true) {
      const std::string key = string();
      expect(':');
      if (key == "__metadata__") {
        expect('{');
        while (peek() != '}') {
          const std::string k = string();
          expect(':');
          const std::string v = string();
          if (metadata) (*metadata)[k] = v;
          if (peek() == ',') ++at_;
        }
        ++at_;
      } else {
        entries.push_back(entry(key));
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect('}');
      return entries;
    }
  }

 private:
  Entry entry(const std::string& name) {
    Entry e;
    e.name = name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    expect('{');
    while (true) {
      const std::string field = string();
      expect(':');
      if (field == "dtype") {
        e.dtype = string();
        has_dtype = true;
      } else if (field == "shape") {
        for (auto v : integers()) {
          if (v > static_cast<std::uint64_t>(INT64_MAX))
            fail("a dimension of '" + name + "' is too large");
          e.shape.push_back(static_cast<std::int64_t>(v));
        }
        has_shape = true;
      } else if (field == "data_offsets") {
        auto v = integers();
        if (v.size() != 2)
          fail("data_offsets of '" + name + "' is not [begin, end]");
        e.begin = v[0];
        e.end = v[1];
        has_offsets = true;
      } else {
        fail("unknown field '" + field + "' in the entry of '" + name + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect('}');
      break;
    }
    if (!has_dtype || !has_shape || !has_offsets) {
      fail("the entry of '" + name + "' lacks dtype, shape or data_offsets");
    }
    return e;
  }

  std::vector<std::uint64_t> integers() {
    std::vector<std::uint64_t> values;
    expect('[');
    skip_space();
    if (peek() == ']') {
      ++at_;
      return values;
    }
    while (true) {
      skip_space();
      std::uint64_t v = 0;
      std::size_t digits = 0;
      while (at_ < text_.size() &&
             std::isdigit(static_cast<unsigned char>(text_[at_]))) {
        if (v > (UINT64_MAX - 9) / 10) fail("a number is too large");
        v = v * 10 + static_cast<std::uint64_t>(text_[at_++] - '0');
        ++digits;
      }
      if (digits == 0) fail("expected a non-negative integer");
      values.push_back(v);
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect(']');
      return values;
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("a string is not closed");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("a string is not closed");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          const unsigned code = hex4();
          // UTF-8 for the basic plane (names are ASCII in practice).
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default: fail("an unknown escape in a string");
      }
    }
  }

  // The four hexadecimal digits of a \\u escape.
  unsigned hex4() {
    unsigned code = 0;
    for (int i = 0; i < 4; ++i, ++at_) {
      if (at_ >= text_.size()) fail("a \\u escape is cut short");
      const char c = text_[at_];
      unsigned digit = 0;
      if (c >= '0' && c <= '9') {
        digit = static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("a \\u escape has a character that is not a hexadecimal digit");
      }
      code = code * 16 + digit;
    }
    return code;
  }

  void skip_space() {
    while (at_ < text_.size() &&
           std::isspace(static_cast<unsigned char>(text_[at_])))
      ++at_;
  }
  char peek() {
    skip_space();
    return at_ < text_.size() ? text_[at_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }
  [[noreturn]] void fail(const std::string& what) {
    throw InvalidArgument("checkpoint " + path_ +
                          ": the safetensors header is malformed at byte " +
                          std::to_string(at_) + ": " + what);
  }

  const std::string& text_;
  const std::string& path_;
  std::size_t at_ = 0;
};

}  // namespace

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

std::vector<SafetensorsEntry> parse_safetensors_header(
    const std::string& header, std::uint64_t data_bytes,
    const std::string& path, std::map<std::string, std::string>* metadata) {
  HeaderParser parser(header, path);
  std::vector<SafetensorsEntry> entries;
  for (auto& e : parser.parse(metadata)) {
    SafetensorsEntry entry;
    bool known = false;
    for (DType d : kAllDTypes) {
      if (e.dtype == safetensors_dtype(d)) {
        entry.dtype = d;
        known = true;
      }
    }
    if (!known) {
      throw InvalidArgument("checkpoint " + path + ": tensor '" + e.name +
                            "' has dtype " + e.dtype +
                            ", which libcomm does not have");
    }
    // The byte count, refused where it overflows rather than wrapping to a
    // size that happens to match the offsets.
    std::uint64_t bytes = dtype_size(entry.dtype);
    bool overflow = false;
    for (auto d : e.shape) {
      const auto extent = static_cast<std::uint64_t>(d);
      if (extent != 0 && bytes > UINT64_MAX / extent) overflow = true;
      bytes *= extent;
    }
    if (overflow || e.end < e.begin || e.end > data_bytes ||
        e.end - e.begin != bytes) {
      throw InvalidArgument("checkpoint " + path + ": tensor '" + e.name +
                            "' claims bytes [" + std::to_string(e.begin) +
                            ", " + std::to_string(e.end) +
                            ") that do not match its shape or the file (" +
                            std::to_string(data_bytes) + " data bytes)");
    }
    entry.name = std::move(e.name);
    entry.shape = std::move(e.shape);
    entry.begin = e.begin;
    entry.end = e.end;
    entries.push_back(std::move(entry));
  }
  return entries;
}

}  // namespace comm::detail
