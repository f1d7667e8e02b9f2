// commdist._C: the native half of the Python bindings. The Python half
// (commdist/__init__.py) gives it torch.distributed's shape: default group,
// keyword arguments, async_op.
//
// Arrays cross without a copy. numpy arrays (and anything else with the
// buffer protocol) are read through it, which says whether they are
// writable; torch tensors through DLPack. A call that writes into an array
// asks for a writable buffer, so a read-only array is refused before any
// data moves.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlpack/dlpack.h>

#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "libcomm/cuda.h"
#include "libcomm/distributed/backend_registry.h"
#include "libcomm/distributed/ddp/distributed_data_parallel.h"
#include "libcomm/distributed/distributed_sampler.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "libcomm/tensor.h"
#include "libcomm/tensor_dlpack.h"
#include "libcomm/version.h"
#include "store/file_store.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"

namespace py = pybind11;
using comm::DType;
using comm::InvalidArgument;
using comm::Tensor;
using Millis = std::chrono::milliseconds;

namespace {

// ---- Buffers released under the GIL ----------------------------------------
//
// A numpy array viewed through the buffer protocol must be released with the
// GIL held, but the last view of it may die on a backend thread when its
// operation completes. Those releases wait in this list until the next call
// into the module, which holds the GIL; a thread that holds it releases at
// once. Nothing here ever waits for the GIL, so no backend thread can
// deadlock against a Python thread that waits for it.
std::mutex deferred_mutex;
std::vector<Py_buffer*> deferred;

void release_buffer(Py_buffer* view) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyBuffer_Release(view);
    delete view;
    return;
  }
  std::lock_guard lock(deferred_mutex);
  deferred.push_back(view);
}

void release_deferred() {
  std::vector<Py_buffer*> ready;
  {
    std::lock_guard lock(deferred_mutex);
    ready.swap(deferred);
  }
  for (Py_buffer* view : ready) {
    PyBuffer_Release(view);
    delete view;
  }
}

// ---- Timeouts --------------------------------------------------------------

// A timeout as Python code passes it: a number of seconds or a
// datetime.timedelta (torch.distributed passes timedelta everywhere).
struct Seconds {
  double value = 0;
};

}  // namespace

namespace pybind11::detail {
template <>
struct type_caster<Seconds> {
  PYBIND11_TYPE_CASTER(Seconds, const_name("float | datetime.timedelta"));

  bool load(handle source, bool) {
    if (source.is_none() || PyBool_Check(source.ptr())) return false;
    if (PyFloat_Check(source.ptr()) || PyLong_Check(source.ptr())) {
      value.value = PyFloat_AsDouble(source.ptr());
      if (PyErr_Occurred()) {  // an int too large for a double
        PyErr_Clear();
        value.value = std::numeric_limits<double>::infinity();
      }
      return true;
    }
    if (hasattr(source, "total_seconds") &&
        hasattr(source, "microseconds")) {  // timedelta and its subclasses
      object total = source.attr("total_seconds")();
      value.value = total.cast<double>();
      return true;
    }
    return false;
  }

  static handle cast(const Seconds& s, return_value_policy, handle) {
    return PyFloat_FromDouble(s.value);
  }
};
}  // namespace pybind11::detail

namespace {

// The longest timeout taken, about 31 years: a longer one would overflow the
// deadlines computed from it.
constexpr double kMaxTimeoutSeconds = 1e9;

// `seconds` as milliseconds: positive (or zero where `zero_ok`), and finite
// up to kMaxTimeoutSeconds. Anything else, NaN included, is InvalidArgument
// saying what was given.
Millis millis_of(double seconds, bool zero_ok) {
  const bool in_range = zero_ok ? seconds >= 0 : seconds > 0;
  if (!in_range || !(seconds <= kMaxTimeoutSeconds)) {
    char given[64];
    std::snprintf(given, sizeof(given), "%g", seconds);
    throw InvalidArgument(std::string("timeout must be a ") +
                          (zero_ok ? "non-negative" : "positive") +
                          " number of seconds up to 1e9 (or a "
                          "datetime.timedelta), got " +
                          given);
  }
  return Millis(static_cast<std::int64_t>(seconds * 1e3));
}

// ---- CUDA streams of torch -------------------------------------------------
//
// Collectives on torch's CUDA tensors are ordered on torch's current stream
// of the tensor's device, as torch.distributed's NCCL backend orders them:
// a call starts after the work queued there so far (the kernels that
// produced its inputs), and an unbounded wait() makes that stream wait for
// it, without blocking the host. libcomm orders CUDA work after its own
// current stream (comm::current_cuda_stream), so each such call and each
// such wait runs with torch's current stream made libcomm's.

// The CUDA device of the torch tensors of the call being converted, or -1:
// set by from_torch, taken by issue(). A conversion that does not end in
// issue() (a call that fails first, the reducer's parameters) leaves it set
// for the next call, which then asks torch for its current stream of that
// device: harmless, since only CUDA work on that device follows it.
thread_local int t_torch_cuda_device = -1;

// torch's current CUDA stream of `device`. Needs the GIL.
comm::CudaStream torch_current_stream(int device) {
  py::object stream =
      py::module_::import("torch").attr("cuda").attr("current_stream")(device);
  return reinterpret_cast<comm::CudaStream>(
      stream.attr("cuda_stream").cast<std::uintptr_t>());
}

// Makes torch's current stream of `device` libcomm's for its lifetime, or
// does nothing for device -1. Needs the GIL to be made.
class OnTorchStream {
 public:
  explicit OnTorchStream(int device) {
    if (device >= 0) guard_.emplace(device, torch_current_stream(device));
  }

 private:
  std::optional<comm::CudaStreamGuard> guard_;
};

// ---- Arrays to Tensors -----------------------------------------------------

std::string type_name(py::handle object) {
  return py::str(py::type::handle_of(object).attr("__qualname__"));
}

DType dtype_of_format(const std::string& format, Py_ssize_t itemsize,
                      const std::string& what) {
  // The struct-module code, without a byte-order or alignment prefix. Data
  // in the other byte order would be reduced as garbage: refused.
  std::string code = format;
  if (!code.empty() && std::strchr("@=<>!", code[0]) != nullptr) {
    const bool big = code[0] == '>' || code[0] == '!';
    const bool little = code[0] == '<';
    const bool native_big = std::endian::native == std::endian::big;
    if (itemsize > 1 && ((big && !native_big) || (little && native_big))) {
      throw InvalidArgument(
          what + " has element format '" + format + "', " +
          (big ? "big" : "little") +
          "-endian, which is not this machine's byte order; pass an array "
          "in native byte order (numpy: a.astype(a.dtype.newbyteorder('=')))");
    }
    code.erase(0, 1);
  }
  if (code == "e") return DType::kF16;
  if (code == "f") return DType::kF32;
  if (code == "d") return DType::kF64;
  if (code == "b") return DType::kI8;
  if (code == "B") return DType::kU8;
  if (code == "?") return DType::kBool;
  if ((code == "i" || code == "l" || code == "q") && itemsize == 4)
    return DType::kI32;
  if ((code == "i" || code == "l" || code == "q") && itemsize == 8)
    return DType::kI64;
  throw InvalidArgument(
      what + " has element format '" + format + "' (" +
      std::to_string(itemsize) +
      " bytes), which libcomm does not support; use float16, float32, "
      "float64, int8, uint8, int32, int64 or bool (numpy has no bfloat16)");
}

Tensor from_buffer(py::handle object, bool writes, const std::string& what) {
  auto view = std::make_unique<Py_buffer>();
  const int flags = PyBUF_STRIDES | PyBUF_FORMAT;
  if (PyObject_GetBuffer(object.ptr(), view.get(),
                         flags | (writes ? PyBUF_WRITABLE : 0)) != 0) {
    PyErr_Clear();
    if (writes && PyObject_GetBuffer(object.ptr(), view.get(), flags) == 0) {
      PyBuffer_Release(view.get());
      throw InvalidArgument(
          what +
          " is read-only, and this call writes into it; pass a "
          "writable array (numpy: a.copy(), or set "
          "a.flags.writeable = True when you own the memory)");
    }
    // The failed request left a Python error set; an exception raised
    // over it would turn into SystemError.
    PyErr_Clear();
    throw InvalidArgument(what + " (" + type_name(object) +
                          ") does not expose a strided buffer of a dtype "
                          "libcomm supports");
  }
  Py_buffer* raw = view.get();
  auto release = [raw](void*) { release_buffer(raw); };
  // From here the view belongs to `guard` until a tensor takes it.
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> guard(view.release(),
                                                         [](Py_buffer* v) {
                                                           PyBuffer_Release(v);
                                                           delete v;
                                                         });
  const DType dtype =
      dtype_of_format(raw->format ? raw->format : "B", raw->itemsize, what);
  comm::Shape shape(raw->shape, raw->shape + raw->ndim);
  comm::Strides strides;
  for (int d = 0; d < raw->ndim; ++d) {
    if (raw->strides[d] < 0 || raw->strides[d] % raw->itemsize != 0) {
      throw InvalidArgument(what +
                            " has byte strides that are negative or "
                            "not a multiple of its element size; "
                            "pass np.ascontiguousarray(a)");
    }
    strides.push_back(raw->strides[d] / raw->itemsize);
  }
  Tensor tensor = Tensor::from_blob(raw->buf, shape, strides, dtype,
                                    comm::Device::cpu(), release);
  guard.release();
  return tensor;
}

bool is_torch_tensor(py::handle object) {
  py::handle type = py::type::handle_of(object);
  return py::hasattr(type, "__module__") &&
         py::str(type.attr("__module__"))
                 .cast<std::string>()
                 .rfind("torch", 0) == 0 &&
         py::hasattr(object, "__dlpack__");
}

Tensor from_torch(py::handle object, const std::string& what) {
  py::object tensor = py::reinterpret_borrow<py::object>(object);
  py::module_ torch = py::module_::import("torch");
  // Only strided (dense) tensors have one block of memory to send; torch's
  // own DLPack export would refuse the others with its own error.
  py::object layout = tensor.attr("layout");
  if (!layout.is(torch.attr("strided"))) {
    throw InvalidArgument(
        what + " is a torch tensor of layout " +
        py::str(layout).cast<std::string>() +
        "; collectives take dense (torch.strided) tensors only, so pass "
        "t.to_dense() and convert the result back");
  }
  // DLPack refuses tensors that require grad and bool tensors: export a
  // detached view, and bool as uint8 relabelled below.
  tensor = tensor.attr("detach")();
  const bool is_bool = tensor.attr("dtype").is(torch.attr("bool"));
  if (is_bool) tensor = tensor.attr("view")(torch.attr("uint8"));
  py::capsule capsule = tensor.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(
      PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw InvalidArgument(what +
                          ": torch returned a DLPack capsule that "
                          "was already consumed");
  }
  Tensor result = comm::from_dlpack(managed);  // owns `managed` on success
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  if (result.device().is_cuda()) t_torch_cuda_device = result.device().index;
  if (is_bool) {
    result =
        Tensor::from_blob(result.data_ptr(), result.shape(), result.strides(),
                          DType::kBool, result.device(), [result](void*) {});
  }
  return result;
}

// A Tensor viewing `object`'s memory. `writes`: the call writes into it.
Tensor to_tensor(py::handle object, bool writes, const std::string& what) {
  if (object.is_none()) {
    throw InvalidArgument(what +
                          " is None; pass a numpy array or a torch "
                          "tensor");
  }
  Tensor tensor;
  if (PyObject_CheckBuffer(object.ptr())) {
    tensor = from_buffer(object, writes, what);
  } else if (is_torch_tensor(object)) {
    tensor = from_torch(object, what);
  } else {
    throw InvalidArgument(what + " is a " + type_name(object) +
                          "; pass a numpy array or a torch tensor");
  }
  if (!tensor.is_contiguous()) {
    throw InvalidArgument(
        what + " (" + tensor.describe() +
        ") is not contiguous, and collectives work on contiguous memory in "
        "place; pass np.ascontiguousarray(a) or t.contiguous() and copy the "
        "result back");
  }
  return tensor;
}

std::vector<Tensor> to_tensors(const py::sequence& objects, bool writes,
                               const std::string& what) {
  std::vector<Tensor> tensors;
  for (std::size_t i = 0; i < objects.size(); ++i) {
    tensors.push_back(
        to_tensor(objects[i], writes, what + "[" + std::to_string(i) + "]"));
  }
  return tensors;
}

// ---- Work ------------------------------------------------------------------

// A Work and what must happen once it completes (copying results out of
// staging tensors), run by the first wait() that sees it complete.
class PyWork {
 public:
  // `torch_cuda_device`: the device of the torch CUDA tensors the operation
  // works on, whose current stream an unbounded wait() orders; -1 for none.
  PyWork(std::shared_ptr<comm::Work> work, std::function<void()> then,
         int torch_cuda_device)
      : work_(std::move(work)),
        then_(std::move(then)),
        torch_cuda_device_(torch_cuda_device) {}

  bool wait(std::optional<Seconds> timeout_seconds) {
    const std::optional<Millis> timeout =
        timeout_seconds
            ? std::optional<Millis>(millis_of(timeout_seconds->value, true))
            : std::nullopt;
    {
      OnTorchStream on_torch_stream(timeout ? -1 : torch_cuda_device_);
      py::gil_scoped_release no_gil;
      if (timeout) {
        work_->wait(*timeout);
      } else {
        work_->wait();
      }
      run_then();
    }
    release_deferred();
    return true;
  }
  // Complete once the operation is and what follows it has run: the first
  // look that finds the operation done runs it, so that a caller polling
  // is_completed() finds the outputs in place, as torch's CPU work does.
  bool is_completed() {
    if (!work_->is_completed()) return false;
    if (work_->is_success()) {
      OnTorchStream on_torch_stream(torch_cuda_device_);
      py::gil_scoped_release no_gil;
      run_then();
    }
    return true;
  }
  bool operation_completed() const { return work_->is_completed(); }
  bool is_success() const { return work_->is_success(); }
  std::exception_ptr exception() const { return work_->exception(); }
  int source_rank() const { return work_->source_rank(); }
  const std::string& description() const { return work_->description(); }
  comm::Work& operation() const { return *work_; }

 private:
  // Runs what follows the completed operation, once; the caller has
  // released the GIL. Cleared only once it ran whole: after a failure (a
  // wait that timed out), the next wait() runs it again. Two threads may
  // finish at once (get_future()'s thread and the caller's): one runs it,
  // the other waits for it here, never running it twice nor destroying it
  // while it runs.
  void run_then() {
    std::lock_guard<std::mutex> then_lock(then_mutex_);
    if (then_) {
      then_();
      then_ = nullptr;
    }
  }

  std::shared_ptr<comm::Work> work_;
  std::mutex then_mutex_;
  std::function<void()> then_;  // guarded by then_mutex_
  int torch_cuda_device_;
};

using PyWorkPtr = std::shared_ptr<PyWork>;

// Hands the completions of operations to the threads of commdist's
// _FutureSettler. libcomm completes an operation on one of its own threads,
// where a callback must neither block nor take the GIL (Work::
// on_completion), so the callback only queues the token the operation was
// watched with; take() waits for one with the GIL released.
class CompletionQueue {
 public:
  // Queues `token` once `work`'s operation completes; at once if it has.
  void watch(const PyWork& work, std::uint64_t token) {
    work.operation().on_completion([tokens = tokens_, token] {
      {
        std::lock_guard<std::mutex> lock(tokens->mutex);
        tokens->completed.push_back(token);
      }
      tokens->ready.notify_one();
    });
  }
  // The token of an operation that completed, in the order they did, or
  // None once `timeout` passed without one.
  std::optional<std::uint64_t> take(Seconds timeout) {
    const Millis wait_for = millis_of(timeout.value, false);
    py::gil_scoped_release no_gil;
    std::unique_lock<std::mutex> lock(tokens_->mutex);
    if (!tokens_->ready.wait_for(lock, wait_for,
                                 [&] { return !tokens_->completed.empty(); })) {
      return std::nullopt;
    }
    const std::uint64_t token = tokens_->completed.front();
    tokens_->completed.pop_front();
    return token;
  }

 private:
  // Shared with the callbacks, which may outlive the queue.
  struct Tokens {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::uint64_t> completed;  // under mutex
  };
  std::shared_ptr<Tokens> tokens_ = std::make_shared<Tokens>();
};

// ---- Errors ----------------------------------------------------------------

const char* python_class_of(comm::ErrorKind kind) {
  switch (kind) {
    case comm::ErrorKind::kInvalidArgument: return "InvalidArgument";
    case comm::ErrorKind::kTimeout: return "TimeoutError";
    case comm::ErrorKind::kPeer: return "PeerError";
    case comm::ErrorKind::kMismatch: return "MismatchError";
    case comm::ErrorKind::kBackend: return "BackendError";
    case comm::ErrorKind::kSystem: return "SystemError";
    case comm::ErrorKind::kUnsupported: return "UnsupportedError";
  }
  return "Error";
}

// The Python exception for `error`, an instance of the class in
// commdist._errors that mirrors its C++ class.
py::object python_exception(const comm::Error& error) {
  py::module_ errors = py::module_::import("commdist._errors");
  py::object instance =
      errors.attr(python_class_of(error.kind()))(py::str(error.what()));
  if (auto* peer = dynamic_cast<const comm::PeerError*>(&error)) {
    instance.attr("peer_rank") = peer->peer_rank();
  }
  if (auto* system = dynamic_cast<const comm::SystemError*>(&error)) {
    instance.attr("errno") = system->error_code();
  }
  return instance;
}

py::object python_exception(std::exception_ptr error) {
  if (!error) return py::none();
  try {
    std::rethrow_exception(error);
  } catch (const comm::Error& e) {
    return python_exception(e);
  } catch (const std::exception& e) {
    return py::module_::import("commdist._errors").attr("Error")(e.what());
  }
}

// ---- Process groups
// ----------------------------------------------------------

using Group = comm::ProcessGroup;
using GroupPtr = std::shared_ptr<comm::ProcessGroup>;

Millis millis(Seconds seconds) { return millis_of(seconds.value, false); }

// Issues `call` without the GIL: the backend may block briefly, and its
// threads may drop views whose release would otherwise wait for the GIL.
// Calls on torch's CUDA tensors are issued on torch's current stream.
template <typename Call>
PyWorkPtr issue(Call&& call, std::function<void()> then = {}) {
  // Taken before release_deferred(), which may run Python (a buffer's
  // release) that converts tensors of its own.
  const int torch_cuda_device = std::exchange(t_torch_cuda_device, -1);
  release_deferred();
  std::shared_ptr<comm::Work> work;
  {
    OnTorchStream on_torch_stream(torch_cuda_device);
    py::gil_scoped_release no_gil;
    work = call();
  }
  return std::make_shared<PyWork>(std::move(work), std::move(then),
                                  torch_cuda_device);
}

PyWorkPtr all_to_all_lists(Group& g, const py::sequence& outputs,
                           const py::sequence& inputs, bool async_op) {
  std::vector<Tensor> out = to_tensors(outputs, true, "output_tensor_list");
  std::vector<Tensor> in = to_tensors(inputs, false, "input_tensor_list");
  if (static_cast<int>(out.size()) != g.size() ||
      static_cast<int>(in.size()) != g.size()) {
    throw InvalidArgument(
        "all_to_all: both lists must hold one tensor per "
        "rank (" +
        std::to_string(g.size()) + "), got " + std::to_string(out.size()) +
        " outputs and " + std::to_string(in.size()) + " inputs");
  }
  // One flat staging tensor each way; the backend's splits are element
  // counts of the flattened 1-D tensors.
  comm::AllToAllOptions options;
  options.async_op = async_op;
  std::int64_t in_total = 0;
  std::int64_t out_total = 0;
  for (int r = 0; r < g.size(); ++r) {
    if (in[r].dtype() != in[0].dtype() || out[r].dtype() != in[0].dtype()) {
      throw InvalidArgument(
          "all_to_all: every tensor must have the dtype of "
          "input_tensor_list[0], " +
          std::string(comm::dtype_name(in[0].dtype())));
    }
    options.input_split_sizes.push_back(in[r].numel());
    options.output_split_sizes.push_back(out[r].numel());
    in_total += in[r].numel();
    out_total += out[r].numel();
  }
  const comm::Device device = in[0].device();
  Tensor send = Tensor::empty({in_total}, in[0].dtype(), device);
  Tensor recv = Tensor::empty({out_total}, in[0].dtype(), device);
  // copy_ copies CUDA memory on the legacy default stream, which torch's
  // streams do not wait for, nor it for them: on CUDA, the host waits for
  // torch's current stream before the copies in and for the copies, and
  // the copies out wait on the host for the operation (the only all_to_all
  // that blocks the host on CUDA; all_to_all_single does not).
  const int cuda = device.is_cuda() ? device.index : -1;
  if (cuda >= 0) {
    OnTorchStream on_torch_stream(cuda);
    py::gil_scoped_release no_gil;
    comm::synchronize_cuda_stream(cuda);
  }
  std::int64_t at = 0;
  for (const Tensor& t : in) {
    send.slice(at, at + t.numel()).copy_(t.flatten());
    at += t.numel();
  }
  if (cuda >= 0) {
    py::gil_scoped_release no_gil;
    comm::CudaStreamGuard legacy(cuda, nullptr);
    comm::synchronize_cuda_stream(cuda);
  }
  auto work = std::make_shared<std::shared_ptr<comm::Work>>();
  return issue([&] { return *work = g.all_to_all(recv, send, options); },
               [recv, out, work, cuda, timeout = g.timeout()]() mutable {
                 if (cuda >= 0) (*work)->wait(timeout);
                 std::int64_t from = 0;
                 for (Tensor& t : out) {
                   t.flatten().copy_(recv.slice(from, from + t.numel()));
                   from += t.numel();
                 }
                 if (cuda >= 0) {
                   comm::CudaStreamGuard legacy(cuda, nullptr);
                   comm::synchronize_cuda_stream(cuda);
                 }
               });
}

// ---- DDP for torch modules
// -----------------------------------------------------

// The reducer behind commdist.DistributedDataParallel: comm's DDP over the
// module's parameters and the gradient tensors the Python side keeps in
// param.grad.
class Reducer {
 public:
  Reducer(GroupPtr group, const std::vector<std::string>& names,
          const py::sequence& params, const py::sequence& grads,
          const std::vector<std::string>& buffer_names,
          const py::sequence& buffers, comm::DdpOptions options) {
    std::vector<comm::Parameter> parameters;
    for (std::size_t i = 0; i < names.size(); ++i) {
      parameters.push_back(
          {names[i], to_tensor(params[i], true, "parameter " + names[i]),
           to_tensor(grads[i], true, "gradient of " + names[i])});
    }
    std::vector<comm::Buffer> buffer_list;
    for (std::size_t i = 0; i < buffer_names.size(); ++i) {
      buffer_list.push_back(
          {buffer_names[i],
           to_tensor(buffers[i], true, "buffer " + buffer_names[i])});
    }
    py::gil_scoped_release no_gil;
    ddp_ = std::make_unique<comm::DistributedDataParallel>(
        std::move(group), std::move(parameters), std::move(buffer_list),
        options);
  }

  void before_forward(bool backward_follows) {
    py::gil_scoped_release no_gil;
    ddp_->before_forward(backward_follows);
  }
  void mark_grad_ready(std::size_t index) {
    py::gil_scoped_release no_gil;
    ddp_->mark_grad_ready(index);
  }
  void finish() {
    {
      py::gil_scoped_release no_gil;
      ddp_->finish();
    }
    release_deferred();
  }
  void enter_no_sync() {
    no_sync_.push_back(
        std::make_unique<comm::DistributedDataParallel::NoSync>(*ddp_));
  }
  void exit_no_sync() {
    if (!no_sync_.empty()) no_sync_.pop_back();
  }
  // The reducer's gradient `index` as a DLPack capsule (a view, no copy).
  py::capsule grad(std::size_t index) {
    DLManagedTensor* managed = comm::to_dlpack(ddp_->grad(index));
    return py::capsule(managed, "dltensor", [](PyObject* capsule) {
      // Still named "dltensor": nobody consumed it, so it is ours to free.
      if (PyCapsule_IsValid(capsule, "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(
            PyCapsule_GetPointer(capsule, "dltensor"));
        m->deleter(m);
      }
    });
  }
  std::size_t bucket_count() const { return ddp_->bucket_count(); }
  std::vector<std::size_t> bucket_parameters(std::size_t b) const {
    return ddp_->bucket_parameters(b);
  }

 private:
  // Nested no_sync scopes, innermost last; NoSync guards do not move.
  std::unique_ptr<comm::DistributedDataParallel> ddp_;
  std::vector<std::unique_ptr<comm::DistributedDataParallel::NoSync>> no_sync_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "The native half of commdist; use the commdist package.";
  m.attr("__version__") = std::to_string(COMM_VERSION_MAJOR) + "." +
                          std::to_string(COMM_VERSION_MINOR) + "." +
                          std::to_string(COMM_VERSION_PATCH);

  py::register_exception_translator([](std::exception_ptr error) {
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const comm::Error& e) {
      py::object instance = python_exception(e);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(instance.ptr())),
                      instance.ptr());
    }
  });

  py::enum_<comm::ReduceOp>(m, "ReduceOp")
      .value("SUM", comm::ReduceOp::kSum)
      .value("AVG", comm::ReduceOp::kAvg)
      .value("PRODUCT", comm::ReduceOp::kProduct)
      .value("MIN", comm::ReduceOp::kMin)
      .value("MAX", comm::ReduceOp::kMax)
      .value("BAND", comm::ReduceOp::kBand)
      .value("BOR", comm::ReduceOp::kBor)
      .value("BXOR", comm::ReduceOp::kBxor);

  // ---- Stores
  py::class_<comm::Store, std::shared_ptr<comm::Store>>(m, "Store")
      .def(
          "set",
          // str or bytes, as torch's Store.set takes (str as UTF-8).
          [](comm::Store& s, const std::string& key, const std::string& value) {
            py::gil_scoped_release no_gil;
            s.set(key, comm::to_bytes(value));
          })
      .def("get",
           [](comm::Store& s, const std::string& key) {
             comm::Bytes value;
             {
               py::gil_scoped_release no_gil;
               value = s.get(key);
             }
             return py::bytes(reinterpret_cast<const char*>(value.data()),
                              value.size());
           })
      .def("add",
           [](comm::Store& s, const std::string& key, std::int64_t delta) {
             py::gil_scoped_release no_gil;
             return s.add(key, delta);
           })
      .def("compare_set",
           [](comm::Store& s, const std::string& key,
              const std::string& expected, const std::string& desired) {
             comm::Bytes value;
             {
               py::gil_scoped_release no_gil;
               value = s.compare_set(key, comm::to_bytes(expected),
                                     comm::to_bytes(desired));
             }
             return py::bytes(reinterpret_cast<const char*>(value.data()),
                              value.size());
           })
      .def(
          "wait",
          [](comm::Store& s, const std::vector<std::string>& keys,
             std::optional<Seconds> timeout) {
            py::gil_scoped_release no_gil;
            if (timeout) {
              s.wait(keys, millis(*timeout));
            } else {
              s.wait(keys);
            }
          },
          py::arg("keys"), py::arg("timeout") = py::none())
      .def("check", &comm::Store::check,
           py::call_guard<py::gil_scoped_release>())
      .def("delete_key", &comm::Store::delete_key,
           py::call_guard<py::gil_scoped_release>())
      .def("num_keys", &comm::Store::num_keys,
           py::call_guard<py::gil_scoped_release>())
      .def("set_timeout",
           [](comm::Store& s, Seconds seconds) {
             s.set_timeout(millis(seconds));
           })
      // A datetime.timedelta, as torch's Store.timeout.
      .def_property_readonly("timeout", [](const comm::Store& s) {
        return py::module_::import("datetime")
            .attr("timedelta")(py::arg("milliseconds") = s.timeout().count());
      });

  py::class_<comm::TCPStore, comm::Store, std::shared_ptr<comm::TCPStore>>(
      m, "TCPStore")
      .def(py::init([](const std::string& host, int port, bool is_master,
                       Seconds timeout) {
             if (port < 0 || port > 65535) {
               throw InvalidArgument("port " + std::to_string(port) +
                                     " is outside 0-65535");
             }
             comm::TCPStoreOptions options;
             options.host = host;
             options.port = static_cast<std::uint16_t>(port);
             options.is_server = is_master;
             options.timeout = millis(timeout);
             py::gil_scoped_release no_gil;
             return std::make_shared<comm::TCPStore>(options);
           }),
           py::arg("host_name"), py::arg("port"), py::arg("is_master"),
           py::arg("timeout"))
      .def_property_readonly("host", &comm::TCPStore::host)
      .def_property_readonly("port", &comm::TCPStore::port);

  py::class_<comm::FileStore, comm::Store, std::shared_ptr<comm::FileStore>>(
      m, "FileStore")
      .def(py::init([](const std::string& path, Seconds timeout) {
             return std::make_shared<comm::FileStore>(path, millis(timeout));
           }),
           py::arg("file_name"), py::arg("timeout"))
      .def_property_readonly("path", &comm::FileStore::path);

  py::class_<comm::HashStore, comm::Store, std::shared_ptr<comm::HashStore>>(
      m, "HashStore")
      .def(py::init([](Seconds timeout) {
             return std::make_shared<comm::HashStore>(millis(timeout));
           }),
           py::arg("timeout"));

  py::class_<comm::PrefixStore, comm::Store,
             std::shared_ptr<comm::PrefixStore>>(m, "PrefixStore")
      .def(py::init([](const std::string& prefix,
                       std::shared_ptr<comm::Store> store) {
             if (store == nullptr) throw InvalidArgument("store is None");
             return std::make_shared<comm::PrefixStore>(prefix,
                                                        std::move(store));
           }),
           py::arg("prefix"), py::arg("store"));

  // ---- Work
  py::class_<PyWork, PyWorkPtr>(m, "Work")
      .def("wait", &PyWork::wait, py::arg("timeout") = py::none(),
           "Blocks until the operation completes (at most `timeout` "
           "seconds), raises its error if it failed; returns True.")
      .def("is_completed", &PyWork::is_completed)
      .def("is_success", &PyWork::is_success)
      .def("exception",
           [](const PyWork& w) { return python_exception(w.exception()); })
      .def("source_rank", &PyWork::source_rank)
      .def("operation_completed", &PyWork::operation_completed,
           "Whether libcomm's operation has completed (the copy of its "
           "results may still be owed to the first wait()).")
      .def("__repr__", [](const PyWork& w) {
        return "<commdist.Work " + w.description() +
               (w.operation_completed() ? " completed>" : " pending>");
      });

  py::class_<CompletionQueue>(m, "CompletionQueue")
      .def(py::init<>())
      .def("watch", &CompletionQueue::watch, py::arg("work"), py::arg("token"))
      .def("take", &CompletionQueue::take, py::arg("timeout"));

  // ---- Groups
  py::class_<Group, GroupPtr>(m, "ProcessGroup", py::dynamic_attr())
      .def(py::init([](std::shared_ptr<comm::Store> store, int rank, int size,
                       const std::string& backend, Seconds timeout,
                       const std::string& name) {
             if (store == nullptr) throw InvalidArgument("store is None");
             py::gil_scoped_release no_gil;
             return std::make_shared<Group>(std::move(store), rank, size,
                                            backend, millis(timeout), name);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("backend"), py::arg("timeout"), py::arg("name"))
      .def("rank", &Group::rank)
      .def("size", &Group::size)
      .def("backend_name", &Group::backend_name)
      .def("new_group", &Group::new_group,
           py::call_guard<py::gil_scoped_release>())
      .def("shutdown",
           [](Group& g) {
             {
               py::gil_scoped_release no_gil;
               g.shutdown();
             }
             release_deferred();
           })
      .def(
          "broadcast",
          [](Group& g, py::handle tensor, int root, bool async_op) {
            Tensor t = to_tensor(tensor, true, "tensor");
            return issue([&] {
              return g.broadcast(t, {.root = root, .async_op = async_op});
            });
          },
          py::arg("tensor"), py::arg("root"), py::arg("async_op") = true)
      .def(
          "all_reduce",
          [](Group& g, py::handle tensor, comm::ReduceOp op, bool async_op) {
            Tensor t = to_tensor(tensor, true, "tensor");
            return issue([&] {
              return g.all_reduce(t, {.op = op, .async_op = async_op});
            });
          },
          py::arg("tensor"), py::arg("op"), py::arg("async_op") = true)
      .def(
          "reduce",
          [](Group& g, py::handle tensor, int root, comm::ReduceOp op,
             bool async_op) {
            // The tree reduces into non-root tensors too, as in c10d.
            Tensor t = to_tensor(tensor, true, "tensor");
            return issue([&] {
              return g.reduce(t,
                              {.root = root, .op = op, .async_op = async_op});
            });
          },
          py::arg("tensor"), py::arg("root"), py::arg("op"),
          py::arg("async_op") = true)
      .def(
          "all_gather",
          [](Group& g, const py::sequence& outputs, py::handle input,
             bool async_op) {
            std::vector<Tensor> out = to_tensors(outputs, true, "tensor_list");
            Tensor in = to_tensor(input, false, "tensor");
            return issue(
                [&] { return g.all_gather(out, in, {.async_op = async_op}); });
          },
          py::arg("tensor_list"), py::arg("tensor"), py::arg("async_op") = true)
      .def(
          "all_gather_into",
          [](Group& g, py::handle output, py::handle input, bool async_op) {
            Tensor out = to_tensor(output, true, "output_tensor");
            Tensor in = to_tensor(input, false, "input_tensor");
            return issue([&] {
              return g.all_gather_into(out, in, {.async_op = async_op});
            });
          },
          py::arg("output_tensor"), py::arg("input_tensor"),
          py::arg("async_op") = true)
      .def(
          "gather",
          [](Group& g, py::handle input, std::optional<py::sequence> outputs,
             int root, bool async_op) {
            Tensor in = to_tensor(input, false, "tensor");
            std::vector<Tensor> out;
            if (outputs) out = to_tensors(*outputs, true, "gather_list");
            return issue([&] {
              return g.gather(out, in, {.root = root, .async_op = async_op});
            });
          },
          py::arg("tensor"), py::arg("gather_list"), py::arg("root"),
          py::arg("async_op") = true)
      .def(
          "scatter",
          [](Group& g, py::handle output, std::optional<py::sequence> inputs,
             int root, bool async_op) {
            Tensor out = to_tensor(output, true, "tensor");
            std::vector<Tensor> in;
            if (inputs) in = to_tensors(*inputs, false, "scatter_list");
            return issue([&] {
              return g.scatter(out, in, {.root = root, .async_op = async_op});
            });
          },
          py::arg("tensor"), py::arg("scatter_list"), py::arg("root"),
          py::arg("async_op") = true)
      .def(
          "reduce_scatter",
          [](Group& g, py::handle output, const py::sequence& inputs,
             comm::ReduceOp op, bool async_op) {
            Tensor out = to_tensor(output, true, "output");
            std::vector<Tensor> in = to_tensors(inputs, false, "input_list");
            return issue([&] {
              return g.reduce_scatter(out, in,
                                      {.op = op, .async_op = async_op});
            });
          },
          py::arg("output"), py::arg("input_list"), py::arg("op"),
          py::arg("async_op") = true)
      .def(
          "all_to_all_single",
          [](Group& g, py::handle output, py::handle input,
             std::vector<std::int64_t> output_split_sizes,
             std::vector<std::int64_t> input_split_sizes, bool async_op) {
            Tensor out = to_tensor(output, true, "output");
            Tensor in = to_tensor(input, false, "input");
            comm::AllToAllOptions options;
            options.async_op = async_op;
            options.input_split_sizes = std::move(input_split_sizes);
            options.output_split_sizes = std::move(output_split_sizes);
            return issue([&] { return g.all_to_all(out, in, options); });
          },
          py::arg("output"), py::arg("input"), py::arg("output_split_sizes"),
          py::arg("input_split_sizes"), py::arg("async_op") = true)
      .def("all_to_all", &all_to_all_lists, py::arg("output_tensor_list"),
           py::arg("input_tensor_list"), py::arg("async_op") = true)
      .def(
          "barrier",
          [](Group& g, bool async_op) {
            return issue([&] { return g.barrier({.async_op = async_op}); });
          },
          py::arg("async_op") = true)
      .def("isend",
           [](Group& g, py::handle tensor, int dst, int tag) {
             Tensor t = to_tensor(tensor, false, "tensor");
             return issue([&] { return g.isend(t, dst, {.tag = tag}); });
           })
      .def("irecv", [](Group& g, py::handle tensor, int src, int tag) {
        Tensor t = to_tensor(tensor, true, "tensor");
        return issue([&] { return g.irecv(t, src, {.tag = tag}); });
      });

  m.def(
      "init_process_group",
      [](const std::string& backend, const std::string& init_method, int rank,
         int world_size, Seconds timeout) {
        py::gil_scoped_release no_gil;
        return comm::init_process_group(backend, init_method, rank, world_size,
                                        millis(timeout));
      },
      py::arg("backend"), py::arg("init_method"), py::arg("rank"),
      py::arg("world_size"), py::arg("timeout"));
  m.attr("ANY_SOURCE") = comm::kAnySource;
  m.def("registered_backends", &comm::registered_backends,
        "The backend names init_process_group accepts in this build.");
  // Shared host memory (libcomm/shared_host_memory.h) as a flat buffer of
  // bytes, which numpy.frombuffer and torch.frombuffer view without a copy
  // and keep alive; the block is freed with the last view.
  py::class_<Tensor>(m, "SharedHostBuffer", py::buffer_protocol())
      .def_buffer([](Tensor& t) {
        return py::buffer_info(t.data_ptr(), 1, "B", t.nbytes());
      });
  m.def(
      "shared_host_buffer",
      [](std::int64_t nbytes) {
        if (nbytes < 0) {
          throw InvalidArgument(
              "shared_host_buffer: " + std::to_string(nbytes) +
              " bytes; give a size of 0 or more");
        }
        return Tensor::shared_host_zeros({nbytes}, DType::kU8);
      },
      "`nbytes` zeroed bytes of shared host memory, which the ranks of one "
      "host read directly in collectives whose every rank passes it.",
      py::arg("nbytes"));
  m.def(
      "check_tensors",
      [](const py::sequence& objects, bool writes, const std::string& what) {
        (void)to_tensors(objects, writes, what);
      },
      "Raises what a call taking `objects` would raise for them (a "
      "non-contiguous or read-only array, an unsupported dtype, ...), "
      "without a call: for the calls that issue one operation per tensor.",
      py::arg("objects"), py::arg("writes"), py::arg("what"));

  // ---- DDP and the sampler
  py::enum_<comm::CommHook>(m, "CommHook")
      .value("ALLREDUCE", comm::CommHook::kAllReduce)
      .value("FP16_COMPRESS", comm::CommHook::kFp16Compress)
      .value("BF16_COMPRESS", comm::CommHook::kBf16Compress);

  py::class_<Reducer>(m, "Reducer")
      .def(py::init([](GroupPtr group, std::vector<std::string> names,
                       py::sequence params, py::sequence grads,
                       std::vector<std::string> buffer_names,
                       py::sequence buffers, double bucket_cap_mb,
                       bool gradient_as_bucket_view,
                       bool find_unused_parameters, bool broadcast_buffers,
                       comm::CommHook comm_hook, bool shared_host_buckets) {
             comm::DdpOptions options;
             options.bucket_cap_mb = bucket_cap_mb;
             options.gradient_as_bucket_view = gradient_as_bucket_view;
             options.find_unused_parameters = find_unused_parameters;
             options.broadcast_buffers = broadcast_buffers;
             options.comm_hook = comm_hook;
             options.shared_host_buckets = shared_host_buckets;
             return std::make_unique<Reducer>(std::move(group), names, params,
                                              grads, buffer_names, buffers,
                                              options);
           }),
           py::arg("group"), py::arg("names"), py::arg("params"),
           py::arg("grads"), py::arg("buffer_names"), py::arg("buffers"),
           py::arg("bucket_cap_mb"), py::arg("gradient_as_bucket_view"),
           py::arg("find_unused_parameters"), py::arg("broadcast_buffers"),
           py::arg("comm_hook"), py::arg("shared_host_buckets") = true)
      .def("before_forward", &Reducer::before_forward,
           py::arg("backward_follows"))
      .def("mark_grad_ready", &Reducer::mark_grad_ready)
      .def("finish", &Reducer::finish)
      .def("enter_no_sync", &Reducer::enter_no_sync)
      .def("exit_no_sync", &Reducer::exit_no_sync)
      .def("grad", &Reducer::grad)
      .def("bucket_count", &Reducer::bucket_count)
      .def("bucket_parameters", &Reducer::bucket_parameters);

  py::class_<comm::DistributedSampler>(m, "DistributedSampler")
      .def(py::init([](std::size_t size, int rank, int world, bool shuffle,
                       std::uint64_t seed, bool drop_last) {
             return comm::DistributedSampler(
                 size, rank, world,
                 {.shuffle = shuffle, .seed = seed, .drop_last = drop_last});
           }),
           py::arg("dataset_size"), py::arg("rank"), py::arg("world"),
           py::arg("shuffle"), py::arg("seed"), py::arg("drop_last"))
      .def("set_epoch", &comm::DistributedSampler::set_epoch)
      .def_property_readonly("epoch", &comm::DistributedSampler::epoch)
      .def("__len__", &comm::DistributedSampler::num_samples)
      .def("indices", &comm::DistributedSampler::indices);
}
