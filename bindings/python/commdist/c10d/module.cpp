// commdist.c10d._C: the pybind11 half of libcomm's torch.distributed
// backend. It registers ProcessGroupLibcomm as a subclass of torch's own
// ProcessGroup class: torch is built against Debian's pybind11 and shares
// its internals with this module, so the store torch passes in arrives as
// its C++ object and the group returned is torch's ProcessGroup to Python.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <vector>

#include "libcomm/logging.h"
#include "process_group_libcomm.h"
#include "torch_cuda.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, module) {
  module.doc() = "libcomm as a torch.distributed backend (see commdist.c10d)";
  // The groups create_process_group made, for close_all.
  static std::mutex made_mutex;
  static std::vector<
      c10::weak_intrusive_ptr<commdist_c10d::ProcessGroupLibcomm>>
      made;
  // Registers torch's ProcessGroup and Store classes with pybind11.
  py::module_::import("torch.distributed");
  // Python drops a group with the GIL held; its destructor waits for the
  // completion threads, which may need the GIL to finish a Future callback.
  commdist_c10d::ProcessGroupLibcomm::release_gil_while =
      [](const std::function<void()>& wait) {
        if (Py_IsInitialized() && PyGILState_Check()) {
          py::gil_scoped_release released;
          wait();
        } else {
          wait();
        }
      };

  py::class_<commdist_c10d::ProcessGroupLibcomm,
             c10::intrusive_ptr<commdist_c10d::ProcessGroupLibcomm>,
             c10d::ProcessGroup>(module, "ProcessGroupLibcomm",
                                 "torch.distributed's ProcessGroup over "
                                 "libcomm: CPU tensors over its TCP backend, "
                                 "CUDA tensors over its NCCL backend")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int,
                    std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>());

  // torch.distributed's creator function: (store, rank, size, timeout).
  // Joining the group blocks until every rank has; the GIL is released.
  module.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) {
        auto group = c10::make_intrusive<commdist_c10d::ProcessGroupLibcomm>(
            store, rank, size, timeout);
        std::lock_guard<std::mutex> lock(made_mutex);
        std::erase_if(made, [](const auto& weak) { return weak.expired(); });
        made.emplace_back(group);
        return group;
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>());

  module.def(
      "close_all",
      [] {
        // Strong references taken under the lock and used outside it: a
        // callback run by close() may drop a group's last reference.
        std::vector<c10::intrusive_ptr<commdist_c10d::ProcessGroupLibcomm>>
            live;
        {
          std::lock_guard<std::mutex> lock(made_mutex);
          for (const auto& weak : made) {
            if (auto group = weak.lock()) live.push_back(std::move(group));
          }
          made.clear();
        }
        for (const auto& group : live) group->close();
      },
      "Shuts down every libcomm group still alive (atexit calls it).");

  module.def("set_log_rank", &comm::set_log_rank, py::arg("rank"),
             "Log lines from now on carry this rank (-1: none).");

  module.def("cuda_support", &commdist_c10d::cuda_support,
             "What this build does with CUDA tensors, in one sentence.");
}
