// XLA:CPU FFI handlers running 2-D convolutions through ATen, i.e. oneDNN on x86 CPUs.
//
// XLA:CPU's own convolution kernels take ~2x oneDNN's time on small CNNs, and their weight gradients add a
// transpose of every activation. These handlers wrap XLA's buffers as strided ATen tensors (no copy in), let
// at::convolution / at::convolution_backward pick oneDNN, and copy the result into XLA's output buffer.
//
// Layout: activations NHWC, kernels OHWI (the caller transposes Flax's HWIO or torch's OIHW kernels and NCHW
// activations; XLA fuses those transposes into the neighbouring ops). The ATen views are logically NCHW / OIHW with
// channels-last strides, which is oneDNN's fast layout for both: with plain NCHW it reorders every activation in and
// out of its blocked format on every call, and with HWIO kernels ATen copies each kernel (and its gradient) through
// a strided permutation on every call (~10% of the convolutions' time on a small ResNet).
// Bias is left to the caller (an XLA add fuses into what follows).
#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/from_blob.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using F32 = ffi::Buffer<ffi::F32, 4>;  // XLA checks the rank when it decodes the call
using F32Out = ffi::ResultBuffer<ffi::F32, 4>;
using Ints = ffi::Span<const int64_t>;

struct Geometry {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
};

// An NHWC activation buffer as a logically NCHW (channels-last) tensor.
at::Tensor Activation(float* data, ffi::Span<const int64_t> d) {
  int64_t n = d[0], h = d[1], w = d[2], c = d[3];
  return at::from_blob(data, {n, c, h, w}, {h * w * c, 1, w * c, c}, at::TensorOptions().dtype(at::kFloat));
}

// An OHWI kernel buffer as a logically OIHW (channels-last) tensor.
at::Tensor Kernel(float* data, ffi::Span<const int64_t> d) {
  int64_t o = d[0], kh = d[1], kw = d[2], i = d[3];
  return at::from_blob(data, {o, i, kh, kw}, {kh * kw * i, 1, kw * i, i}, at::TensorOptions().dtype(at::kFloat));
}

std::optional<ffi::Error> Check(const Geometry& g) {
  if (g.stride.size() != 2 || g.padding.size() != 2 || g.dilation.size() != 2 || g.groups < 1) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "onednn_conv: bad geometry attributes");
  }
  return std::nullopt;
}

template <typename Fn>
ffi::Error Guarded(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("onednn_conv: ") + e.what());
  }
  return ffi::Error::Success();
}

Geometry MakeGeometry(Ints stride, Ints padding, Ints dilation, int64_t groups) {
  return Geometry{{stride.begin(), stride.end()}, {padding.begin(), padding.end()},
                  {dilation.begin(), dilation.end()}, groups};
}

ffi::Error Forward(F32 x, F32 w, F32Out y, Ints stride, Ints padding, Ints dilation, int64_t groups) {
  Geometry g = MakeGeometry(stride, padding, dilation, groups);
  if (auto err = Check(g)) return *err;
  return Guarded([&] {
    at::Tensor r = at::convolution(Activation(x.typed_data(), x.dimensions()),
                                   Kernel(w.typed_data(), w.dimensions()), std::nullopt, g.stride,
                                   g.padding, g.dilation, false, {0, 0}, groups);
    Activation(y->typed_data(), y->dimensions()).copy_(r);
  });
}

// d(loss)/d(input): needs the kernel and the output cotangent (the input buffer only gives the shape).
ffi::Error BackwardInput(F32 w, F32 dy, F32Out dx, Ints stride, Ints padding, Ints dilation, int64_t groups) {
  Geometry g = MakeGeometry(stride, padding, dilation, groups);
  if (auto err = Check(g)) return *err;
  return Guarded([&] {
    at::Tensor dx_view = Activation(dx->typed_data(), dx->dimensions());
    auto grads = at::convolution_backward(Activation(dy.typed_data(), dy.dimensions()), dx_view,
                                          Kernel(w.typed_data(), w.dimensions()), std::nullopt, g.stride,
                                          g.padding, g.dilation, false, {0, 0}, groups, {true, false, false});
    dx_view.copy_(std::get<0>(grads));
  });
}

// d(loss)/d(kernel): needs the input and the output cotangent.
ffi::Error BackwardKernel(F32 x, F32 dy, F32Out dw, Ints stride, Ints padding, Ints dilation, int64_t groups) {
  Geometry g = MakeGeometry(stride, padding, dilation, groups);
  if (auto err = Check(g)) return *err;
  return Guarded([&] {
    at::Tensor dw_view = Kernel(dw->typed_data(), dw->dimensions());
    auto grads = at::convolution_backward(Activation(dy.typed_data(), dy.dimensions()),
                                          Activation(x.typed_data(), x.dimensions()), dw_view,
                                          std::nullopt, g.stride, g.padding, g.dilation, false, {0, 0}, groups,
                                          {false, true, false});
    dw_view.copy_(std::get<1>(grads));
  });
}

}  // namespace

#define JC_CONV_ATTRS                                                                   \
  .Attr<Ints>("stride").Attr<Ints>("padding").Attr<Ints>("dilation").Attr<int64_t>("groups")

XLA_FFI_DEFINE_HANDLER_SYMBOL(JcConvForward, Forward,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>() JC_CONV_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JcConvBackwardInput, BackwardInput,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>() JC_CONV_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JcConvBackwardKernel, BackwardKernel,
                              ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Ret<F32>() JC_CONV_ATTRS);
