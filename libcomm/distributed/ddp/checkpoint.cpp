#include "libcomm/distributed/ddp/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

#include "libcomm/distributed/ddp/safetensors_header.h"
#include "libcomm/error.h"

namespace comm {
namespace {

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
              ":{\"dtype\":\"" + detail::safetensors_dtype(tensor.dtype()) +
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
  NamedTensors tensors;
  for (const auto& e :
       detail::parse_safetensors_header(header, data_size, path, metadata)) {
    Tensor host = Tensor::empty(e.shape, e.dtype, Device::cpu());
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
