#include "libcomm/distributed/ddp/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

#include "libcomm/error.h"

namespace comm {
namespace {

// safetensors' names for libcomm's dtypes.
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

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

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
        for (auto v : integers())
          e.shape.push_back(static_cast<std::int64_t>(v));
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
          if (at_ + 4 > text_.size()) fail("a \\u escape is cut short");
          const unsigned code = static_cast<unsigned>(
              std::stoul(text_.substr(at_, 4), nullptr, 16));
          at_ += 4;
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

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      header += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
      first = false;
    }
    header += "}";
  }
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (!names.insert(name).second) {
      throw InvalidArgument("checkpoint " + path + ": two tensors are named '" +
                            name + "'");
    }
    tensor.check_contiguous("checkpoint tensor '" + name + "'");
    std::string shape;
    for (std::size_t d = 0; d < tensor.shape().size(); ++d)
      shape += (d ? "," : "") + std::to_string(tensor.shape()[d]);
    header += (header.size() > 1 ? "," : "") + json_string(name) +
              ":{\"dtype\":\"" + safetensors_dtype(tensor.dtype()) +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," +
              std::to_string(offset + tensor.nbytes()) + "]}";
    offset += tensor.nbytes();
  }
  header += "}";
  // The data starts 8-byte aligned, as the format recommends.
  while ((header.size() + 8) % 8 != 0) header += ' ';

  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    std::uint64_t length = header.size();
    unsigned char length_bytes[8];
    for (int i = 0; i < 8; ++i)
      length_bytes[i] = static_cast<unsigned char>(length >> (8 * i));
    out.write(reinterpret_cast<const char*>(length_bytes), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& [name, tensor] : tensors) {
      const Tensor host =
          tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
      out.write(static_cast<const char*>(host.data_ptr()),
                static_cast<std::streamsize>(host.nbytes()));
    }
    out.flush();
    if (!out) {
      const int error = errno;
      std::remove(temporary.c_str());
      throw SystemError(error, "writing checkpoint " + temporary);
    }
  }
  // Durable before it takes the name.
  const int fd = ::open(temporary.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    throw SystemError(error, "renaming " + temporary + " to " + path);
  }
}

NamedTensors read_safetensors(const std::string& path, Device device,
                              std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SystemError(errno, "opening checkpoint " + path);
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char length_bytes[8] = {};
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  std::uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= std::uint64_t{length_bytes[i]} << (8 * i);
  if (!in || file_size < 8 || length > file_size - 8 || length > (100u << 20)) {
    throw InvalidArgument("checkpoint " + path +
                          " is not a safetensors file (its header length " +
                          std::to_string(length) + " does not fit its " +
                          std::to_string(file_size) + " bytes)");
  }
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  const std::uint64_t data_size = file_size - 8 - length;
  HeaderParser parser(header, path);
  NamedTensors tensors;
  for (const auto& e : parser.parse(metadata)) {
    DType dtype;
    bool known = false;
    for (DType d : kAllDTypes) {
      if (e.dtype == safetensors_dtype(d)) {
        dtype = d;
        known = true;
      }
    }
    if (!known) {
      throw InvalidArgument("checkpoint " + path + ": tensor '" + e.name +
                            "' has dtype " + e.dtype +
                            ", which libcomm does not have");
    }
    std::uint64_t elements = 1;
    for (auto d : e.shape) elements *= static_cast<std::uint64_t>(d);
    if (e.end < e.begin || e.end > data_size ||
        e.end - e.begin != elements * dtype_size(dtype)) {
      throw InvalidArgument("checkpoint " + path + ": tensor '" + e.name +
                            "' claims bytes [" + std::to_string(e.begin) +
                            ", " + std::to_string(e.end) +
                            ") that do not match its shape or the file (" +
                            std::to_string(data_size) + " data bytes)");
    }
    Tensor host = Tensor::empty(e.shape, dtype, Device::cpu());
    in.seekg(static_cast<std::streamoff>(8 + length + e.begin));
    in.read(static_cast<char*>(host.data_ptr()),
            static_cast<std::streamsize>(e.end - e.begin));
    if (!in) throw SystemError(errno, "reading checkpoint " + path);
    tensors.emplace_back(e.name, device.is_cpu() ? host : host.to(device));
  }
  return tensors;
}

void save_checkpoint(ProcessGroup& group, const std::string& path,
                     const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata) {
  if (group.rank() == 0) write_safetensors(path, tensors, metadata);
  group.barrier()->wait();
}

NamedTensors load_checkpoint(const std::string& path, Device device) {
  return read_safetensors(path, device);
}

void restore(const NamedTensors& loaded, const NamedTensors& into) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : loaded) by_name[name] = &t;
  // Check everything first, so that a bad checkpoint changes nothing.
  for (const auto& [name, target] : into) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      throw InvalidArgument("restore: the checkpoint has no tensor named '" +
                            name + "'");
    }
    if (it->second->shape() != target.shape() ||
        it->second->dtype() != target.dtype()) {
      throw InvalidArgument("restore: '" + name + "' is " +
                            it->second->describe() + " in the checkpoint but " +
                            target.describe() + " here");
    }
  }
  for (const auto& [name, target] : into) {
    Tensor destination = target;
    destination.copy_(*by_name[name]);
  }
}

}  // namespace comm
