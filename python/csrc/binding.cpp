// The lossfuse torch library: the shared conversions, the thread-pool hook, and the small ops every loss's
// autograd uses.
#include "binding.hpp"

#include <ATen/Parallel.h>

#include <mutex>
#include <set>
#include <string>

#include "allocator.hpp"
#include "lossfuse/catalog.hpp"
#include "lossfuse/parallel.hpp"

namespace lossfuse::torch_binding {
namespace {

std::optional<DType> dtype_of(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DType::f32;
    case at::kDouble: return DType::f64;
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    case at::kByte: return DType::u8;
    case at::kChar: return DType::i8;
    case at::kShort: return DType::i16;
    case at::kInt: return DType::i32;
    case at::kLong: return DType::i64;
    default: return std::nullopt;
  }
}

// Kernels split their work with lossfuse::parallel_for; inside torch it runs on torch's intra-op pool, so
// torch.set_num_threads applies and no second pool (or OpenMP runtime) is started. at::parallel_for is a header
// template whose OpenMP body exists only where _OPENMP is defined: this file is compiled with -fopenmp (and the
// library links the libgomp.so.1 torch has loaded already), else every kernel would run on one thread.
void torch_parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, ParallelBody body, void* ctx) {
  at::parallel_for(begin, end, grain, [&](std::int64_t b, std::int64_t e) { body(ctx, b, e); });
}

const bool g_hook_installed = [] {
  set_parallel_for_hook(&torch_parallel_for);
  return true;
}();

}  // namespace

TensorView view(const at::Tensor& t, const char* arg) {
  TORCH_CHECK(t.defined(), "lossfuse: ", arg, ": expected a tensor, got None");
  const bool cuda = t.is_cuda() && has_cuda();
  TORCH_CHECK(t.device().is_cpu() || cuda, "lossfuse: ", arg,
              has_cuda() ? ": expected a CPU or CUDA tensor, got one on " : ": expected a CPU tensor, got one on ",
              t.device(), has_cuda() ? "" : " (this build has CPU kernels only)");
  const auto dt = dtype_of(t.scalar_type());
  TORCH_CHECK(dt.has_value(), "lossfuse: ", arg,
              ": expected float32, float64, float16, bfloat16 or an integer dtype, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() <= kMaxDims, "lossfuse: ", arg, ": expected at most ", kMaxDims, " dims, got ", t.dim());
  TensorView v;
  v.data = t.numel() > 0 ? const_cast<void*>(t.const_data_ptr()) : nullptr;
  v.dtype = *dt;
  v.device = cuda ? Device::cuda : Device::cpu;
  v.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < v.ndim; ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

std::optional<TensorView> view(const std::optional<at::Tensor>& t, const char* arg) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return view(*t, arg);
}

Reduction reduction(std::int64_t r) {
  switch (r) {
    case 0: return Reduction::none;
    case 1: return Reduction::mean;
    case 2: return Reduction::sum;
    default: TORCH_CHECK_VALUE(false, "lossfuse: reduction: expected 0 (none), 1 (mean) or 2 (sum), got ", r);
  }
}

at::ScalarType acc_type(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

namespace {
// A new contiguous output on `like`'s device.
at::Tensor new_on(const at::Tensor& like, at::IntArrayRef shape, at::ScalarType dtype) {
  return like.is_cuda() ? at::empty(shape, like.options().dtype(dtype)) : new_output(shape, dtype);
}
}  // namespace

at::Tensor new_acc(const at::Tensor& input, at::IntArrayRef shape) { return new_on(input, shape, acc_type(input)); }

at::Tensor new_lse(const at::Tensor& logits, at::IntArrayRef rows) { return new_on(logits, rows, at::kDouble); }

at::Tensor new_loss(const at::Tensor& input, at::IntArrayRef rows, std::int64_t r) {
  return r == 0 ? new_acc(input, rows) : new_acc(input, {});
}

at::Tensor new_grad(const at::Tensor& like, bool wanted) {
  return new_on(like, wanted ? like.sizes() : at::IntArrayRef({0}), like.scalar_type());
}

at::Tensor acc_grad_output(const at::Tensor& grad_output, const at::Tensor& input) {
  const auto acc = acc_type(input);
  return grad_output.scalar_type() == acc ? grad_output : grad_output.to(acc);
}

TensorView output_view(const at::Tensor& t, const char* arg) {
  TensorView v = view(t, arg);
  if (t.numel() == 0) {
    std::int64_t stride = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.strides[d] = stride;
      stride *= v.shape[d];
    }
  }
  return v;
}

void rethrow(const Error& e) {
  const std::string msg = e.what();
  switch (e.code()) {
    case ErrorCode::index_error: TORCH_CHECK_INDEX(false, msg);
    case ErrorCode::invalid_value:
    case ErrorCode::shape_mismatch: TORCH_CHECK_VALUE(false, msg);
    case ErrorCode::not_implemented: TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case ErrorCode::dtype_mismatch:
    case ErrorCode::bad_pointer:
    case ErrorCode::device_error: break;
  }
  TORCH_CHECK(false, msg);
}

namespace {

// How many distinct threads of torch's pool lossfuse::parallel_for runs `n` unit tasks on (grain 1): the test
// that kernels really spread over torch.set_num_threads threads.
std::int64_t parallel_threads(std::int64_t n) {
  std::mutex mu;
  std::set<int> seen;
  parallel_for(0, n, 1, [&](std::int64_t, std::int64_t) {
    const int id = at::get_thread_num();
    const std::lock_guard<std::mutex> lock(mu);
    seen.insert(id);
  });
  return static_cast<std::int64_t>(seen.size());
}

// The op catalog as CSV (lossfuse.catalog()).
std::string catalog_csv() { return lossfuse::catalog_text(lossfuse::CatalogFormat::csv); }

// Whether this build serves CUDA tensors (lossfuse's CUDA kernels and the binding's CUDA route).
bool cuda_route() { return has_cuda(); }

// Sets the calling thread's CudaCheck (0 report, 1 nan); returns the previous one (lossfuse.cuda_check).
std::int64_t set_check(std::int64_t check) {
  TORCH_CHECK(check == 0 || check == 1, "lossfuse: _cuda_check: check: expected 0 (report) or 1 (nan), got ", check);
  const CudaCheck prev = cuda_check();
  set_cuda_check(check == 1 ? CudaCheck::nan : CudaCheck::report);
  return prev == CudaCheck::nan ? 1 : 0;
}

// lossfuse::cuda_host_syncs (lossfuse.cuda_host_syncs).
std::int64_t host_syncs() { return static_cast<std::int64_t>(cuda_host_syncs()); }

}  // namespace

}  // namespace lossfuse::torch_binding

TORCH_LIBRARY(lossfuse, m) {
  m.def("_parallel_threads(int n) -> int");
  m.def("_empty_cache() -> ()");
  m.def("_catalog() -> str");
  m.def("_has_cuda() -> bool");
  m.def("_cuda_check(int check) -> int");
  m.def("_cuda_host_syncs() -> int");
}

TORCH_LIBRARY_IMPL(lossfuse, CompositeExplicitAutograd, m) {
  m.impl("_parallel_threads", &lossfuse::torch_binding::parallel_threads);
  m.impl("_empty_cache", &lossfuse::torch_binding::empty_output_cache);
  m.impl("_catalog", &lossfuse::torch_binding::catalog_csv);
  m.impl("_has_cuda", &lossfuse::torch_binding::cuda_route);
  m.impl("_cuda_check", &lossfuse::torch_binding::set_check);
  m.impl("_cuda_host_syncs", &lossfuse::torch_binding::host_syncs);
}
