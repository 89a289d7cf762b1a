// XLA:CPU FFI handlers running 2-D convolutions through ATen, i.e. oneDNN on x86 CPUs.
//
// XLA:CPU's own convolution kernels are slower than oneDNN's on small CNNs (benchmarks/step_profile.py), and their
// weight gradients add a transpose of every activation. These handlers wrap XLA's buffers as strided ATen tensors (no
// copy in), let at::convolution / at::convolution_backward pick oneDNN, and copy the result into XLA's output buffer.
//
// Layout: activations NHWC, kernels OHWI (the caller transposes Flax's HWIO or torch's OIHW kernels and NCHW
// activations; XLA fuses those transposes into the neighbouring ops). The ATen views are logically NCHW / OIHW with
// channels-last strides, which is oneDNN's fast layout for both: with plain NCHW it reorders every activation in and
// out of its blocked format on every call, and with HWIO kernels ATen copies each kernel (and its gradient) through
// a strided permutation on every call, a cost the convolutions themselves would otherwise not pay.
// Bias is left to the caller (an XLA add fuses into what follows).
//
// Threads: every ATen call runs on one thread of this library's own (AtenThread below), never on the XLA thread that
// made the call. ATen parallelizes with OpenMP, and GNU OpenMP keeps a team of worker threads for each thread that has
// started parallel work. XLA:CPU runs a step's thunks on all of its pool threads, so calling ATen from them leaves one
// team per pool thread. Once more OpenMP threads exist than cores, libgomp stops spinning at its barriers and sleeps in
// the kernel instead, at every barrier of every convolution, which slows every step on a small machine
// (benchmarks/README.md, "Measurements behind code choices"). With one calling thread there is one team, as in eager
// torch, and it stays warm between calls. JcReleaseCallerTeam lets the Python side free the teams other threads get
// from their own torch ops (torch_bridge.kernels.release_openmp_team).
#include <pthread.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/from_blob.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// float32, or bfloat16 under AMP; all buffers of a call alike. XLA checks neither the rank nor the type of an
// AnyBuffer when it decodes the call: CheckBuffers does.
using Buf = ffi::AnyBuffer;
using BufOut = ffi::Result<ffi::AnyBuffer>;
using Ints = ffi::Span<const int64_t>;

struct Geometry {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
};

at::TensorOptions Options(const Buf& b) {
  return at::TensorOptions().dtype(b.element_type() == ffi::DataType::BF16 ? at::kBFloat16 : at::kFloat);
}

// An NHWC activation buffer as a logically NCHW (channels-last) tensor.
at::Tensor Activation(const Buf& b) {
  auto d = b.dimensions();
  int64_t n = d[0], h = d[1], w = d[2], c = d[3];
  return at::from_blob(b.untyped_data(), {n, c, h, w}, {h * w * c, 1, w * c, c}, Options(b));
}

// An OHWI kernel buffer as a logically OIHW (channels-last) tensor.
at::Tensor Kernel(const Buf& b) {
  auto d = b.dimensions();
  int64_t o = d[0], kh = d[1], kw = d[2], i = d[3];
  return at::from_blob(b.untyped_data(), {o, i, kh, kw}, {kh * kw * i, 1, kw * i, i}, Options(b));
}

std::optional<ffi::Error> CheckBuffers(std::initializer_list<const Buf*> buffers) {
  const ffi::DataType type = (*buffers.begin())->element_type();
  if (type != ffi::DataType::F32 && type != ffi::DataType::BF16) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "onednn_conv: buffers must be float32 or bfloat16");
  }
  for (const Buf* b : buffers) {
    if (b->element_type() != type) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "onednn_conv: the buffers of one call must share a dtype");
    }
    if (b->dimensions().size() != 4) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "onednn_conv: buffers must have rank 4");
    }
  }
  return std::nullopt;
}

std::optional<ffi::Error> Check(const Geometry& g) {
  if (g.stride.size() != 2 || g.padding.size() != 2 || g.dilation.size() != 2 || g.groups < 1) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "onednn_conv: bad geometry attributes");
  }
  return std::nullopt;
}

// The one thread that calls ATen. Callers hand it a task and sleep until it is done; tasks from concurrent callers
// (XLA may run two convolutions at once) queue on submit_mu_, since each already gets all cores from OpenMP.
class AtenThread {
 public:
  static AtenThread& Get() {
    static std::mutex make_mu;
    static AtenThread* current = nullptr;  // never freed: its thread lives as long as the process
    std::lock_guard<std::mutex> lock(make_mu);
    if (current == nullptr || current->pid_ != getpid()) current = new AtenThread();  // a forked child: no thread
    return *current;
  }

  void Run(const std::function<void()>& task) {
    std::lock_guard<std::mutex> one_at_a_time(submit_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    task_ = &task;
    done_ = false;
    ready_cv_.notify_one();
    done_cv_.wait(lock, [this] { return done_; });
  }

 private:
  AtenThread() : pid_(getpid()) { std::thread([this] { Loop(); }).detach(); }

  void Loop() {
    pthread_setname_np(pthread_self(), "onednn-conv");  // its OpenMP workers inherit the name
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ready_cv_.wait(lock, [this] { return task_ != nullptr; });
      const std::function<void()>* task = task_;
      lock.unlock();
      (*task)();
      lock.lock();
      task_ = nullptr;
      done_ = true;
      done_cv_.notify_one();
    }
  }

  const pid_t pid_;
  std::mutex submit_mu_, mu_;
  std::condition_variable ready_cv_, done_cv_;
  const std::function<void()>* task_ = nullptr;
  bool done_ = false;
};

// Runs fn on the ATen thread; an exception becomes the call's error.
template <typename Fn>
ffi::Error Guarded(Fn fn) {
  std::string error;
  AtenThread::Get().Run([&] {
    try {
      fn();
    } catch (const std::exception& e) {
      error = std::string("onednn_conv: ") + e.what();
    }
  });
  if (!error.empty()) return ffi::Error(ffi::ErrorCode::kInternal, error);
  return ffi::Error::Success();
}

Geometry MakeGeometry(Ints stride, Ints padding, Ints dilation, int64_t groups) {
  return Geometry{{stride.begin(), stride.end()}, {padding.begin(), padding.end()},
                  {dilation.begin(), dilation.end()}, groups};
}

ffi::Error Forward(Buf x, Buf w, BufOut y, Ints stride, Ints padding, Ints dilation, int64_t groups) {
  Geometry g = MakeGeometry(stride, padding, dilation, groups);
  if (auto err = Check(g)) return *err;
  if (auto err = CheckBuffers({&x, &w, &*y})) return *err;
  return Guarded([&] {
    at::Tensor r = at::convolution(Activation(x), Kernel(w), std::nullopt, g.stride, g.padding, g.dilation, false,
                                   {0, 0}, groups);
    Activation(*y).copy_(r);
  });
}

// d(loss)/d(input): needs the kernel and the output cotangent (the input buffer only gives the shape).
ffi::Error BackwardInput(Buf w, Buf dy, BufOut dx, Ints stride, Ints padding, Ints dilation, int64_t groups) {
  Geometry g = MakeGeometry(stride, padding, dilation, groups);
  if (auto err = Check(g)) return *err;
  if (auto err = CheckBuffers({&w, &dy, &*dx})) return *err;
  return Guarded([&] {
    at::Tensor dx_view = Activation(*dx);
    auto grads = at::convolution_backward(Activation(dy), dx_view, Kernel(w), std::nullopt, g.stride,
                                          g.padding, g.dilation, false, {0, 0}, groups, {true, false, false});
    dx_view.copy_(std::get<0>(grads));
  });
}

// d(loss)/d(kernel): needs the input and the output cotangent.
ffi::Error BackwardKernel(Buf x, Buf dy, BufOut dw, Ints stride, Ints padding, Ints dilation, int64_t groups) {
  Geometry g = MakeGeometry(stride, padding, dilation, groups);
  if (auto err = Check(g)) return *err;
  if (auto err = CheckBuffers({&x, &dy, &*dw})) return *err;
  return Guarded([&] {
    at::Tensor dw_view = Kernel(*dw);
    auto grads = at::convolution_backward(Activation(dy), Activation(x), dw_view, std::nullopt, g.stride,
                                          g.padding, g.dilation, false, {0, 0}, groups, {false, true, false});
    dw_view.copy_(std::get<1>(grads));
  });
}

}  // namespace

#define JC_CONV_ATTRS                                                                   \
  .Attr<Ints>("stride").Attr<Ints>("padding").Attr<Ints>("dilation").Attr<int64_t>("groups")

XLA_FFI_DEFINE_HANDLER_SYMBOL(JcConvForward, Forward,
                              ffi::Ffi::Bind().Arg<Buf>().Arg<Buf>().Ret<Buf>() JC_CONV_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JcConvBackwardInput, BackwardInput,
                              ffi::Ffi::Bind().Arg<Buf>().Arg<Buf>().Ret<Buf>() JC_CONV_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JcConvBackwardKernel, BackwardKernel,
                              ffi::Ffi::Bind().Arg<Buf>().Arg<Buf>().Ret<Buf>() JC_CONV_ATTRS);

// GNU OpenMP (torch's runtime): frees the calling thread's worker team (OpenMP 5.0's omp_pause_soft). Its next
// parallel region starts a new one.
extern "C" int omp_pause_resource_all(int kind);
extern "C" int JcReleaseCallerTeam() { return omp_pause_resource_all(1); }
