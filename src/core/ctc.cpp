// CTC entries: every check (shapes, dtypes, lengths, labels, overlap) before anything is written, then the
// plain parameters, the backend's kernel, and the reduction of the per-sample losses in sample order. On the CPU,
// lengths and labels are checked here; a device call (CtcDeviceCall) checks them on its device, except the lengths of
// concatenated targets (read here, through host copies of device ones), and this reports what it found: the same
// error as the CPU's for one bad input, but found after the outputs' checks, so that with several faults a device call
// may name an output first.
#include "lossfuse/ctc.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/class_problem.hpp"
#include "core/ctc_params.hpp"
#include "core/targets.hpp"

namespace lossfuse {
namespace {

struct CtcProblem {
  bool batched = true;
  bool concatenated = false;
  std::int64_t T = 0, N = 0, C = 0, S = 0;
  std::int64_t L = 1;
  DType acc = DType::f32;
  // il, tl: the lengths read on the host (il_read, tl_read; else on the device only). start: index of sample b's
  // first label (concatenated).
  std::vector<std::int64_t> il, tl, offset, start;
  bool il_read = true, tl_read = true;
  std::int64_t target_stride = 1;
  Device device = Device::cpu;  // log_probs': every operand and output lives there (the lengths also on the host)
};

std::string str(std::int64_t v) { return std::to_string(v); }

void check_integer(const TensorView& t, std::string_view name) {
  if (!is_integer(t.dtype)) {
    throw Error(ErrorCode::dtype_mismatch, std::string(name), "an integer dtype", std::string(dtype_name(t.dtype)));
  }
}

// A length tensor: (N) when batched, one element (0-d or (1)) when not, on the host or log_probs' device; returns
// its values (none unless `read`).
std::vector<std::int64_t> read_lengths(const TensorView& t, std::string_view name, const CtcProblem& pb, bool read) {
  core::check_view(t, name, t.device == Device::cpu ? Device::cpu : pb.device);
  check_integer(t, name);
  if (pb.batched) {
    if (t.ndim != 1 || t.shape[0] != pb.N) {
      throw Error(ErrorCode::shape_mismatch, std::string(name), "shape (" + str(pb.N) + ") (N of log_probs)",
                  "shape " + t.shape_string());
    }
  } else if (t.ndim > 1 || t.numel() != 1) {
    throw Error(ErrorCode::shape_mismatch, std::string(name), "one element (shape () or (1)) for unbatched log_probs",
                "shape " + t.shape_string());
  }
  if (!read) return {};
  std::vector<std::int64_t> v(static_cast<std::size_t>(pb.N));
  const std::int64_t stride = t.ndim == 1 ? t.strides[0] : 0;
  const core::HostCopy host(t);
  for (std::int64_t b = 0; b < pb.N; ++b) v[b] = core::read_target(host.view().data, t.dtype, b * stride);
  return v;
}

// The element stride between a length tensor's values.
std::int64_t length_stride(const TensorView& t) { return t.ndim == 1 ? t.strides[0] : 0; }

Error bad_input_length(const CtcProblem& pb, std::int64_t b, std::int64_t v) {
  return Error(ErrorCode::invalid_value, "input_lengths", "values in [0, " + str(pb.T) + "] (T of log_probs)",
               str(v) + " at position [" + str(b) + "]");
}

Error bad_target_length(const CtcProblem& pb, std::int64_t b, std::int64_t v) {
  return Error(
      ErrorCode::invalid_value, "target_lengths",
      pb.concatenated ? std::string("values >= 0") : "values in [0, " + str(pb.S) + "] (S of the padded targets)",
      str(v) + " at position [" + str(b) + "]");
}

// Label s of sample b, value v.
Error bad_label(const CtcProblem& pb, const TensorView& targets, std::int64_t blank, std::int64_t b, std::int64_t s,
                std::int64_t v) {
  std::string where = "[";
  if (pb.concatenated) {
    where.append(str(pb.start[b] + s)).append("] (sample ").append(str(b)).append(", label ");
    where.append(str(s)).append(")");
  } else {
    if (targets.ndim == 2) where.append(str(b)).append(", ");
    where.append(str(s)).append("]");
  }
  return Error(ErrorCode::index_error, "targets",
               "labels in [0, " + str(pb.C) + ") other than blank (" + str(blank) + ")",
               str(v) + " at position " + where);
}

CtcProblem check_problem(const TensorView& lp, const TensorView& targets, const TensorView& input_lengths,
                         const TensorView& target_lengths, const CtcOptions& o) {
  CtcProblem pb;
  core::check_reduction(o.reduction);
  pb.device = lp.device;
  core::check_view(lp, "log_probs", pb.device);
  core::check_floating(lp, "log_probs");
  if (lp.ndim != 3 && lp.ndim != 2) {
    throw Error(ErrorCode::shape_mismatch, "log_probs", "(T, N, C) or unbatched (T, C)", "shape " + lp.shape_string());
  }
  pb.batched = lp.ndim == 3;
  pb.T = lp.shape[0];
  pb.N = pb.batched ? lp.shape[1] : 1;
  pb.C = lp.shape[lp.ndim - 1];
  pb.acc = accumulate_dtype(lp.dtype);
  if (o.blank < 0 || o.blank >= pb.C) {
    throw Error(ErrorCode::invalid_value, "blank", "a class in [0, " + str(pb.C) + ") (C of log_probs)", str(o.blank));
  }

  core::check_view(targets, "targets", pb.device);
  check_integer(targets, "targets");
  if (pb.batched) {
    if (targets.ndim == 2) {
      if (targets.shape[0] != pb.N) {
        throw Error(ErrorCode::shape_mismatch, "targets",
                    "padded (N, S) with N = " + str(pb.N) + " (N of log_probs), or concatenated 1-D",
                    "shape " + targets.shape_string());
      }
      pb.S = targets.shape[1];
    } else if (targets.ndim == 1) {
      pb.concatenated = true;
    } else {
      throw Error(ErrorCode::shape_mismatch, "targets", "padded (N, S) or concatenated 1-D",
                  "shape " + targets.shape_string());
    }
  } else {
    // torch unsqueezes only log_probs: the targets of its one sample may also come padded as (1, S)
    if (targets.ndim != 1 && !(targets.ndim == 2 && targets.shape[0] == 1)) {
      throw Error(ErrorCode::shape_mismatch, "targets", "(S) or (1, S) for unbatched log_probs",
                  "shape " + targets.shape_string());
    }
    pb.S = targets.shape[targets.ndim - 1];
  }

  // A device call checks the lengths of padded targets on its device (CtcDeviceCall), reading device ones there;
  // concatenated targets need theirs here (each sample's first label, the padded width).
  const bool host_checks = pb.device == Device::cpu || pb.concatenated;
  if (pb.device != Device::cpu && core::backend_for(lp, "log_probs").capturing()) {  // no host values in a graph
    if (pb.concatenated) {
      throw Error(ErrorCode::invalid_value, "targets", "padded (N, S) targets under stream capture",
                  "concatenated targets (their lengths are read on the host)");
    }
    const std::pair<const TensorView*, const char*> lengths[] = {{&input_lengths, "input_lengths"},
                                                                 {&target_lengths, "target_lengths"}};
    for (const auto& [t, name] : lengths) {
      if (t->device == Device::cpu) {
        throw Error(ErrorCode::invalid_value, name,
                    "a " + std::string(device_name(pb.device)) + " tensor under stream capture",
                    "a host tensor (its values cannot be copied into a graph)");
      }
    }
  }
  pb.il_read = host_checks || input_lengths.device == Device::cpu;
  pb.tl_read = host_checks || target_lengths.device == Device::cpu;
  pb.il = read_lengths(input_lengths, "input_lengths", pb, pb.il_read);
  pb.tl = read_lengths(target_lengths, "target_lengths", pb, pb.tl_read);
  for (std::int64_t b = 0; host_checks && b < pb.N; ++b) {
    if (pb.il[b] < 0 || pb.il[b] > pb.T) throw bad_input_length(pb, b, pb.il[b]);
    if (pb.tl[b] < 0 || (!pb.concatenated && pb.tl[b] > pb.S)) throw bad_target_length(pb, b, pb.tl[b]);
  }

  // Where each sample's labels start, and their stride.
  pb.offset.resize(static_cast<std::size_t>(pb.N));
  pb.start.assign(static_cast<std::size_t>(pb.N), 0);
  if (pb.concatenated) {
    const std::int64_t len = targets.shape[0];
    std::int64_t pos = 0, smax = 0;
    bool overflow = false;
    for (std::int64_t b = 0; b < pb.N; ++b) {
      pb.start[b] = pos;
      pb.offset[b] = pos * targets.strides[0];
      smax = std::max(smax, pb.tl[b]);
      if (pb.tl[b] > len || pos > len) overflow = true;  // keeps the running sum far from int64 overflow
      if (!overflow) pos += pb.tl[b];
    }
    if (overflow || pos != len) {
      throw Error(ErrorCode::shape_mismatch, "target_lengths",
                  "values summing to " + str(len) + " (the length of the concatenated targets)",
                  overflow ? std::string("a larger sum") : "a sum of " + str(pos));
    }
    pb.S = smax;
    pb.target_stride = targets.strides[0];
  } else {
    const int sd = targets.ndim - 1;  // label dim
    for (std::int64_t b = 0; b < pb.N; ++b) pb.offset[b] = pb.batched ? b * targets.strides[0] : 0;
    pb.target_stride = targets.strides[sd];
  }
  // The alpha table (T x N x L) and the per-sample scratch follow the padded width S (torch's log_alpha has it too):
  // their byte counts must be representable before anything is sized by them (a stride-0 target view can claim
  // any S). Bounded in double: only sizes far beyond any memory are refused.
  {
    const auto d = [](std::int64_t v) { return static_cast<double>(v); };
    const double L = 2 * d(pb.S) + 1;
    const double scratch = d(pb.N) * (d(core::kCtcLRows) * (L + 132) + d(core::kCtcCRows) * (d(pb.C) + 132));
    if (8 * std::max({d(pb.T) * d(pb.N) * L, scratch, L}) >= 0x1p63) {  // L alone too: N or T may be 0
      throw Error(ErrorCode::invalid_value, "targets",
                  "a padded width S whose workspace, T x N x (2 S + 1) values, has a byte count within int64",
                  "S = " + str(pb.S) + " with T = " + str(pb.T) + ", N = " + str(pb.N));
    }
  }
  pb.L = 2 * pb.S + 1;

  // Every used label in [0, C) and not blank: the first bad one is reported, in sample order (a device call: on its
  // device).
  if (pb.device != Device::cpu) return pb;
  for (std::int64_t b = 0; b < pb.N; ++b) {
    for (std::int64_t s = 0; s < pb.tl[b]; ++s) {
      const std::int64_t v = core::read_target(targets.data, targets.dtype, pb.offset[b] + s * pb.target_stride);
      if (v < 0 || v >= pb.C || v == o.blank) throw bad_label(pb, targets, o.blank, b, s, v);
    }
  }
  return pb;
}

// The shape of the forward loss (reduction none) / per-sample outputs: (N), or () unbatched.
void check_sample_output(const TensorView& t, std::string_view name, const CtcProblem& pb) {
  core::check_view(t, name, pb.device);
  core::check_dtype(t, name, pb.acc);
  const std::int64_t n[1] = {pb.N};
  core::check_shape(t, name, n, pb.batched ? 1 : 0);
  core::check_contiguous(t, name);
}

void check_alpha(const TensorView& t, const CtcProblem& pb) {
  core::check_view(t, "log_alpha", pb.device);
  core::check_dtype(t, "log_alpha", pb.acc);
  const std::int64_t batched[3] = {pb.T, pb.N, pb.L}, single[2] = {pb.T, pb.L};
  core::check_shape(t, "log_alpha", pb.batched ? batched : single, pb.batched ? 3 : 2);
  core::check_contiguous(t, "log_alpha");
}

// Element `offset` of an integer view, read on the host (one element copied for a device view).
std::int64_t read_integer_at(const TensorView& t, std::int64_t offset) {
  TensorView one = t;
  one.data = static_cast<unsigned char*>(t.data) + offset * static_cast<std::int64_t>(dtype_size(t.dtype));
  one.ndim = 0;
  const core::HostCopy host(one);
  return core::read_target(host.view().data, t.dtype, 0);
}

// The error of the bad input a device call found (CtcDeviceCall::bad), its value read back.
Error device_call_error(std::int64_t key, const CtcProblem& pb, const TensorView& targets,
                        const TensorView& input_lengths, const TensorView& target_lengths, std::int64_t blank) {
  if (key < 2 * pb.N) {
    const std::int64_t b = key / 2;
    const bool tl = key % 2 == 1;
    const TensorView& t = tl ? target_lengths : input_lengths;
    const bool read = tl ? pb.tl_read : pb.il_read;
    const std::int64_t v = read ? (tl ? pb.tl : pb.il)[b] : read_integer_at(t, b * length_stride(t));
    return tl ? bad_target_length(pb, b, v) : bad_input_length(pb, b, v);
  }
  const std::int64_t flat = key - 2 * pb.N;
  std::int64_t b = 0;
  if (pb.concatenated) {
    b = std::upper_bound(pb.start.begin(), pb.start.end(), flat) - pb.start.begin() - 1;
  } else {
    b = flat / std::max<std::int64_t>(pb.S, 1);
  }
  const std::int64_t s = pb.concatenated ? flat - pb.start[b] : flat - b * pb.S;
  return bad_label(pb, targets, blank, b, s, read_integer_at(targets, pb.offset[b] + s * pb.target_stride));
}

// Per-sample values into a contiguous Acc output, on the device it lives on.
template <class Acc>
void store_acc(const core::Backend& be, const TensorView& t, const std::vector<double>& values) {
  const std::vector<Acc> v(values.begin(), values.end());
  if (!v.empty()) be.from_host(t.data, v.data(), v.size() * sizeof(Acc));
}

template <class Acc>
void run(const TensorView& lp, const TensorView& targets, const TensorView& input_lengths,
         const TensorView& target_lengths, const CtcOptions& o, const CtcOutputs* out,
         const std::optional<TensorView>& grad_loss, const TensorView* grad, const std::optional<TensorView>& alpha_in,
         const CtcProblem& pb) {
  std::vector<core::NamedView> written, read = {{"log_probs", &lp},
                                                {"targets", &targets},
                                                {"input_lengths", &input_lengths},
                                                {"target_lengths", &target_lengths}};
  if (out != nullptr) {
    core::check_view(out->loss, "loss", pb.device);
    core::check_dtype(out->loss, "loss", pb.acc);
    const std::int64_t n[1] = {pb.N};
    core::check_reduced_shape(out->loss, "loss", o.reduction, n, pb.batched ? 1 : 0);
    core::check_contiguous(out->loss, "loss");
    written.push_back({"loss", &out->loss});
    if (out->neg_log_likelihood) {
      check_sample_output(*out->neg_log_likelihood, "neg_log_likelihood", pb);
      written.push_back({"neg_log_likelihood", &*out->neg_log_likelihood});
    }
    if (out->log_alpha) {
      check_alpha(*out->log_alpha, pb);
      written.push_back({"log_alpha", &*out->log_alpha});
    }
  }
  if (grad != nullptr) {
    core::check_view(*grad, "grad_log_probs", pb.device);
    core::check_dtype(*grad, "grad_log_probs", lp.dtype);
    core::check_shape(*grad, "grad_log_probs", lp.shape.data(), lp.ndim);
    written.push_back({"grad_log_probs", grad});
    if (grad_loss) {
      core::check_view(*grad_loss, "grad_loss", pb.device);
      core::check_dtype(*grad_loss, "grad_loss", pb.acc);
      const std::int64_t n[1] = {pb.N};
      core::check_reduced_shape(*grad_loss, "grad_loss", o.reduction, n, pb.batched ? 1 : 0);
      read.push_back({"grad_loss", &*grad_loss});
    }
    if (alpha_in) {
      check_alpha(*alpha_in, pb);
      read.push_back({"log_alpha", &*alpha_in});
    }
  }
  core::check_disjoint(written, read);

  // Checked: from here on nothing throws but allocation.
  core::CtcParams p;
  p.dtype = lp.dtype;
  p.T = pb.T, p.N = pb.N, p.C = pb.C, p.L = pb.L;
  p.log_probs = lp.data;
  p.lp_st = lp.strides[0];
  p.lp_sn = pb.batched ? lp.strides[1] : 0;
  p.lp_sc = lp.strides[lp.ndim - 1];
  p.targets = targets.data;
  p.target_dtype = targets.dtype;
  p.target_stride = pb.target_stride;
  p.input_lengths = pb.il_read ? pb.il.data() : nullptr;
  p.target_lengths = pb.tl_read ? pb.tl.data() : nullptr;
  p.blank = o.blank;
  p.zero_infinity = o.zero_infinity;
  if (out != nullptr && out->log_alpha) p.log_alpha = out->log_alpha->data;
  if (grad != nullptr) {
    p.grad = grad->data;
    p.g_st = grad->strides[0];
    p.g_sn = pb.batched ? grad->strides[1] : 0;
    p.g_sc = grad->strides[grad->ndim - 1];
    if (alpha_in) p.log_alpha = alpha_in->data, p.alpha_ready = true;
  }

  const core::Backend& be = core::backend_for(lp, "log_probs");
  if (pb.device != Device::cpu) {  // a device call: every step after the checks on the device (CtcDeviceCall)
    core::CtcDeviceCall call;
    p.device_call = &call;
    const auto lengths = [](const TensorView& t) { return core::CtcLengths{t.data, t.dtype, length_stride(t)}; };
    if (!pb.il_read) call.input_lengths = lengths(input_lengths);
    if (!pb.tl_read) call.target_lengths = lengths(target_lengths);
    call.concatenated = pb.concatenated;
    if (pb.concatenated) call.target_start = pb.start.data();
    if (pb.batched && !pb.concatenated) call.target_batch_stride = targets.strides[0];
    call.reduction = o.reduction;
    if (out != nullptr) {
      call.loss = out->loss.data;
      if (out->neg_log_likelihood) call.nll = out->neg_log_likelihood->data;
    } else if (grad_loss) {
      call.grad_loss = grad_loss->data;
      call.grad_loss_stride = o.reduction == Reduction::none && pb.batched ? grad_loss->strides[0] : 0;
    }
    be.ctc(p);
    if (call.bad >= 0) throw device_call_error(call.bad, pb, targets, input_lengths, target_lengths, o.blank);
    return;
  }

  // The CPU's scratch and alpha workspace.
  p.target_offset = pb.offset.data();
  std::vector<Acc> scratch(static_cast<std::size_t>(pb.N * core::ctc_scratch_elems(pb.L, pb.C)));
  std::vector<std::int64_t> labels(static_cast<std::size_t>(pb.N * pb.L));
  std::vector<double> nll(static_cast<std::size_t>(pb.N));
  std::vector<Acc> alpha_ws;
  p.scratch = scratch.data();
  p.label_scratch = labels.data();
  p.nll = nll.data();

  if (out != nullptr) {
    be.ctc(p);
    // Per-sample values in Acc, as the kernel computed them (double holds them exactly).
    if (out->neg_log_likelihood) store_acc<Acc>(be, *out->neg_log_likelihood, nll);
    // zero_infinity replaces an impossible sample's inf by 0 (torch: where(loss == inf, 0, loss)).
    auto loss_of = [&](std::int64_t b) {
      return o.zero_infinity && nll[b] == std::numeric_limits<double>::infinity() ? 0.0 : nll[b];
    };
    if (o.reduction == Reduction::none) {
      std::vector<double> loss(nll.size());
      for (std::int64_t b = 0; b < pb.N; ++b) loss[b] = loss_of(b);
      store_acc<Acc>(be, out->loss, loss);
    } else {
      // In sample order in double: the same result for any thread count. mean divides each sample by its
      // target length (at least 1) and the sum by N; N = 0 gives 0 / 0 = nan, as torch's mean of nothing.
      double total = 0;
      for (std::int64_t b = 0; b < pb.N; ++b) {
        total += o.reduction == Reduction::mean ? loss_of(b) / static_cast<double>(std::max<std::int64_t>(pb.tl[b], 1))
                                                : loss_of(b);
      }
      if (o.reduction == Reduction::mean) total /= static_cast<double>(pb.N);
      store_acc<Acc>(be, out->loss, {total});
    }
    return;
  }

  // Backward: the upstream gradient of each sample's loss.
  std::vector<double> scale(static_cast<std::size_t>(pb.N), 1.0);
  const std::optional<core::HostCopy> gl = grad_loss ? std::optional<core::HostCopy>(*grad_loss) : std::nullopt;
  for (std::int64_t b = 0; b < pb.N; ++b) {
    double g = 1.0;
    if (gl) {
      const std::int64_t off = o.reduction == Reduction::none && pb.batched ? b * grad_loss->strides[0] : 0;
      g = static_cast<double>(static_cast<const Acc*>(gl->view().data)[off]);
    }
    if (o.reduction == Reduction::mean) {
      g = g / static_cast<double>(pb.N) / static_cast<double>(std::max<std::int64_t>(pb.tl[b], 1));
    }
    scale[b] = g;
  }
  p.grad_scale = scale.data();
  if (!alpha_in) {
    alpha_ws.resize(static_cast<std::size_t>(pb.T * pb.N * pb.L));
    p.log_alpha = alpha_ws.data();
  }
  be.ctc(p);
}

void dispatch(const TensorView& lp, const TensorView& targets, const TensorView& input_lengths,
              const TensorView& target_lengths, const CtcOptions& o, const CtcOutputs* out,
              const std::optional<TensorView>& grad_loss, const TensorView* grad,
              const std::optional<TensorView>& alpha_in) {
  core::backend_for(lp, "log_probs");  // a device this build has no kernels for is refused before any check
  const CtcProblem pb = check_problem(lp, targets, input_lengths, target_lengths, o);
  if (pb.acc == DType::f64) {
    run<double>(lp, targets, input_lengths, target_lengths, o, out, grad_loss, grad, alpha_in, pb);
  } else {
    run<float>(lp, targets, input_lengths, target_lengths, o, out, grad_loss, grad, alpha_in, pb);
  }
}

}  // namespace

void ctc_forward(const TensorView& log_probs, const TensorView& targets, const TensorView& input_lengths,
                 const TensorView& target_lengths, const CtcOptions& options, const CtcOutputs& outputs) {
  dispatch(log_probs, targets, input_lengths, target_lengths, options, &outputs, std::nullopt, nullptr, std::nullopt);
}

void ctc_backward(const TensorView& log_probs, const TensorView& targets, const TensorView& input_lengths,
                  const TensorView& target_lengths, const std::optional<TensorView>& grad_loss,
                  const CtcOptions& options, const TensorView& grad_log_probs,
                  const std::optional<TensorView>& log_alpha) {
  dispatch(log_probs, targets, input_lengths, target_lengths, options, nullptr, grad_loss, &grad_log_probs, log_alpha);
}

}  // namespace lossfuse
