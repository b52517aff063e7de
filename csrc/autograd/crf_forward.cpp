// crf_forward (autograd.h): LinearChainCRF.forward's common case in one call from Python: the checks, the batch-major
// views, the lengths' validation (sequence_lengths), the log-likelihood's node and the reduction, with no Python
// between them. Whatever is not that case -- an argument of another shape, dtype or device than the CRF accepts,
// a tensor subclass or functorch wrapper, a dispatch or torch-function mode, tensors on different devices or on
// a device other than the CPU and CUDA -- is declined (nullopt), and the Python path (structures/crf.py) runs and
// raises what is wrong: both paths make the same calls on the same kernels, so they give the same numbers and
// errors.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include "autograd/autograd.h"
#include "ops.h"
#include "tensor_api.h"

namespace semiring_ops {
namespace {

// A plain eager tensor: no Python subclass or mode keys, no functorch transform, no functionalisation.
bool plain(const at::Tensor& t) {
  static const c10::DispatchKeySet kWrapped({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                             c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                                             c10::DispatchKey::Functionalize});
  return !t.key_set().has_any(kWrapped);
}

bool integral(const at::Tensor& t) { return at::isIntegralType(t.scalar_type(), /*includeBool=*/false); }

at::ScalarType accumulation(at::ScalarType s) { return (s == at::kHalf || s == at::kBFloat16) ? at::kFloat : s; }

at::Tensor as_type(const at::Tensor& x, at::ScalarType type) { return x.scalar_type() == type ? x : x.to(type); }

// t on `device` (a CPU or CUDA device), a plain tensor.
bool on(const at::Tensor& t, const c10::Device& device) { return t.device() == device && plain(t); }

// The arguments the Python path accepts without raising, all on one CPU or CUDA device (see the file's comment).
bool accepted(const at::Tensor& emissions, const at::Tensor& tags, const std::optional<at::Tensor>& mask,
              const std::optional<at::Tensor>& lengths, const at::Tensor& transitions, const at::Tensor& start,
              const at::Tensor& end, bool batch_first) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0 || at::impl::torch_function_mode_enabled()) return false;
  if (emissions.dim() != 3 || transitions.dim() != 2 || start.dim() != 1 || end.dim() != 1) return false;
  const int64_t C = transitions.size(0);
  if (emissions.size(2) != C || transitions.size(1) != C || start.size(0) != C || end.size(0) != C) return false;
  const c10::Device device = emissions.device();
  if (!device.is_cpu() && !device.is_cuda()) return false;
  for (const at::Tensor* x : {&emissions, &transitions, &start, &end})
    if (!on(*x, device) || !at::isFloatingType(x->scalar_type())) return false;
  const auto steps = emissions.sizes().slice(0, 2);
  if (!on(tags, device) || tags.sizes() != steps || !integral(tags)) return false;
  if (mask && lengths) return false;
  if (mask && (!on(*mask, device) || mask->sizes() != steps ||
               (mask->scalar_type() != at::kBool && mask->scalar_type() != at::kByte)))
    return false;
  if (lengths && (!on(*lengths, device) || lengths->dim() != 1 ||
                  lengths->size(0) != emissions.size(batch_first ? 0 : 1) || !integral(*lengths)))
    return false;
  return true;
}

}  // namespace

std::optional<at::Tensor> crf_forward(const at::Tensor& emissions, const at::Tensor& tags,
                                      const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,
                                      const at::Tensor& transitions, const at::Tensor& start, const at::Tensor& end,
                                      bool batch_first, int64_t reduction, bool validate) {
  if (reduction < 0 || reduction > 3 || !accepted(emissions, tags, mask, lengths, transitions, start, end, batch_first))
    return std::nullopt;
  const at::Tensor em = batch_first ? emissions : emissions.transpose(0, 1);
  const at::Tensor tg = batch_first ? tags : tags.transpose(0, 1);
  std::optional<at::Tensor> mk;
  if (mask) mk = batch_first ? *mask : mask->transpose(0, 1);
  const int64_t B = em.size(0), T = em.size(1), C = em.size(2);
  const at::Tensor L = sequence_lengths(mk, lengths, tg, B, T, C, /*raise_errors=*/validate);
  const at::ScalarType type = at::promoteTypes(accumulation(em.scalar_type()), accumulation(transitions.scalar_type()));
  return crf_log_likelihood_autograd(as_type(em, type), as_type(transitions, type), as_type(start, type),
                                     as_type(end, type), L, as_type(tg, at::kLong), reduction)[0];
}

}  // namespace semiring_ops
