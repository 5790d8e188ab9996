// libFuzzer target: cross-entropy's C++ entry points (forward, backward from lse, fused, fused in place) on inputs
// the bytes choose: float dtype, integer or probability targets (every integer dtype), N in [0, 8], C in [0, 40],
// strides (negative, zero, padded), reductions (an out-of-range one too), ignore_index, label smoothing, logit
// scale, softcap, z-loss (NaN, inf and out-of-range values among them), class weights, logit values (huge, inf,
// NaN among them). Every call must either throw lossfuse::Error leaving every output byte and the logits as they
// were, or succeed and agree with the float64 reference (tests/reference) within its error budget. Anything else
// traps. Built with ASan + UBSan by scripts/fuzz.sh.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "lossfuse/lossfuse.hpp"
#include "reference/reference.hpp"

namespace {

using lossfuse::DType;
using lossfuse::TensorView;

struct Bytes {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t next() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  template <class T, std::size_t K>
  T pick(const T (&table)[K]) { return table[next() % K]; }
};

constexpr double kInf = INFINITY, kNaN = NAN;

void fail(const char* what) {
  std::fprintf(stderr, "cross_entropy_fuzz: %s\n", what);
  __builtin_trap();
}

std::size_t size_of(DType t) { return lossfuse::dtype_size(t); }

void store(DType t, void* p, double v) {
  switch (t) {
    case DType::f32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); return; }
    case DType::f64: std::memcpy(p, &v, 8); return;
    case DType::bf16: { const std::uint16_t b = lfref::double_to_bf16_bits(v); std::memcpy(p, &b, 2); return; }
    case DType::f16: { const std::uint16_t b = lfref::double_to_f16_bits(v); std::memcpy(p, &b, 2); return; }
    default: return;
  }
}
double load(DType t, const void* p) {
  switch (t) {
    case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::f64: { double d; std::memcpy(&d, p, 8); return d; }
    case DType::bf16: { std::uint16_t b; std::memcpy(&b, p, 2); return lfref::bf16_bits_to_double(b); }
    case DType::f16: { std::uint16_t b; std::memcpy(&b, p, 2); return lfref::f16_bits_to_double(b); }
    default: return 0;
  }
}
void store_int(DType t, void* p, std::int64_t v) {
  switch (t) {
    case DType::u8: { const auto x = static_cast<std::uint8_t>(v); std::memcpy(p, &x, 1); return; }
    case DType::i8: { const auto x = static_cast<std::int8_t>(v); std::memcpy(p, &x, 1); return; }
    case DType::i16: { const auto x = static_cast<std::int16_t>(v); std::memcpy(p, &x, 2); return; }
    case DType::i32: { const auto x = static_cast<std::int32_t>(v); std::memcpy(p, &x, 4); return; }
    default: std::memcpy(p, &v, 8); return;
  }
}
std::int64_t load_int(DType t, const void* p) {
  switch (t) {
    case DType::u8: { std::uint8_t x; std::memcpy(&x, p, 1); return x; }
    case DType::i8: { std::int8_t x; std::memcpy(&x, p, 1); return x; }
    case DType::i16: { std::int16_t x; std::memcpy(&x, p, 2); return x; }
    case DType::i32: { std::int32_t x; std::memcpy(&x, p, 4); return x; }
    default: { std::int64_t x; std::memcpy(&x, p, 8); return x; }
  }
}

// A strided (rows, C) view into its own buffer: strides chosen by the bytes, the base placed so that every element
// the view reaches lies inside the buffer (the view's promise), whatever the strides' signs.
struct Strided {
  std::vector<std::uint8_t> buf;
  TensorView view;
  Strided(DType t, std::int64_t rows, std::int64_t C, std::int64_t rs, std::int64_t cs) {
    std::int64_t lo = 0, hi = 0;
    if (rows > 0 && C > 0) {
      lo = std::min<std::int64_t>(0, (rows - 1) * rs) + std::min<std::int64_t>(0, (C - 1) * cs);
      hi = std::max<std::int64_t>(0, (rows - 1) * rs) + std::max<std::int64_t>(0, (C - 1) * cs);
    }
    buf.assign(static_cast<std::size_t>(hi - lo + 1) * size_of(t), 0);
    view = TensorView::contiguous(buf.data() + static_cast<std::size_t>(-lo) * size_of(t), t, {rows, C});
    view.strides = {rs, cs};
  }
  void* at(std::int64_t r, std::int64_t c) const {
    return static_cast<std::uint8_t*>(view.data) + (r * view.strides[0] + c * view.strides[1]) * size_of(view.dtype);
  }
};

bool close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes b{data, size};
  static constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  static constexpr DType kInts[] = {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64};
  const DType dt = b.pick(kDtypes);
  const bool soft = b.next() % 5 == 0;
  const DType tdt = soft ? dt : b.pick(kInts);
  const std::int64_t N = b.next() % 9, C = b.next() % 41;
  const std::int64_t cs = b.pick({1, 1, 1, -1, 2, 0});
  const std::int64_t row = C * std::max<std::int64_t>(1, std::llabs(cs));
  const std::int64_t rs = b.pick({row, row, -row, row + 3, std::int64_t{0}});
  const int mode = b.next() % 4;  // forward, backward from lse, fused, fused in place

  lossfuse::CrossEntropyOptions opt;
  opt.reduction = static_cast<lossfuse::Reduction>(b.next() % 4);  // 3: out of range
  opt.ignore_index = b.pick({std::int64_t{-100}, std::int64_t{0}, C - 1, C, std::int64_t{-1}, std::int64_t{255},
                             std::int64_t{1} << 40});
  if (soft && b.next() % 4 != 0) opt.ignore_index = -100;
  opt.label_smoothing = b.pick({0.0, 0.0, 0.1, 1.0, -0.1, 1.5, kNaN, kInf});
  opt.logit_scale = b.pick({1.0, 1.0, 0.5, -2.0, 0.0, kNaN, kInf});
  opt.softcap = b.pick({0.0, 0.0, 5.0, 0.5, -1.0, kNaN, kInf});
  opt.z_loss_scale = b.pick({0.0, 0.0, 1e-3, -1.0, kInf});
  std::vector<std::uint8_t> weight_buf;
  std::vector<double> weight;
  if (b.next() % 3 == 0) {
    const DType wt = b.next() % 4 == 0 ? DType::f64 : dt;
    weight_buf.assign(static_cast<std::size_t>(std::max<std::int64_t>(C, 1)) * size_of(wt), 0);
    for (std::int64_t c = 0; c < C; ++c) {
      const double w = b.pick({1.0, 0.5, 2.0, 0.0, -1.0, kNaN});
      store(wt, weight_buf.data() + c * size_of(wt), w);
      weight.push_back(load(wt, weight_buf.data() + c * size_of(wt)));
    }
    opt.weight = TensorView::contiguous(weight_buf.data(), wt, {C});
  }

  // logits
  Strided x(dt, N, C, rs, cs);
  static constexpr double kValues[] = {0.0, 1.0, -1.0, 3.5, -7.25, 20.0, -30.0, 1e4, -1e4, 0.1, kInf, -kInf, kNaN};
  for (std::int64_t r = 0; r < N; ++r) {
    for (std::int64_t c = 0; c < C; ++c) store(dt, x.at(r, c), kValues[b.next() % 13]);
  }
  // targets
  std::vector<std::uint8_t> tbuf(static_cast<std::size_t>(std::max<std::int64_t>(N * (soft ? C : 1), 1)) * size_of(tdt));
  TensorView target = soft ? TensorView::contiguous(tbuf.data(), tdt, {N, C}) : TensorView::contiguous(tbuf.data(), tdt, {N});
  std::vector<std::int64_t> classes(N);
  std::vector<double> probs(N * C);
  for (std::int64_t r = 0; r < N; ++r) {
    if (soft) {
      for (std::int64_t c = 0; c < C; ++c) {
        store(tdt, tbuf.data() + (r * C + c) * size_of(tdt), b.pick({0.0, 0.25, 0.5, 1.0, -0.5, kNaN}));
        probs[r * C + c] = load(tdt, tbuf.data() + (r * C + c) * size_of(tdt));
      }
    } else {
      const std::int64_t v = b.next() % 8 == 0 ? opt.ignore_index : static_cast<std::int64_t>(b.next() % (C + 3)) - 1;
      store_int(tdt, tbuf.data() + r * size_of(tdt), v);
      classes[r] = load_int(tdt, tbuf.data() + r * size_of(tdt));
    }
  }

  // outputs, canary-filled: the loss, lse (float64), the gradient
  const bool none = opt.reduction == lossfuse::Reduction::none;
  const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;
  std::vector<std::uint8_t> loss_buf(static_cast<std::size_t>(std::max<std::int64_t>(N, 1)) * 8, 0xA5);
  std::vector<std::uint8_t> lse_buf(static_cast<std::size_t>(std::max<std::int64_t>(N, 1)) * 8, 0xA5);
  std::vector<std::uint8_t> grad_buf(static_cast<std::size_t>(std::max<std::int64_t>(N * C, 1)) * size_of(dt), 0xA5);
  TensorView loss = none ? TensorView::contiguous(loss_buf.data(), acc, {N}) : TensorView::contiguous(loss_buf.data(), acc, {});
  const TensorView lse = TensorView::contiguous(lse_buf.data(), DType::f64, {N});
  const TensorView grad = mode == 3 ? x.view : TensorView::contiguous(grad_buf.data(), dt, {N, C});
  // the lse backward reads: the reference's, stored (a backward-only call has no forward of its own)
  const std::vector<std::uint8_t> x_before = x.buf, loss_before = loss_buf, grad_before = grad_buf;

  lfref::CeInput in;
  in.rows = N;
  in.C = C;
  for (std::int64_t r = 0; r < N; ++r) {
    for (std::int64_t c = 0; c < C; ++c) in.x.push_back(load(dt, x.at(r, c)));
  }
  if (soft) in.soft = probs; else in.target = classes;
  in.weight = weight;
  in.reduction = opt.reduction;
  in.ignore_index = opt.ignore_index;
  in.label_smoothing = opt.label_smoothing;
  in.logit_scale = opt.logit_scale;
  in.softcap = opt.softcap;
  in.z_loss_scale = opt.z_loss_scale;
  in.u = dt == DType::f64 ? 0x1p-53 : 0x1p-24;  // 16-bit logits are computed in float32
  const bool options_valid = opt.reduction != static_cast<lossfuse::Reduction>(3) && std::isfinite(opt.label_smoothing) &&
                             opt.label_smoothing >= 0 && opt.label_smoothing <= 1 && std::isfinite(opt.logit_scale) &&
                             std::isfinite(opt.softcap) && opt.softcap >= 0 && std::isfinite(opt.z_loss_scale) &&
                             opt.z_loss_scale >= 0;
  lfref::CeResult ref;
  if (options_valid) {
    bool targets_valid = true;
    for (std::int64_t r = 0; r < N && !soft; ++r) {
      targets_valid &= classes[r] == opt.ignore_index || (classes[r] >= 0 && classes[r] < C);
    }
    if (targets_valid) ref = lfref::cross_entropy(in);
  }
  std::vector<double> lse_in(static_cast<std::size_t>(N), 0.0);
  for (std::int64_t r = 0; r < N && r < static_cast<std::int64_t>(ref.lse.size()); ++r) lse_in[r] = ref.lse[r];
  const TensorView lse_arg = TensorView::contiguous(lse_in.data(), DType::f64, {N});

  bool ok = true;
  try {
    switch (mode) {
      case 0: lossfuse::cross_entropy_forward(x.view, target, opt, {loss, lse, std::nullopt}); break;
      case 1: lossfuse::cross_entropy_backward(x.view, target, lse_arg, std::nullopt, opt, grad); break;
      case 2: lossfuse::cross_entropy_forward_backward(x.view, target, opt, {loss, lse, std::nullopt}, std::nullopt, grad); break;
      default:
        lossfuse::cross_entropy_forward_backward(x.view, target, opt, {loss, lse, std::nullopt}, std::nullopt, grad,
                                                 lossfuse::GradWrite::in_place);
        break;
    }
  } catch (const lossfuse::Error&) {
    ok = false;
  } catch (...) {
    fail("an exception other than lossfuse::Error");
  }
  if (!ok) {
    if (x.buf != x_before || loss_buf != loss_before || grad_buf != grad_before) fail("an error left output written");
    return 0;
  }
  if (mode != 3 && x.buf != x_before) fail("the logits changed");
  if (!options_valid) fail("accepted invalid options");
  if (ref.lse.size() != static_cast<std::size_t>(N)) fail("accepted a bad target");
  // agreement with the float64 reference (the row losses or the reduced loss; the gradient)
  if (mode == 0 || mode == 2 || mode == 3) {
    if (none) {
      for (std::int64_t r = 0; r < N; ++r) {
        if (!close(load(acc, loss_buf.data() + r * size_of(acc)), ref.row_loss[r], ref.row_loss_tol[r] + 1e-6)) fail("row loss");
      }
    } else if (!close(load(acc, loss_buf.data()), ref.loss, ref.loss_tol + 1e-6)) {
      fail("reduced loss");
    }
  }
  if (mode != 0) {
    for (std::int64_t r = 0; r < N; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        const void* g = mode == 3 ? x.at(r, c) : grad_buf.data() + (r * C + c) * size_of(dt);
        const double half_ulp = dt == DType::f32 ? 0x1p-24 : (dt == DType::f64 ? 0x1p-53 : 0x1p-8);
        if (!close(load(dt, g), ref.grad[r * C + c], ref.grad_tol[r * C + c] + half_ulp * std::fabs(ref.grad[r * C + c]) + 1e-6)) {
          fail("gradient");
        }
      }
    }
  }
  return 0;
}
