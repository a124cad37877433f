// The C API (mpigrad/mpigrad_c.h) over EmbeddedModel. Every function body runs inside guarded(),
// which turns any exception into a status code and this thread's last-error message, so no C++
// exception ever reaches the C (or Fortran) caller. Handles are ids into a registry of live
// models; an id is never reused, so a destroyed handle is always recognised as such.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/storage.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/mpi_runtime.h"
#include "mpigrad/launch/insitu/c_api_internal.h"
#include "mpigrad/launch/insitu/embedded_model.h"
#include "mpigrad/launch/mpi_interop.h"
#include "mpigrad/mpigrad_c.h"
#include "mpigrad/version.h"

namespace {

using mpigrad::launch::ArrayRole;
using mpigrad::launch::EmbeddedModel;
using mpigrad::launch::EmbedError;
using mpigrad::launch::EmbedErrorKind;
namespace core = mpigrad::core;

static_assert(sizeof(mpigrad_fortran_comm) == sizeof(MPI_Fint),
              "mpigrad_fortran_comm must be MPI_Fint's size");

// An error with its status code, raised by the checks of this file.
class CallError : public std::exception {
 public:
  template <typename... Parts>
  CallError(mpigrad_status status, const Parts&... parts)
      : status_(status), message_(core::detail::concat(parts...)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  mpigrad_status status() const { return status_; }

 private:
  mpigrad_status status_;
  std::string message_;
};

thread_local std::string last_error;
thread_local std::optional<uint64_t> seed_override;

class Registry {
 public:
  mpigrad_model add(std::unique_ptr<EmbeddedModel> model) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t id = next_++;
    models_.emplace(id, std::shared_ptr<EmbeddedModel>(std::move(model)));
    return mpigrad_model{id};
  }
  // The live model of `handle`; the caller's copy keeps it alive while it is used.
  std::shared_ptr<EmbeddedModel> find(mpigrad_model handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = models_.find(handle.id);
    if (found == models_.end()) {
      throw CallError(MPIGRAD_ERROR_INVALID_HANDLE, "model handle ", handle.id,
                      handle.id == 0      ? " is the zero handle (no model; was it created?)"
                      : handle.id < next_ ? " was destroyed"
                                          : " was never created");
    }
    return found->second;
  }
  std::shared_ptr<EmbeddedModel> remove(mpigrad_model handle) {
    std::shared_ptr<EmbeddedModel> model = find(handle);
    std::lock_guard<std::mutex> lock(mutex_);
    models_.erase(handle.id);
    return model;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<EmbeddedModel>> models_;
  uint64_t next_ = 1;
};

// Not MPI, NCCL or CUDA state: the table from handle ids to the models they name.
Registry& registry() {
  static Registry instance;
  return instance;
}

mpigrad_status failed(const char* function, mpigrad_status status, const char* message) {
  last_error = std::string(function) + ": " + message;
  return status;
}

mpigrad_status status_of(EmbedErrorKind kind) {
  switch (kind) {
    case EmbedErrorKind::Shape:
      return MPIGRAD_ERROR_SHAPE;
    case EmbedErrorKind::DType:
      return MPIGRAD_ERROR_DTYPE;
    case EmbedErrorKind::Config:
      return MPIGRAD_ERROR_CONFIG;
    case EmbedErrorKind::File:
      return MPIGRAD_ERROR_FILE;
    case EmbedErrorKind::Value:
      return MPIGRAD_ERROR_INVALID_ARGUMENT;
  }
  return MPIGRAD_ERROR_RUNTIME;
}

template <typename Body>
mpigrad_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return MPIGRAD_SUCCESS;
  } catch (const CallError& error) {
    return failed(function, error.status(), error.what());
  } catch (const EmbedError& error) {
    return failed(function, status_of(error.kind()), error.what());
  } catch (const std::bad_alloc&) {
    return failed(function, MPIGRAD_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& error) {
    return failed(function, MPIGRAD_ERROR_RUNTIME, error.what());
  } catch (...) {
    return failed(function, MPIGRAD_ERROR_RUNTIME, "unknown exception");
  }
}

template <typename T>
T* require_pointer(T* pointer, const char* name) {
  if (pointer == nullptr) throw CallError(MPIGRAD_ERROR_NULL_POINTER, name, " is NULL");
  return pointer;
}

// A C caller may store any int in an enum field, and loading a value the C++ enum type cannot
// hold is undefined behaviour: the fields are read as their bits and checked before any use.
template <typename E>
int64_t enum_bits(const E& field) {
  std::underlying_type_t<E> bits;
  std::memcpy(&bits, &field, sizeof bits);
  return int64_t(bits);
}

core::DType dtype_of(int64_t dtype, const char* name) {
  switch (dtype) {
    case MPIGRAD_F32:
      return core::kFloat32;
    case MPIGRAD_F64:
      return core::kFloat64;
    case MPIGRAD_BF16:
      return core::kBFloat16;
    case MPIGRAD_F16:
      return core::kFloat16;
    case MPIGRAD_I32:
      return core::kInt32;
    case MPIGRAD_I64:
      return core::kInt64;
  }
  throw CallError(MPIGRAD_ERROR_DTYPE, name, ": unknown dtype ", int(dtype));
}

core::Device device_of(const char* text) {
  try {
    return core::Device::parse(text);
  } catch (const core::Error& error) {
    throw CallError(MPIGRAD_ERROR_INVALID_ARGUMENT, "device '", text, "': ", error.what());
  }
}

// The caller's memory as a tensor, without a copy: a Fortran-order array is the C-order array
// of the reversed shape (and strides).
core::Tensor wrap(const mpigrad_array* array, const char* name) {
  require_pointer(array, name);
  if (array->data == nullptr) throw CallError(MPIGRAD_ERROR_NULL_POINTER, name, ".data is NULL");
  const int rank = array->rank;
  if (rank < 1 || rank > MPIGRAD_MAX_RANK) {
    throw CallError(MPIGRAD_ERROR_INVALID_ARGUMENT, name, ".rank is ", rank, "; expected 1 to ",
                    MPIGRAD_MAX_RANK);
  }
  const int64_t order = enum_bits(array->order);
  if (order != MPIGRAD_ORDER_C && order != MPIGRAD_ORDER_FORTRAN) {
    throw CallError(MPIGRAD_ERROR_INVALID_ARGUMENT, name, ".order is ", order,
                    "; expected MPIGRAD_ORDER_C or MPIGRAD_ORDER_FORTRAN");
  }
  const core::DType dtype = dtype_of(enum_bits(array->dtype), name);
  const int64_t memory = enum_bits(array->memory);
  core::Device device = core::kCPU;
  if (memory == MPIGRAD_MEMORY_CUDA) {
    if (!core::cuda_built()) {
      throw CallError(MPIGRAD_ERROR_UNSUPPORTED, name,
                      " is CUDA memory, but this mpigrad was "
                      "built without CUDA");
    }
    device = core::cuda(array->device);
  } else if (memory != MPIGRAD_MEMORY_HOST) {
    throw CallError(MPIGRAD_ERROR_INVALID_ARGUMENT, name, ".memory is ", memory,
                    "; expected MPIGRAD_MEMORY_HOST or MPIGRAD_MEMORY_CUDA");
  }
  const bool fortran = array->order == MPIGRAD_ORDER_FORTRAN;
  std::vector<int64_t> shape(static_cast<size_t>(rank)), strides(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) {
    const int from = fortran ? rank - 1 - d : d;
    shape[size_t(d)] = array->shape[from];
    if (shape[size_t(d)] < 1) {
      throw CallError(MPIGRAD_ERROR_SHAPE, name, ".shape[", from, "] is ", shape[size_t(d)],
                      "; every extent must be at least 1");
    }
    if (array->strides != nullptr) {
      strides[size_t(d)] = array->strides[from];
      if (strides[size_t(d)] < 1) {
        throw CallError(MPIGRAD_ERROR_INVALID_ARGUMENT, name, ".strides[", from, "] is ",
                        strides[size_t(d)], "; strides are positive element counts");
      }
    }
  }
  if (array->strides == nullptr) {
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      strides[size_t(d)] = stride;
      stride *= shape[size_t(d)];
    }
  }
  int64_t last = 0;  // the offset of the last element the array spans
  for (int d = 0; d < rank; ++d) last += (shape[size_t(d)] - 1) * strides[size_t(d)];
  const size_t bytes = size_t(last + 1) * size_t(core::element_size(dtype));
  auto storage = std::make_shared<core::Storage>(array->data, bytes, device);
  return core::Tensor(std::make_shared<core::TensorImpl>(storage, core::Shape(shape),
                                                         core::Shape(strides), 0, dtype));
}

// A C-order shape as the caller writes it: [16, 1, 32, 32] in C, (32, 32, 1, 16) in Fortran.
std::string in_caller_order(const core::Shape& shape, bool fortran) {
  if (!fortran) return core::detail::concat(shape);
  std::string text = "(";
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    text += std::to_string(shape[d]) + (d ? ", " : "");
  }
  return text + ") in Fortran order";
}

// `array`'s shape as its caller wrote it, in the same words as in_caller_order.
std::string shape_text(const mpigrad_array* array) {
  const bool fortran = array->order == MPIGRAD_ORDER_FORTRAN;
  std::vector<int64_t> c_order(array->shape, array->shape + array->rank);
  if (fortran) std::reverse(c_order.begin(), c_order.end());
  return in_caller_order(core::Shape(c_order), fortran);
}

// Throws CallError (MPIGRAD_ERROR_SHAPE) unless the samples of `tensor` (wrap()'s view of
// `array`) have the model's sample shape for `role`, rank and every extent, or the flattening
// EmbeddedModel::fits allows. The message gives both shapes in the caller's order.
void check_samples(const EmbeddedModel& model, const core::Tensor& tensor,
                   const mpigrad_array* array, ArrayRole role, const char* name, size_t index = 0) {
  core::Shape sample = tensor.shape();
  sample.erase(0);
  if (model.fits(sample, role, index)) return;
  const bool fortran = array->order == MPIGRAD_ORDER_FORTRAN;
  const core::Shape expected = model.sample_shape(role, index);
  core::Shape whole = expected;
  whole.insert(0, tensor.size(0));
  const std::string got = in_caller_order(tensor.shape(), fortran);
  const std::string want = in_caller_order(whole, fortran);
  if (expected.size() == 0) {
    throw CallError(MPIGRAD_ERROR_SHAPE, name, ": shape ", got,
                    "; cross_entropy needs one class per sample: expected ", want);
  }
  std::string owner = role == ArrayRole::Input
                          ? (index == 0 ? "[model] input_shape " : "the graph's input ")
                          : "the model outputs ";
  owner += core::detail::concat(expected);
  if (fortran) owner += ", a sample " + in_caller_order(expected, true) + ",";
  if (sample.numel() != expected.numel()) {
    throw CallError(MPIGRAD_ERROR_SHAPE, name, ": shape ", got, " holds ", sample.numel(),
                    " values per sample, but ", owner, role == ArrayRole::Input ? " needs " : " (",
                    expected.numel(), role == ArrayRole::Input ? "" : " values)", "; expected ",
                    want);
  }
  throw CallError(MPIGRAD_ERROR_SHAPE, name, ": shape ", got, " is ", tensor.size(0),
                  " samples of shape ", in_caller_order(sample, fortran), ", but ", owner,
                  " and rank and every extent must match; expected ", want);
}

// The sample calls refuse an interatomic potential before they look at any array's shape.
const std::shared_ptr<EmbeddedModel>& samples_model(const std::shared_ptr<EmbeddedModel>& model) {
  if (model->atomistic()) {
    throw CallError(MPIGRAD_ERROR_CONFIG,
                    "this model is an interatomic potential ([loss] name = energy_force): pass "
                    "atomic structures to mpigrad_atoms_predict and mpigrad_atoms_train_step");
  }
  return model;
}

// Runs `body` with the caller's CUDA stream (a cudaStream_t; null: the current one) as the
// current stream of the model's device, so every kernel and copy of the call is queued on it,
// after the caller's work, and nothing waits for the device.
template <typename Body>
void on_stream(const EmbeddedModel& model, void* stream, Body&& body) {
  if (stream == nullptr) return body();
  if (!model.device().is_cuda()) {
    throw CallError(MPIGRAD_ERROR_INVALID_ARGUMENT, "stream: a CUDA stream for a model on ",
                    model.device(), " (pass NULL)");
  }
  core::StreamGuard guard(core::StreamView(model.device(), stream));
  body();
}

// The name of each status, as mpigrad_c.h spells it.
constexpr core::EnumName<mpigrad_status> kStatusNames[] = {
    {MPIGRAD_SUCCESS, "MPIGRAD_SUCCESS"},
    {MPIGRAD_ERROR_NULL_POINTER, "MPIGRAD_ERROR_NULL_POINTER"},
    {MPIGRAD_ERROR_INVALID_HANDLE, "MPIGRAD_ERROR_INVALID_HANDLE"},
    {MPIGRAD_ERROR_INVALID_ARGUMENT, "MPIGRAD_ERROR_INVALID_ARGUMENT"},
    {MPIGRAD_ERROR_SHAPE, "MPIGRAD_ERROR_SHAPE"},
    {MPIGRAD_ERROR_DTYPE, "MPIGRAD_ERROR_DTYPE"},
    {MPIGRAD_ERROR_CONFIG, "MPIGRAD_ERROR_CONFIG"},
    {MPIGRAD_ERROR_FILE, "MPIGRAD_ERROR_FILE"},
    {MPIGRAD_ERROR_MPI, "MPIGRAD_ERROR_MPI"},
    {MPIGRAD_ERROR_UNSUPPORTED, "MPIGRAD_ERROR_UNSUPPORTED"},
    {MPIGRAD_ERROR_OUT_OF_MEMORY, "MPIGRAD_ERROR_OUT_OF_MEMORY"},
    {MPIGRAD_ERROR_RUNTIME, "MPIGRAD_ERROR_RUNTIME"},
};

}  // namespace

extern "C" {

const char* mpigrad_version(void) {
  return MPIGRAD_VERSION;
}

mpigrad_status mpigrad_record_error(const char* function, mpigrad_status status,
                                    const char* message) {
  return failed(function != nullptr ? function : "(mpigrad)", status,
                message != nullptr ? message : "(no message)");
}

const char* mpigrad_last_error(void) {
  return last_error.c_str();
}

const char* mpigrad_status_name(mpigrad_status status) {
  const std::string_view name = mpigrad::core::enum_name(status, kStatusNames);
  return name == "?" ? "(unknown status)" : name.data();  // the table's names are literals
}

mpigrad_status mpigrad_set_seed(uint64_t seed) {
  return guarded("mpigrad_set_seed", [&] { seed_override = seed; });
}

mpigrad_status mpigrad_model_create(mpigrad_model* model, const char* config, const char* device) {
  return guarded("mpigrad_model_create", [&] {
    require_pointer(model, "model");
    *model = mpigrad_model{0};
    require_pointer(config, "config");
    require_pointer(device, "device");
    const core::Device place = device_of(device);
    *model = registry().add(std::make_unique<EmbeddedModel>(config, place, seed_override));
  });
}

mpigrad_status mpigrad_model_create_distributed(mpigrad_model* model, const char* config,
                                                mpigrad_fortran_comm comm, const char* device) {
  return guarded("mpigrad_model_create_distributed", [&] {
    require_pointer(model, "model");
    *model = mpigrad_model{0};
    require_pointer(config, "config");
    const mpigrad::launch::MpiLifecycle mpi = mpigrad::launch::mpi_lifecycle();
    if (mpi != mpigrad::launch::MpiLifecycle::Running) {
      throw CallError(
          MPIGRAD_ERROR_MPI, "MPI is ",
          mpi == mpigrad::launch::MpiLifecycle::Finalized ? "finalized" : "not initialized",
          "; the host calls MPI_Init before creating a distributed model (mpigrad "
          "never initializes MPI for a host)");
    }
    std::optional<core::Device> place;
    if (device != nullptr && *device != '\0') place = device_of(device);
    mpigrad::launch::DistributedOptions options;
    options.device = place;
    std::optional<mpigrad::launch::DistributedManager> manager;
    try {
      manager.emplace(
          mpigrad::launch::adopt_communicator_fortran(static_cast<MPI_Fint>(comm), options));
    } catch (const core::Error& error) {
      throw CallError(MPIGRAD_ERROR_MPI, "the communicator (Fortran handle ", comm,
                      "): ", error.what());
    }
    *model = registry().add(
        std::make_unique<EmbeddedModel>(config, std::move(*manager), place, seed_override));
  });
}

mpigrad_status mpigrad_model_destroy(mpigrad_model* model) {
  return guarded("mpigrad_model_destroy", [&] {
    require_pointer(model, "model");
    if (model->id == 0) return;
    std::shared_ptr<EmbeddedModel> gone = registry().remove(*model);
    *model = mpigrad_model{0};
    gone.reset();  // the last owner unless another thread is inside a call with it
  });
}

mpigrad_status mpigrad_train_step(mpigrad_model model, const mpigrad_array* input,
                                  const mpigrad_array* label, double* loss) {
  return mpigrad_train_step_on_stream(model, input, label, loss, nullptr);
}

mpigrad_status mpigrad_train_step_on_stream(mpigrad_model model, const mpigrad_array* input,
                                            const mpigrad_array* label, double* loss,
                                            void* stream) {
  return guarded("mpigrad_train_step", [&] {
    std::shared_ptr<EmbeddedModel> target = samples_model(registry().find(model));
    on_stream(*target, stream, [&] {
      core::Tensor x = wrap(input, "input");
      core::Tensor y = wrap(label, "label");
      if (x.size(0) != y.size(0)) {
        throw CallError(MPIGRAD_ERROR_SHAPE, "input ", shape_text(input), " and label ",
                        shape_text(label), " hold different batches (", x.size(0), " and ",
                        y.size(0),
                        " samples; the batch is the first C-order extent, the last "
                        "Fortran-order one)");
      }
      core::Tensor value;
      try {
        value = target->train_step(x, y);  // checks dtypes, then shapes, before it trains
      } catch (const EmbedError& error) {
        if (error.kind() == EmbedErrorKind::Shape) {  // said again in the caller's order
          check_samples(*target, x, input, ArrayRole::Input, "input");
          check_samples(*target, y, label, ArrayRole::Label, "label");
        }
        throw;
      }
      if (loss != nullptr) *loss = value.item<double>();
    });
  });
}

mpigrad_status mpigrad_last_loss(mpigrad_model model, double* loss) {
  return guarded("mpigrad_last_loss", [&] {
    require_pointer(loss, "loss");
    *loss = registry().find(model)->last_loss();
  });
}

mpigrad_status mpigrad_mean_loss(mpigrad_model model, double* loss) {
  return guarded("mpigrad_mean_loss", [&] {
    require_pointer(loss, "loss");
    *loss = registry().find(model)->mean_loss();
  });
}

mpigrad_status mpigrad_set_step_callback(mpigrad_model model, mpigrad_step_callback callback,
                                         void* user_data) {
  return guarded("mpigrad_set_step_callback", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    if (callback == nullptr) {
      target->set_step_callback(nullptr);
      return;
    }
    target->set_step_callback([model, callback, user_data](int64_t step, double lr) {
      callback(model, step, lr, user_data);
    });
  });
}

mpigrad_status mpigrad_predict(mpigrad_model model, const mpigrad_array* input,
                               const mpigrad_array* output) {
  return mpigrad_predict_on_stream(model, input, output, nullptr);
}

mpigrad_status mpigrad_predict_on_stream(mpigrad_model model, const mpigrad_array* input,
                                         const mpigrad_array* output, void* stream) {
  return guarded("mpigrad_predict", [&] {
    std::shared_ptr<EmbeddedModel> target = samples_model(registry().find(model));
    on_stream(*target, stream, [&] {
      core::Tensor x = wrap(input, "input");
      core::Tensor out = wrap(output, "output");
      if (!core::is_floating(out.dtype())) {
        throw CallError(MPIGRAD_ERROR_DTYPE, "output: dtype ", out.dtype(),
                        "; predictions are "
                        "written as float32, float64, bfloat16 or float16");
      }
      const int64_t batch = x.size(0), per_sample = target->output_shape().numel();
      if (out.size(0) != batch) {
        throw CallError(MPIGRAD_ERROR_SHAPE, "output ", shape_text(output),
                        " must hold the "
                        "input's batch of ",
                        batch, " samples of ", per_sample,
                        " values (the "
                        "model outputs ",
                        target->output_shape(), ")");
      }
      check_samples(*target, out, output, ArrayRole::Output, "output");
      core::Tensor prediction;
      try {
        prediction = target->predict(x);
      } catch (const EmbedError& error) {
        if (error.kind() == EmbedErrorKind::Shape) {
          check_samples(*target, x, input, ArrayRole::Input, "input");
        }
        throw;
      }
      core::NoGradGuard no_grad;
      out.copy_(prediction.reshape(out.shape()));
    });
  });
}

}  // extern "C"

namespace {

// The caller's `count` arrays, each wrapped as wrap() does and named "<name>[i]".
std::vector<core::Tensor> wrap_all(int32_t count, const mpigrad_array* arrays, const char* name,
                                   size_t expected) {
  if (count < 0 || size_t(count) != expected) {
    throw CallError(MPIGRAD_ERROR_SHAPE, "n_", name, " is ", count, "; the model has ", expected,
                    std::string(name) == "inputs" ? " graph input(s)" : " graph output(s)");
  }
  require_pointer(arrays, name);
  std::vector<core::Tensor> tensors;
  for (int32_t i = 0; i < count; ++i) {
    const std::string what = std::string(name) + "[" + std::to_string(i) + "]";
    tensors.push_back(wrap(&arrays[i], what.c_str()));
  }
  return tensors;
}

// After an EmbedError (Shape) from the model, the same check again in the caller's order.
void recheck_shapes(const EmbeddedModel& model, const std::vector<core::Tensor>& tensors,
                    const mpigrad_array* arrays, ArrayRole role, const char* name) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string what = std::string(name) + "[" + std::to_string(i) + "]";
    check_samples(model, tensors[i], &arrays[i], role, what.c_str(), i);
  }
}

}  // namespace

extern "C" {

mpigrad_status mpigrad_train_step_multi(mpigrad_model model, int32_t n_inputs,
                                        const mpigrad_array* inputs, int32_t n_labels,
                                        const mpigrad_array* labels, double* loss) {
  return guarded("mpigrad_train_step_multi", [&] {
    std::shared_ptr<EmbeddedModel> target = samples_model(registry().find(model));
    std::vector<core::Tensor> x = wrap_all(n_inputs, inputs, "inputs", target->input_count());
    std::vector<core::Tensor> y = wrap_all(n_labels, labels, "labels", target->output_count());
    core::Tensor value;
    try {
      value = target->train_step_multi(x, y);
    } catch (const EmbedError& error) {
      if (error.kind() == EmbedErrorKind::Shape) {
        recheck_shapes(*target, x, inputs, ArrayRole::Input, "inputs");
        recheck_shapes(*target, y, labels, ArrayRole::Label, "labels");
      }
      throw;
    }
    if (loss != nullptr) *loss = value.item<double>();
  });
}

mpigrad_status mpigrad_predict_multi(mpigrad_model model, int32_t n_inputs,
                                     const mpigrad_array* inputs, int32_t n_outputs,
                                     const mpigrad_array* outputs) {
  return guarded("mpigrad_predict_multi", [&] {
    std::shared_ptr<EmbeddedModel> target = samples_model(registry().find(model));
    std::vector<core::Tensor> x = wrap_all(n_inputs, inputs, "inputs", target->input_count());
    std::vector<core::Tensor> out = wrap_all(n_outputs, outputs, "outputs", target->output_count());
    for (size_t i = 0; i < out.size(); ++i) {
      const std::string what = "outputs[" + std::to_string(i) + "]";
      if (!core::is_floating(out[i].dtype())) {
        throw CallError(MPIGRAD_ERROR_DTYPE, what, ": dtype ", out[i].dtype(),
                        "; predictions are written as float32, float64, bfloat16 or float16");
      }
      if (out[i].size(0) != x.front().size(0)) {
        throw CallError(MPIGRAD_ERROR_SHAPE, what, " ", shape_text(&outputs[i]),
                        " must hold the inputs' batch of ", x.front().size(0), " samples");
      }
      check_samples(*target, out[i], &outputs[i], ArrayRole::Output, what.c_str(), i);
    }
    std::vector<core::Tensor> predictions;
    try {
      predictions = target->predict_multi(x);
    } catch (const EmbedError& error) {
      if (error.kind() == EmbedErrorKind::Shape) {
        recheck_shapes(*target, x, inputs, ArrayRole::Input, "inputs");
      }
      throw;
    }
    core::NoGradGuard no_grad;
    for (size_t i = 0; i < out.size(); ++i) out[i].copy_(predictions[i].reshape(out[i].shape()));
  });
}

mpigrad_status mpigrad_model_arrays(mpigrad_model model, int32_t* n_inputs, int32_t* n_outputs) {
  return guarded("mpigrad_model_arrays", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    if (n_inputs != nullptr) *n_inputs = int32_t(target->input_count());
    if (n_outputs != nullptr) *n_outputs = int32_t(target->output_count());
  });
}

mpigrad_status mpigrad_save_model(mpigrad_model model, const char* path) {
  return guarded("mpigrad_save_model", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    target->save_model(require_pointer(path, "path"));
  });
}

mpigrad_status mpigrad_load_model(mpigrad_model model, const char* path) {
  return guarded("mpigrad_load_model", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    target->load_model(require_pointer(path, "path"));
  });
}

mpigrad_status mpigrad_save_checkpoint(mpigrad_model model, const char* path) {
  return guarded("mpigrad_save_checkpoint", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    target->save_checkpoint(require_pointer(path, "path"));
  });
}

mpigrad_status mpigrad_load_checkpoint(mpigrad_model model, const char* path) {
  return guarded("mpigrad_load_checkpoint", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    target->load_checkpoint(require_pointer(path, "path"));
  });
}

mpigrad_status mpigrad_steps(mpigrad_model model, int64_t* steps) {
  return guarded("mpigrad_steps", [&] {
    require_pointer(steps, "steps");
    *steps = registry().find(model)->steps();
  });
}

mpigrad_status mpigrad_copied_bytes(mpigrad_model model, int64_t* bytes) {
  return guarded("mpigrad_copied_bytes", [&] {
    require_pointer(bytes, "bytes");
    *bytes = registry().find(model)->copied_bytes();
  });
}

}  // extern "C"

namespace {

// The caller's structures as EmbeddedModel takes them: each array given wrapped where it lies.
mpigrad::launch::HostAtoms host_atoms(const mpigrad_atoms* atoms) {
  require_pointer(atoms, "atoms");
  mpigrad::launch::HostAtoms host;
  host.positions = wrap(atoms->positions, "positions");
  host.atomic_numbers = wrap(atoms->atomic_numbers, "atomic_numbers");
  const auto optional = [](const mpigrad_array* array, const char* name) {
    return array != nullptr ? wrap(array, name) : core::Tensor();
  };
  host.num_atoms = optional(atoms->num_atoms, "num_atoms");
  host.cell = optional(atoms->cell, "cell");
  host.pbc = optional(atoms->pbc, "pbc");
  host.edge_index = optional(atoms->edge_index, "edge_index");
  host.edge_shifts = optional(atoms->edge_shifts, "edge_shifts");
  if (atoms->index_base != 0 && atoms->index_base != 1) {
    throw CallError(MPIGRAD_ERROR_INVALID_ARGUMENT, "index_base is ", atoms->index_base,
                    "; expected 0 (C) or 1 (Fortran)");
  }
  host.index_base = atoms->index_base;
  return host;
}

// An output array of floats holding `shape` (C order; energy [B] may also be [B, 1]).
core::Tensor output_array(const mpigrad_array* array, const char* name, const core::Shape& shape) {
  core::Tensor out = wrap(array, name);
  if (!core::is_floating(out.dtype())) {
    throw CallError(MPIGRAD_ERROR_DTYPE, name, ": dtype ", out.dtype(),
                    "; energies and forces are written as float64 or float32");
  }
  const bool column = shape.size() == 1 && out.dim() == 2 && out.size(1) == 1;
  if (out.shape() != shape && !(column && out.size(0) == shape[0])) {
    throw CallError(MPIGRAD_ERROR_SHAPE, name, ": shape ", shape_text(array), "; expected ",
                    in_caller_order(shape, array->order == MPIGRAD_ORDER_FORTRAN));
  }
  return out;
}

}  // namespace

extern "C" {

mpigrad_status mpigrad_atoms_predict(mpigrad_model model, const mpigrad_atoms* atoms,
                                     const mpigrad_array* energy, const mpigrad_array* forces) {
  return guarded("mpigrad_atoms_predict", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    const mpigrad::launch::HostAtoms host = host_atoms(atoms);
    const int64_t structures = mpigrad::launch::structure_count(host);
    core::Tensor energy_out = output_array(energy, "energy", {structures});
    core::Tensor forces_out;
    if (forces != nullptr) {
      forces_out = output_array(forces, "forces", {host.positions.size(0), 3});
    }
    const EmbeddedModel::AtomsPrediction predicted = target->predict_atoms(host, forces != nullptr);
    core::NoGradGuard no_grad;
    energy_out.copy_(predicted.energy.reshape(energy_out.shape()));
    if (forces_out.defined()) forces_out.copy_(predicted.forces);
  });
}

mpigrad_status mpigrad_atoms_train_step(mpigrad_model model, const mpigrad_atoms* atoms,
                                        const mpigrad_array* energy, const mpigrad_array* forces,
                                        double* loss) {
  return guarded("mpigrad_atoms_train_step", [&] {
    std::shared_ptr<EmbeddedModel> target = registry().find(model);
    // Wrapping fails only on a malformed descriptor; the model's checks of shapes and contents
    // are agreed between the ranks before the step.
    const mpigrad::launch::HostAtoms host = host_atoms(atoms);
    const core::Tensor energy_label = wrap(energy, "energy");
    const core::Tensor forces_label = forces != nullptr ? wrap(forces, "forces") : core::Tensor();
    core::Tensor value = target->train_step_atoms(host, energy_label, forces_label);
    if (loss != nullptr) *loss = value.item<double>();
  });
}

}  // extern "C"
