// The C API: extern "C" over the C++ API. Each entry point checks its
// handles against the table of live ones, turns its arguments into Tensors
// that view the caller's memory, calls the ProcessGroup, and turns every
// exception into a comm_result_t and a thread-local message.
#include "comm/comm.h"

#include <dlpack/dlpack.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "libcomm/cuda.h"
#include "libcomm/detail/collective_args.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "libcomm/param.h"
#include "libcomm/shared_host_memory.h"
#include "libcomm/tensor.h"
#include "libcomm/tensor_dlpack.h"
#include "libcomm/version.h"
#include "libcomm/work.h"
#include "store/file_store.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"

struct comm_store {
  std::shared_ptr<comm::Store> store;
};

struct comm_group {
  std::shared_ptr<comm::ProcessGroup> group;
};

struct comm_work {
  std::shared_ptr<comm::Work> work;
  // The CUDA stream the operation was issued on, which comm_work_wait makes
  // current again; device -1 for host buffers or the current stream.
  int device = -1;
  void* stream = nullptr;
};

namespace {

using comm::Device;
using comm::DType;
using comm::InvalidArgument;
using comm::ReduceOp;
using comm::Tensor;
using Millis = std::chrono::milliseconds;

thread_local std::string last_error;

// The handles alive now, with their kind. Checking a handle is a lookup
// here, never a read through the pointer, so a freed handle is reported
// instead of being dereferenced.
enum class HandleKind { kStore, kGroup, kWork };

struct HandleTable {
  std::mutex mutex;
  std::unordered_map<const void*, HandleKind> live;
};

HandleTable& handles() {
  static auto* table = new HandleTable;  // never destroyed: atexit-safe
  return *table;
}

template <typename H>
constexpr HandleKind kind_of();
template <>
constexpr HandleKind kind_of<comm_store>() {
  return HandleKind::kStore;
}
template <>
constexpr HandleKind kind_of<comm_group>() {
  return HandleKind::kGroup;
}
template <>
constexpr HandleKind kind_of<comm_work>() {
  return HandleKind::kWork;
}

template <typename H>
constexpr const char* type_name() {
  if constexpr (kind_of<H>() == HandleKind::kStore) return "comm_store_t";
  if constexpr (kind_of<H>() == HandleKind::kGroup) return "comm_group_t";
  return "comm_work_t";
}

template <typename H>
H* adopt(std::unique_ptr<H> handle) {
  std::lock_guard lock(handles().mutex);
  handles().live.emplace(handle.get(), kind_of<H>());
  return handle.release();
}

// Throws InvalidArgument naming `argument` unless `handle` is a live handle
// of kind H. Called with the table's mutex held.
template <typename H>
void check_live_locked(H* handle, const char* argument) {
  if (handle == nullptr) {
    throw InvalidArgument(std::string("`") + argument + "` is NULL; pass a " +
                          type_name<H>() + " that a create call returned");
  }
  auto it = handles().live.find(handle);
  if (it == handles().live.end() || it->second != kind_of<H>()) {
    throw InvalidArgument(std::string("`") + argument + "` is not a live " +
                          type_name<H>() +
                          ": it was freed already, or is another kind of "
                          "handle, or was never created");
  }
}

template <typename H>
H& live(H* handle, const char* argument) {
  std::lock_guard lock(handles().mutex);
  check_live_locked(handle, argument);
  return *handle;
}

// Checks and forgets `handle` in one step under the table's mutex, so that
// of two threads freeing one handle at once, one frees it and the other is
// told it was freed already.
template <typename H>
void release(H* handle, const char* argument) {
  {
    std::lock_guard lock(handles().mutex);
    check_live_locked(handle, argument);
    handles().live.erase(handle);
  }
  delete handle;
}

comm_result_t result_of(comm::ErrorKind kind) {
  switch (kind) {
    case comm::ErrorKind::kInvalidArgument: return COMM_INVALID_ARGUMENT;
    case comm::ErrorKind::kTimeout: return COMM_TIMEOUT;
    case comm::ErrorKind::kPeer: return COMM_PEER_ERROR;
    case comm::ErrorKind::kMismatch: return COMM_MISMATCH;
    case comm::ErrorKind::kBackend: return COMM_BACKEND_ERROR;
    case comm::ErrorKind::kSystem: return COMM_SYSTEM_ERROR;
    case comm::ErrorKind::kUnsupported: return COMM_UNSUPPORTED;
  }
  return COMM_INTERNAL_ERROR;
}

comm_result_t fail(comm_result_t result, const char* function,
                   const char* message) {
  last_error = std::string(function) + ": " + message;
  return result;
}

// Runs `body`, which reports failure by throwing, and converts what it
// throws. Nothing escapes: this is the boundary the header promises.
template <typename Body>
comm_result_t guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return COMM_SUCCESS;
  } catch (const comm::Error& e) {
    return fail(result_of(e.kind()), function, e.what());
  } catch (const std::bad_alloc&) {
    return fail(COMM_SYSTEM_ERROR, function, "out of memory");
  } catch (const std::exception& e) {
    return fail(COMM_INTERNAL_ERROR, function, e.what());
  } catch (...) {
    return fail(COMM_INTERNAL_ERROR, function, "an unknown exception");
  }
}

void require_out(const void* out, const char* argument) {
  if (out == nullptr) {
    throw InvalidArgument(std::string("the output argument `") + argument +
                          "` is NULL");
  }
}

std::string require_text(const char* text, const char* argument) {
  if (text == nullptr) {
    throw InvalidArgument(std::string("`") + argument + "` is NULL");
  }
  return text;
}

Millis timeout_of(std::int64_t timeout_ms, Millis fallback) {
  if (timeout_ms == COMM_DEFAULT_TIMEOUT) return fallback;
  if (timeout_ms < 0) {
    throw InvalidArgument("timeout " + std::to_string(timeout_ms) +
                          " ms is negative; pass milliseconds, or "
                          "COMM_DEFAULT_TIMEOUT (-1) for the default");
  }
  return Millis(timeout_ms);
}

// The integer a C caller passed for an enum. C lets an enum object hold any
// int, while in C++ reading one outside the enumerators' range is undefined,
// so the bytes are read as an int and never loaded as the enum.
template <typename Enum>
int raw_value(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int));
  int raw = 0;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

DType dtype_of(const comm_dtype_t& dtype) {
  const int value = raw_value(dtype);
  if (value < 0 || value >= static_cast<int>(comm::kAllDTypes.size())) {
    throw InvalidArgument("dtype " + std::to_string(value) +
                          " is not a comm_dtype_t (COMM_FLOAT16 = 0 to "
                          "COMM_BOOL = 8)");
  }
  return comm::kAllDTypes[value];
}

ReduceOp op_of(const comm_reduce_op_t& op) {
  const int value = raw_value(op);
  if (value < 0 || value >= static_cast<int>(comm::kAllReduceOps.size())) {
    throw InvalidArgument("op " + std::to_string(value) +
                          " is not a comm_reduce_op_t (COMM_SUM = 0 to "
                          "COMM_BXOR = 7)");
  }
  return comm::kAllReduceOps[value];
}

// The end of every collective: hand out the Work, or wait for it. An
// unbounded wait on the NCCL backend orders the current stream after the
// operation instead of blocking, as ncclAllReduce does. Since the blocking
// form (`work` NULL) waits at once, every collective passes async_op =
// `work` != NULL in its options, so that a backend may run it on this
// thread (options.h).
void finish(std::shared_ptr<comm::Work> started, comm_work_t* work,
            int* source = nullptr, int device = -1, void* stream = nullptr) {
  if (work != nullptr) {
    *work = adopt(std::make_unique<comm_work>(
        comm_work{std::move(started), stream ? device : -1, stream}));
    return;
  }
  started->wait();
  if (source != nullptr) *source = started->source_rank();
}

// Where the buffers of one call live, and the stream it is ordered on for
// its duration (see the header: the caller's stream becomes the current
// one, which is what the backends order themselves after).
class Placement {
 public:
  Placement(int device, void* stream) {
    if (device < COMM_CPU) {
      throw InvalidArgument("device " + std::to_string(device) +
                            " is neither COMM_CPU (-1) nor a CUDA ordinal");
    }
    if (device == COMM_CPU) {
      if (stream != nullptr) {
        throw InvalidArgument(
            "a CUDA stream was given for host buffers (device COMM_CPU); "
            "pass NULL, or the buffers' CUDA device");
      }
      return;
    }
    device_ = Device::cuda(device);
    stream_ = stream;
    if (stream != nullptr) guard_.emplace(device, stream);
  }

  Device device() const { return device_; }

  void finish(std::shared_ptr<comm::Work> started, comm_work_t* work,
              int* source = nullptr) const {
    ::finish(std::move(started), work, source, device_.index,
             guard_ ? stream_ : nullptr);
  }

  // A view of `count` elements at `data`. NULL is allowed for no elements.
  Tensor view(const void* data, std::size_t count, DType dtype,
              const char* argument) const {
    if (count > static_cast<std::size_t>(
                    std::numeric_limits<std::int64_t>::max() / 8)) {
      throw InvalidArgument(std::string("the count of `") + argument +
                            "` is too large: " + std::to_string(count));
    }
    if (data == nullptr && count > 0) {
      throw InvalidArgument(std::string("`") + argument + "` is NULL but " +
                            std::to_string(count) + " elements were asked");
    }
    // An empty view still needs an address; it is never read or written.
    static std::byte nowhere[8];
    void* address = data != nullptr ? const_cast<void*>(data) : nowhere;
    return Tensor::from_blob(address, {static_cast<std::int64_t>(count)}, dtype,
                             device_);
  }

  // Before a host-side copy from a CUDA buffer, the work the caller queued
  // on its stream (which may still be writing that buffer) must be done.
  void wait_for_caller_stream() const {
    if (device_.is_cuda()) comm::synchronize_cuda_stream(device_.index);
  }

 private:
  Device device_ = Device::cpu();
  void* stream_ = nullptr;
  std::optional<comm::CudaStreamGuard> guard_;
};

// `input`, or a copy of it when it overlaps `output`: the backends read an
// input while writing their output and take no partial overlap (the
// in-place all_gather and reduce_scatter of NCCL's API overlap partly).
// With `whole_ok`, input == output (the same memory exactly) is passed
// through, for the calls whose backends work in place.
// A copy of `t`, in shared host memory where `t` lies in it
// (comm_mem_alloc): a rank's buffers decide, with its peers', whether a
// collective reads them directly, and the copy must not change that.
Tensor clone_alike(const Tensor& t) {
  if (!t.device().is_cpu() ||
      !comm::find_shared_host(t.data_ptr(), t.nbytes())) {
    return t.clone();
  }
  Tensor copy = Tensor::shared_host_zeros(t.shape(), t.dtype());
  copy.copy_(t);
  return copy;
}

Tensor apart_from(const Tensor& input, const Tensor& output,
                  const Placement& placement, bool whole_ok = false) {
  if (!comm::detail::overlaps(input, output)) return input;
  if (whole_ok && input.data_ptr() == output.data_ptr() &&
      input.nbytes() == output.nbytes()) {
    return input;
  }
  placement.wait_for_caller_stream();
  return clone_alike(input);
}

// Copies `from` into `into` unless they are the same memory.
void copy_unless_same(Tensor& into, const Tensor& from,
                      const Placement& placement) {
  if (into.data_ptr() == from.data_ptr() || into.numel() == 0) return;
  placement.wait_for_caller_stream();
  into.copy_(from);
}

// `count` blocks of `size` elements each, viewing `flat`.
std::vector<Tensor> blocks(const Tensor& flat, int count, std::size_t size) {
  std::vector<Tensor> out;
  out.reserve(count);
  for (int r = 0; r < count; ++r) {
    const auto begin = static_cast<std::int64_t>(r * size);
    out.push_back(flat.slice(begin, begin + static_cast<std::int64_t>(size)));
  }
  return out;
}

comm::ProcessGroup& group_of(comm_group_t group) {
  return *live(group, "group").group;
}

// count * group.size(): the elements of a buffer of one block per rank.
// Throws InvalidArgument naming `argument` when the product does not fit.
std::size_t times_world(std::size_t count, comm::ProcessGroup& group,
                        const char* argument) {
  std::size_t total = 0;
  if (__builtin_mul_overflow(count, static_cast<std::size_t>(group.size()),
                             &total)) {
    throw InvalidArgument(
        std::string("`") + argument + "`: " + std::to_string(count) +
        " elements per rank times " + std::to_string(group.size()) +
        " ranks overflows size_t");
  }
  return total;
}

// The sum of `counts[0..n)`. Throws InvalidArgument naming `argument` when
// it does not fit.
std::size_t sum_of_counts(const std::size_t* counts, int n,
                          const char* argument) {
  std::size_t total = 0;
  for (int r = 0; r < n; ++r) {
    if (__builtin_add_overflow(total, counts[r], &total)) {
      throw InvalidArgument(std::string("`") + argument +
                            "`: the counts add up past size_t (at rank " +
                            std::to_string(r) + ", " +
                            std::to_string(counts[r]) + ")");
    }
  }
  return total;
}

// A borrowed view of a DLPack tensor: no deleter runs, as the header says.
Tensor view_dlpack(DLManagedTensor* managed, const char* argument) {
  if (managed == nullptr) {
    throw InvalidArgument(std::string("`") + argument + "` is NULL");
  }
  Tensor tensor = comm::view_dlpack(*managed);
  tensor.check_contiguous(argument);
  return tensor;
}

// The device argument that describes where `tensor` lives.
int device_arg(const Tensor& tensor) {
  return tensor.device().is_cuda() ? tensor.device().index : COMM_CPU;
}

}  // namespace

extern "C" {

const char* comm_result_string(comm_result_t result) {
  switch (result) {
    case COMM_SUCCESS: return "success";
    case COMM_INVALID_ARGUMENT: return "invalid argument";
    case COMM_TIMEOUT: return "timeout";
    case COMM_PEER_ERROR: return "peer error";
    case COMM_MISMATCH: return "mismatched collective calls";
    case COMM_BACKEND_ERROR: return "backend error";
    case COMM_SYSTEM_ERROR: return "system error";
    case COMM_UNSUPPORTED: return "unsupported";
    case COMM_INTERNAL_ERROR: return "internal error";
  }
  return "unknown result code";
}

const char* comm_last_error(void) { return last_error.c_str(); }

int comm_version(void) { return COMM_VERSION_CODE; }

// ---- Configuration --------------------------------------------------------

comm_result_t comm_config_dump(FILE* stream) {
  return guarded(__func__, [&] {
    if (stream == nullptr) throw InvalidArgument("`stream` is NULL");
    const std::string text = comm::format_params();
    if (std::fwrite(text.data(), 1, text.size(), stream) != text.size() ||
        std::fflush(stream) != 0) {
      throw comm::SystemError(errno, "writing the configuration");
    }
  });
}

// ---- Stores ---------------------------------------------------------------

static comm_result_t create_tcp(const char* function, const char* host,
                                int port, std::int64_t timeout_ms,
                                bool is_server, comm_store_t* store) {
  return guarded(function, [&] {
    require_out(store, "store");
    if (port < 0 || port > 65535 || (port == 0 && !is_server)) {
      throw InvalidArgument("port " + std::to_string(port) +
                            " is outside 1-65535" +
                            (is_server ? " (or 0 to pick one)" : ""));
    }
    comm::TCPStoreOptions options;
    options.host = require_text(host, "host");
    options.port = static_cast<std::uint16_t>(port);
    options.is_server = is_server;
    options.timeout = timeout_of(timeout_ms, comm::Store::kDefaultTimeout);
    *store = adopt(std::make_unique<comm_store>(
        comm_store{std::make_shared<comm::TCPStore>(options)}));
  });
}

comm_result_t comm_store_create_tcp(const char* host, int port,
                                    int64_t timeout_ms, comm_store_t* store) {
  return create_tcp(__func__, host, port, timeout_ms, true, store);
}

comm_result_t comm_store_connect_tcp(const char* host, int port,
                                     int64_t timeout_ms, comm_store_t* store) {
  return create_tcp(__func__, host, port, timeout_ms, false, store);
}

comm_result_t comm_store_create_file(const char* path, int64_t timeout_ms,
                                     comm_store_t* store) {
  return guarded(__func__, [&] {
    require_out(store, "store");
    *store = adopt(std::make_unique<comm_store>(
        comm_store{std::make_shared<comm::FileStore>(
            require_text(path, "path"),
            timeout_of(timeout_ms, comm::Store::kDefaultTimeout))}));
  });
}

comm_result_t comm_store_create_hash(int64_t timeout_ms, comm_store_t* store) {
  return guarded(__func__, [&] {
    require_out(store, "store");
    *store = adopt(std::make_unique<comm_store>(
        comm_store{std::make_shared<comm::HashStore>(
            timeout_of(timeout_ms, comm::Store::kDefaultTimeout))}));
  });
}

comm_result_t comm_store_create_prefix(const char* prefix, comm_store_t base,
                                       comm_store_t* store) {
  return guarded(__func__, [&] {
    require_out(store, "store");
    auto inner = live(base, "base").store;
    *store = adopt(std::make_unique<comm_store>(
        comm_store{std::make_shared<comm::PrefixStore>(
            require_text(prefix, "prefix"), std::move(inner))}));
  });
}

comm_result_t comm_store_port(comm_store_t store, int* port) {
  return guarded(__func__, [&] {
    require_out(port, "port");
    auto* tcp = dynamic_cast<comm::TCPStore*>(live(store, "store").store.get());
    if (tcp == nullptr) {
      throw InvalidArgument("`store` is not a TCP store, so it has no port");
    }
    *port = tcp->port();
  });
}

comm_result_t comm_store_set(comm_store_t store, const char* key,
                             const void* value, size_t size) {
  return guarded(__func__, [&] {
    comm::Store& s = *live(store, "store").store;
    if (value == nullptr && size > 0) {
      throw InvalidArgument("`value` is NULL but size is " +
                            std::to_string(size));
    }
    const auto* bytes = static_cast<const std::uint8_t*>(value);
    s.set(require_text(key, "key"),
          size == 0 ? comm::Bytes{} : comm::Bytes(bytes, bytes + size));
  });
}

comm_result_t comm_store_get(comm_store_t store, const char* key, void* buffer,
                             size_t capacity, size_t* size,
                             int64_t timeout_ms) {
  return guarded(__func__, [&] {
    comm::Store& s = *live(store, "store").store;
    require_out(size, "size");
    const std::string name = require_text(key, "key");
    const comm::Bytes value = s.get(name, timeout_of(timeout_ms, s.timeout()));
    *size = value.size();
    if (value.size() > capacity) {
      throw InvalidArgument(
          "the value of key '" + name + "' is " + std::to_string(value.size()) +
          " bytes and the buffer holds " + std::to_string(capacity) +
          "; *size says how much to allocate");
    }
    if (!value.empty()) {
      if (buffer == nullptr) throw InvalidArgument("`buffer` is NULL");
      std::memcpy(buffer, value.data(), value.size());
    }
  });
}

comm_result_t comm_store_add(comm_store_t store, const char* key, int64_t delta,
                             int64_t* value) {
  return guarded(__func__, [&] {
    comm::Store& s = *live(store, "store").store;
    const std::int64_t sum = s.add(require_text(key, "key"), delta);
    if (value != nullptr) *value = sum;
  });
}

comm_result_t comm_store_wait(comm_store_t store, const char* const* keys,
                              size_t count, int64_t timeout_ms) {
  return guarded(__func__, [&] {
    comm::Store& s = *live(store, "store").store;
    if (keys == nullptr && count > 0) throw InvalidArgument("`keys` is NULL");
    std::vector<std::string> names;
    names.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      names.push_back(
          require_text(keys[i], ("keys[" + std::to_string(i) + "]").c_str()));
    }
    s.wait(names, timeout_of(timeout_ms, s.timeout()));
  });
}

comm_result_t comm_store_delete(comm_store_t store, const char* key,
                                int* deleted) {
  return guarded(__func__, [&] {
    comm::Store& s = *live(store, "store").store;
    const bool was_there = s.delete_key(require_text(key, "key"));
    if (deleted != nullptr) *deleted = was_there ? 1 : 0;
  });
}

comm_result_t comm_store_free(comm_store_t store) {
  return guarded(__func__, [&] { release(store, "store"); });
}

// ---- Groups ---------------------------------------------------------------

comm_result_t comm_init(const char* backend, const char* init_method, int rank,
                        int world_size, int64_t timeout_ms,
                        comm_group_t* group) {
  return guarded(__func__, [&] {
    require_out(group, "group");
    auto created = comm::init_process_group(
        require_text(backend, "backend"),
        init_method == nullptr ? "env://" : init_method, rank, world_size,
        timeout_of(timeout_ms, comm::Store::kDefaultTimeout));
    *group = adopt(std::make_unique<comm_group>(comm_group{created}));
  });
}

comm_result_t comm_group_create(comm_store_t store, int rank, int size,
                                const char* backend, int64_t timeout_ms,
                                comm_group_t* group) {
  return guarded(__func__, [&] {
    require_out(group, "group");
    auto created = std::make_shared<comm::ProcessGroup>(
        live(store, "store").store, rank, size,
        require_text(backend, "backend"),
        timeout_of(timeout_ms, comm::Store::kDefaultTimeout));
    *group = adopt(std::make_unique<comm_group>(comm_group{created}));
  });
}

comm_result_t comm_group_rank(comm_group_t group, int* rank) {
  return guarded(__func__, [&] {
    require_out(rank, "rank");
    *rank = group_of(group).rank();
  });
}

comm_result_t comm_group_size(comm_group_t group, int* size) {
  return guarded(__func__, [&] {
    require_out(size, "size");
    *size = group_of(group).size();
  });
}

comm_result_t comm_group_new(comm_group_t group, const int* ranks, int count,
                             comm_group_t* subgroup) {
  return guarded(__func__, [&] {
    require_out(subgroup, "subgroup");
    comm::ProcessGroup& parent = group_of(group);
    if (count < 1 || ranks == nullptr) {
      throw InvalidArgument("`ranks` must hold `count` >= 1 ranks (got " +
                            std::to_string(count) +
                            (ranks == nullptr ? ", and NULL" : "") + ")");
    }
    auto created = parent.new_group(std::vector<int>(ranks, ranks + count));
    *subgroup = created == nullptr ? nullptr
                                   : adopt(std::make_unique<comm_group>(
                                         comm_group{std::move(created)}));
  });
}

comm_result_t comm_group_free(comm_group_t group) {
  return guarded(__func__, [&] {
    group_of(group).shutdown();
    release(group, "group");
  });
}

// ---- Shared host memory ----------------------------------------------------

comm_result_t comm_mem_alloc(void** ptr, size_t size) {
  return guarded(__func__, [&] {
    if (ptr == nullptr) throw InvalidArgument("`ptr` is NULL");
    *ptr = comm::allocate_shared_host(size);
  });
}

comm_result_t comm_mem_free(void* ptr) {
  return guarded(__func__, [&] { comm::free_shared_host(ptr); });
}

// ---- Collectives on buffers -----------------------------------------------

comm_result_t comm_all_reduce(const void* sendbuf, void* recvbuf, size_t count,
                              comm_dtype_t dtype, comm_reduce_op_t op,
                              comm_group_t group, int device, void* stream,
                              comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    comm::AllReduceOptions options;
    options.async_op = work != nullptr;
    options.op = op_of(op);
    Placement at(device, stream);
    Tensor send = at.view(sendbuf, count, type, "sendbuf");
    Tensor recv = at.view(recvbuf, count, type, "recvbuf");
    const Tensor input = apart_from(send, recv, at, /*whole_ok=*/true);
    // Out of place, the backend may read the input off the caller's stream.
    if (input.data_ptr() != recv.data_ptr()) at.wait_for_caller_stream();
    at.finish(g.all_reduce_into(recv, input, options), work);
  });
}

comm_result_t comm_broadcast(const void* sendbuf, void* recvbuf, size_t count,
                             comm_dtype_t dtype, int root, comm_group_t group,
                             int device, void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    Placement at(device, stream);
    Tensor recv = at.view(recvbuf, count, type, "recvbuf");
    if (g.rank() == root) {
      copy_unless_same(recv, at.view(sendbuf, count, type, "sendbuf"), at);
    }
    comm::BroadcastOptions options;
    options.async_op = work != nullptr;
    options.root = root;
    at.finish(g.broadcast(recv, options), work);
  });
}

comm_result_t comm_reduce(const void* sendbuf, void* recvbuf, size_t count,
                          comm_dtype_t dtype, comm_reduce_op_t op, int root,
                          comm_group_t group, int device, void* stream,
                          comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    comm::ReduceOptions options;
    options.async_op = work != nullptr;
    options.op = op_of(op);
    options.root = root;
    Placement at(device, stream);
    const Tensor send = at.view(sendbuf, count, type, "sendbuf");
    // The tree reduces into each rank's buffer on its way to the root, so
    // the root works on its recvbuf and every other rank on a scratch copy:
    // as in NCCL and MPI, a rank's buffers other than the root's recvbuf
    // are left as they were.
    Tensor target;
    if (g.rank() == root) {
      target = at.view(recvbuf, count, type, "recvbuf");
      copy_unless_same(target, send, at);
    } else {
      at.wait_for_caller_stream();
      target = clone_alike(send);
    }
    at.finish(g.reduce(target, options), work);
  });
}

comm_result_t comm_all_gather(const void* sendbuf, void* recvbuf,
                              size_t sendcount, comm_dtype_t dtype,
                              comm_group_t group, int device, void* stream,
                              comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    Placement at(device, stream);
    Tensor send = at.view(sendbuf, sendcount, type, "sendbuf");
    Tensor recv =
        at.view(recvbuf, times_world(sendcount, g, "recvbuf"), type, "recvbuf");
    send = apart_from(send, recv, at);
    at.finish(g.all_gather_into(recv, send, {.async_op = work != nullptr}),
              work);
  });
}

comm_result_t comm_reduce_scatter(const void* sendbuf, void* recvbuf,
                                  size_t recvcount, comm_dtype_t dtype,
                                  comm_reduce_op_t op, comm_group_t group,
                                  int device, void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    comm::ReduceScatterOptions options;
    options.async_op = work != nullptr;
    options.op = op_of(op);
    Placement at(device, stream);
    Tensor send =
        at.view(sendbuf, times_world(recvcount, g, "sendbuf"), type, "sendbuf");
    Tensor recv = at.view(recvbuf, recvcount, type, "recvbuf");
    send = apart_from(send, recv, at);
    at.finish(
        g.reduce_scatter(recv, blocks(send, g.size(), recvcount), options),
        work);
  });
}

comm_result_t comm_gather(const void* sendbuf, void* recvbuf, size_t sendcount,
                          comm_dtype_t dtype, int root, comm_group_t group,
                          int device, void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    Placement at(device, stream);
    Tensor send = at.view(sendbuf, sendcount, type, "sendbuf");
    std::vector<Tensor> outputs;
    if (g.rank() == root) {
      Tensor recv = at.view(recvbuf, times_world(sendcount, g, "recvbuf"), type,
                            "recvbuf");
      send = apart_from(send, recv, at);
      outputs = blocks(recv, g.size(), sendcount);
    }
    comm::GatherOptions options;
    options.async_op = work != nullptr;
    options.root = root;
    at.finish(g.gather(outputs, send, options), work);
  });
}

comm_result_t comm_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                           comm_dtype_t dtype, int root, comm_group_t group,
                           int device, void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    Placement at(device, stream);
    Tensor recv = at.view(recvbuf, recvcount, type, "recvbuf");
    std::vector<Tensor> inputs;
    if (g.rank() == root) {
      Tensor send = at.view(sendbuf, times_world(recvcount, g, "sendbuf"), type,
                            "sendbuf");
      send = apart_from(send, recv, at);
      inputs = blocks(send, g.size(), recvcount);
    }
    comm::ScatterOptions options;
    options.async_op = work != nullptr;
    options.root = root;
    at.finish(g.scatter(recv, inputs, options), work);
  });
}

comm_result_t comm_all_to_all(const void* sendbuf, void* recvbuf, size_t count,
                              comm_dtype_t dtype, comm_group_t group,
                              int device, void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    Placement at(device, stream);
    const std::size_t total = times_world(count, g, "sendbuf");
    Tensor send = at.view(sendbuf, total, type, "sendbuf");
    Tensor recv = at.view(recvbuf, total, type, "recvbuf");
    send = apart_from(send, recv, at, /*whole_ok=*/true);
    at.finish(g.all_to_all(recv, send, {.async_op = work != nullptr}), work);
  });
}

comm_result_t comm_all_to_allv(const void* sendbuf, const size_t* sendcounts,
                               void* recvbuf, const size_t* recvcounts,
                               comm_dtype_t dtype, comm_group_t group,
                               int device, void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    const DType type = dtype_of(dtype);
    if (sendcounts == nullptr || recvcounts == nullptr) {
      throw InvalidArgument(
          "`sendcounts` and `recvcounts` must each hold one count per rank");
    }
    // The views check that each total fits an int64_t of elements of any
    // dtype, so every count, a part of one, fits too.
    const std::size_t send_total =
        sum_of_counts(sendcounts, g.size(), "sendcounts");
    const std::size_t recv_total =
        sum_of_counts(recvcounts, g.size(), "recvcounts");
    Placement at(device, stream);
    Tensor send = at.view(sendbuf, send_total, type, "sendbuf");
    Tensor recv = at.view(recvbuf, recv_total, type, "recvbuf");
    comm::AllToAllOptions options;
    options.async_op = work != nullptr;
    for (int r = 0; r < g.size(); ++r) {
      options.input_split_sizes.push_back(
          static_cast<std::int64_t>(sendcounts[r]));
      options.output_split_sizes.push_back(
          static_cast<std::int64_t>(recvcounts[r]));
    }
    send = apart_from(send, recv, at, /*whole_ok=*/true);
    at.finish(g.all_to_all(recv, send, options), work);
  });
}

comm_result_t comm_barrier(comm_group_t group, comm_work_t* work) {
  return guarded(__func__, [&] {
    finish(group_of(group).barrier({.async_op = work != nullptr}), work);
  });
}

comm_result_t comm_send(const void* buf, size_t count, comm_dtype_t dtype,
                        int peer, int tag, comm_group_t group, int device,
                        void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Placement at(device, stream);
    comm::SendOptions options;
    options.tag = tag;
    at.finish(
        g.isend(at.view(buf, count, dtype_of(dtype), "buf"), peer, options),
        work);
  });
}

comm_result_t comm_recv(void* buf, size_t count, comm_dtype_t dtype, int peer,
                        int tag, comm_group_t group, int device, void* stream,
                        int* source, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Placement at(device, stream);
    Tensor tensor = at.view(buf, count, dtype_of(dtype), "buf");
    comm::RecvOptions options;
    options.tag = tag;
    at.finish(g.irecv(tensor, peer, options), work, source);
  });
}

// ---- Collectives on DLPack tensors ----------------------------------------

comm_result_t comm_all_reduce_dlpack(DLManagedTensor* tensor,
                                     comm_reduce_op_t op, comm_group_t group,
                                     void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor t = view_dlpack(tensor, "tensor");
    Placement at(device_arg(t), stream);
    comm::AllReduceOptions options;
    options.async_op = work != nullptr;
    options.op = op_of(op);
    at.finish(g.all_reduce(t, options), work);
  });
}

comm_result_t comm_broadcast_dlpack(DLManagedTensor* tensor, int root,
                                    comm_group_t group, void* stream,
                                    comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor t = view_dlpack(tensor, "tensor");
    Placement at(device_arg(t), stream);
    comm::BroadcastOptions options;
    options.async_op = work != nullptr;
    options.root = root;
    at.finish(g.broadcast(t, options), work);
  });
}

comm_result_t comm_reduce_dlpack(DLManagedTensor* tensor, comm_reduce_op_t op,
                                 int root, comm_group_t group, void* stream,
                                 comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor t = view_dlpack(tensor, "tensor");
    Placement at(device_arg(t), stream);
    comm::ReduceOptions options;
    options.async_op = work != nullptr;
    options.op = op_of(op);
    options.root = root;
    at.finish(g.reduce(t, options), work);
  });
}

comm_result_t comm_all_gather_dlpack(DLManagedTensor* output,
                                     DLManagedTensor* input, comm_group_t group,
                                     void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor out = view_dlpack(output, "output");
    Tensor in = view_dlpack(input, "input");
    Placement at(device_arg(out), stream);
    at.finish(g.all_gather_into(out, in, {.async_op = work != nullptr}), work);
  });
}

// Block r of `flat` along dimension 0, as tensors shaped like `like`.
static std::vector<Tensor> rows_like(const Tensor& flat, int size,
                                     const Tensor& like, const char* what) {
  if (flat.numel() != like.numel() * size) {
    throw InvalidArgument(std::string(what) + ": " + flat.describe() +
                          " must hold group size (" + std::to_string(size) +
                          ") times " + like.describe() + " elements");
  }
  std::vector<Tensor> out =
      blocks(flat.flatten(), size, static_cast<std::size_t>(like.numel()));
  for (Tensor& block : out) block = block.view(like.shape());
  return out;
}

comm_result_t comm_reduce_scatter_dlpack(DLManagedTensor* output,
                                         DLManagedTensor* input,
                                         comm_reduce_op_t op,
                                         comm_group_t group, void* stream,
                                         comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor out = view_dlpack(output, "output");
    Placement at(device_arg(out), stream);
    std::vector<Tensor> inputs = rows_like(
        view_dlpack(input, "input"), g.size(), out, "reduce_scatter: input");
    comm::ReduceScatterOptions options;
    options.async_op = work != nullptr;
    options.op = op_of(op);
    at.finish(g.reduce_scatter(out, inputs, options), work);
  });
}

comm_result_t comm_gather_dlpack(DLManagedTensor* output,
                                 DLManagedTensor* input, int root,
                                 comm_group_t group, void* stream,
                                 comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor in = view_dlpack(input, "input");
    Placement at(device_arg(in), stream);
    std::vector<Tensor> outputs;
    if (g.rank() == root) {
      outputs = rows_like(view_dlpack(output, "output"), g.size(), in,
                          "gather: output");
    }
    comm::GatherOptions options;
    options.async_op = work != nullptr;
    options.root = root;
    at.finish(g.gather(outputs, in, options), work);
  });
}

comm_result_t comm_scatter_dlpack(DLManagedTensor* output,
                                  DLManagedTensor* input, int root,
                                  comm_group_t group, void* stream,
                                  comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor out = view_dlpack(output, "output");
    Placement at(device_arg(out), stream);
    std::vector<Tensor> inputs;
    if (g.rank() == root) {
      inputs = rows_like(view_dlpack(input, "input"), g.size(), out,
                         "scatter: input");
    }
    comm::ScatterOptions options;
    options.async_op = work != nullptr;
    options.root = root;
    at.finish(g.scatter(out, inputs, options), work);
  });
}

comm_result_t comm_all_to_all_dlpack(DLManagedTensor* output,
                                     DLManagedTensor* input, comm_group_t group,
                                     void* stream, comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor out = view_dlpack(output, "output");
    Tensor in = view_dlpack(input, "input");
    Placement at(device_arg(out), stream);
    at.finish(g.all_to_all(out, in, {.async_op = work != nullptr}), work);
  });
}

comm_result_t comm_send_dlpack(DLManagedTensor* tensor, int peer, int tag,
                               comm_group_t group, void* stream,
                               comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor t = view_dlpack(tensor, "tensor");
    Placement at(device_arg(t), stream);
    comm::SendOptions options;
    options.tag = tag;
    at.finish(g.isend(t, peer, options), work);
  });
}

comm_result_t comm_recv_dlpack(DLManagedTensor* tensor, int peer, int tag,
                               comm_group_t group, void* stream, int* source,
                               comm_work_t* work) {
  return guarded(__func__, [&] {
    comm::ProcessGroup& g = group_of(group);
    Tensor t = view_dlpack(tensor, "tensor");
    Placement at(device_arg(t), stream);
    comm::RecvOptions options;
    options.tag = tag;
    at.finish(g.irecv(t, peer, options), work, source);
  });
}

// ---- Work handles ---------------------------------------------------------

comm_result_t comm_work_wait(comm_work_t work, int64_t timeout_ms) {
  return guarded(__func__, [&] {
    comm_work& handle = live(work, "work");
    comm::Work& w = *handle.work;
    std::optional<comm::CudaStreamGuard> guard;
    if (handle.stream != nullptr) guard.emplace(handle.device, handle.stream);
    if (timeout_ms == COMM_DEFAULT_TIMEOUT) {
      w.wait();
    } else {
      w.wait(timeout_of(timeout_ms, Millis(0)));
    }
  });
}

comm_result_t comm_work_test(comm_work_t work, int* done) {
  return guarded(__func__, [&] {
    require_out(done, "done");
    comm::Work& w = *live(work, "work").work;
    *done = w.is_completed() ? 1 : 0;
    if (auto error = w.exception()) std::rethrow_exception(error);
  });
}

comm_result_t comm_work_source(comm_work_t work, int* source) {
  return guarded(__func__, [&] {
    require_out(source, "source");
    *source = live(work, "work").work->source_rank();
  });
}

comm_result_t comm_work_free(comm_work_t work) {
  return guarded(__func__, [&] { release(work, "work"); });
}

}  // extern "C"
