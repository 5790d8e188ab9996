// lossfuse CUDA bench: cross-entropy, the eleven elementwise losses (forward, backward, both in one pass), the five margin
// losses and CTC through the public C++ API on device tensors, against
// the device's own read-only and copy probes; the fused linear loss against its three GEMMs alone on cuBLAS (a table
// of its own at the CSV's end: time per call, TFLOP/s of the 6 N H V flops, and the time over the GEMMs'). Prints one
// CSV row per (loss, shape, dtype, mode): the median time per call over timed repetitions (CUDA events around the whole
// call, host-side checks and copies included), the bytes the call must move, GB/s and the percentage of the matching
// probe (forward: read probe; a call writing gradients: copy probe). Usage: lossfuse_cuda_bench [csv path
// [rows,classes,dtype,mode]]: the second argument runs the cross-entropy cases of that key only (for a profiler: ncu -k
// regex:ce_rows). scripts/gpu_check.sh runs it.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "lossfuse/cross_entropy.hpp"
#include "lossfuse/ctc.hpp"
#include "lossfuse/device.hpp"
#include "lossfuse/dtype.hpp"
#include "lossfuse/linear_cross_entropy.hpp"
#include "lossfuse/loss_kind.hpp"
#include "lossfuse/margin.hpp"

#include "bench_common.hpp"
#include "pointwise_rows.hpp"

namespace {

using lossfuse::DType;
using lossfuse::TensorView;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Reads n 16-byte words; one value per block keeps the loads live.
__global__ void read_probe(const uint4* p, std::int64_t n, unsigned* out) {
  unsigned acc = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

__global__ void fill_random(std::uint16_t* p, std::int64_t n, std::uint32_t seed, bool bf16) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = static_cast<float>(h & 0xffffff) / 16777216.0f;  // [0, 1)
    const float v = 4.0f * (u - 0.5f);
    if (bf16) {
      p[i] = static_cast<std::uint16_t>(__float_as_uint(v) >> 16);
    } else {
      reinterpret_cast<float*>(p)[i] = v;
    }
  }
}

template <class F>
double median_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    ok(cudaEventRecord(a), "record");
    f();
    ok(cudaEventRecord(b), "record");
    ok(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  ok(cudaEventDestroy(a), "event");
  ok(cudaEventDestroy(b), "event");
  return t[t.size() / 2];
}

// One result row, to stdout and (when open) the CSV: time per call, bytes moved, GB/s and % of the probe's GB/s.
void emit_row(FILE* csv, std::string_view loss, std::int64_t rows, std::int64_t cols, DType dt, const char* mode,
              double ms, double bytes, double probe_gbs) {
  const double gbs = bytes / ms / 1e6;
  for (FILE* f : {stdout, csv}) {
    if (f == nullptr) continue;
    std::fprintf(f, "%.*s,%lld,%lld,%s,%s,%.1f,%.0f,%.1f,%.1f\n", static_cast<int>(loss.size()), loss.data(),
                 static_cast<long long>(rows), static_cast<long long>(cols), lossfuse::dtype_name(dt).data(), mode,
                 ms * 1e3, bytes, gbs, 100.0 * gbs / probe_gbs);
  }
}

TensorView view2(void* p, DType dt, std::int64_t n, std::int64_t c) {
  return TensorView::contiguous(p, dt, {n, c}, lossfuse::Device::cuda);
}

// The elementwise losses on 16M elements (bench/pointwise_rows.hpp: operands drawn from N(0, 1) and mapped into each
// loss's domain, reduction mean, default options, the input's gradient), float32 and bfloat16: the forward reads the
// k operands (read probe); the backward and the fused entry read them and write the gradient (copy probe).
void bench_pointwise(FILE* csv, double read_gbs, double copy_gbs) {
  constexpr std::int64_t n = std::int64_t{1} << 24;
  std::vector<float> normal(3 * static_cast<std::size_t>(n));
  std::mt19937_64 rng(29);
  std::normal_distribution<float> dist;
  for (float& v : normal) v = dist(rng);
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::size_t esz = lossfuse::dtype_size(dt);
    void* buf[4] = {};  // three operands, the gradient
    for (void*& p : buf) ok(cudaMalloc(&p, n * esz), "malloc");
    void* loss = nullptr;
    ok(cudaMalloc(&loss, 8), "malloc");
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    std::vector<float> vals(static_cast<std::size_t>(n));
    const auto cu = lossfuse::Device::cuda;
    const TensorView lv = TensorView::contiguous(loss, DType::f32, {}, cu);
    const TensorView gv = TensorView::contiguous(buf[3], dt, {n}, cu);
    for (const lossfuse::bench::PwBench& row : lossfuse::bench::kRows) {
      lossfuse::bench::Ops ops;
      for (int j = 0; j < row.operands; ++j) {  // operand j on the device, in the loss's domain
        for (std::int64_t i = 0; i < n; ++i) {
          const float v = normal[static_cast<std::size_t>(j * n + i)];
          vals[i] = row.domain != nullptr ? static_cast<float>(row.domain(j, v)) : v;
          if (dt == DType::bf16) bits[i] = lossfuse::bench::float_to_bf16(vals[i]);
        }
        const void* host = dt == DType::bf16 ? static_cast<const void*>(bits.data()) : vals.data();
        ok(cudaMemcpy(buf[j], host, n * esz, cudaMemcpyHostToDevice), "copy");
        ops.push_back(TensorView::contiguous(buf[j], dt, {n}, cu));
      }
      const double operands = row.operands * static_cast<double>(n * esz), grad = static_cast<double>(n * esz);
      const double fwd = median_ms([&] { row.forward(ops, lv); }, 20);
      const double bwd = median_ms([&] { row.backward(ops, gv); }, 20);
      const double both = median_ms([&] { row.fused(ops, lv, gv); }, 20);
      const std::string_view name = lossfuse::loss_kind_name(row.kind);
      emit_row(csv, name, 1, n, dt, "forward", fwd, operands, read_gbs);
      emit_row(csv, name, 1, n, dt, "backward", bwd, operands + grad, copy_gbs);
      emit_row(csv, name, 1, n, dt, "forward_backward", both, operands + grad, copy_gbs);
    }
    for (void* p : buf) ok(cudaFree(p), "free");
    ok(cudaFree(loss), "free");
  }
}

// The margin losses at (4096, 1024), mean reduction: the forward reads the inputs (and targets), the backward reads
// them and writes every input's gradient.
void bench_margin(FILE* csv, double read_gbs, double copy_gbs) {
  using lossfuse::LossKind;
  constexpr std::int64_t n = 4096, d = 1024;
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::size_t esz = lossfuse::dtype_size(dt);
    const std::int64_t elems = n * d;
    void* buf[6] = {};  // three inputs, then their gradients
    for (void*& p : buf) {
      ok(cudaMalloc(&p, elems * esz), "malloc");
      fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(p), elems, 13, dt == DType::bf16);
    }
    // class targets: one per row (multi_margin), label lists of 8 ending in -1 (multilabel_margin); cosine's +-1
    std::vector<std::int64_t> cls(n), labels(n * d, -1);
    std::vector<float> signs(n);
    std::mt19937_64 rng(3);
    for (std::int64_t r = 0; r < n; ++r) {
      cls[r] = static_cast<std::int64_t>(rng() % d);
      for (int k = 0; k < 8; ++k) labels[r * d + k] = static_cast<std::int64_t>(rng() % d);
      signs[r] = (rng() % 2) ? 1.0f : -1.0f;
    }
    void *tc = nullptr, *tl = nullptr, *ts = nullptr, *soft = nullptr, *loss = nullptr;
    ok(cudaMalloc(&tc, n * 8), "malloc");
    ok(cudaMalloc(&tl, elems * 8), "malloc");
    ok(cudaMalloc(&ts, n * 8), "malloc");
    ok(cudaMalloc(&soft, elems * esz), "malloc");
    ok(cudaMalloc(&loss, 8), "malloc");
    fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(soft), elems, 17, dt == DType::bf16);
    ok(cudaMemcpy(tc, cls.data(), n * 8, cudaMemcpyHostToDevice), "copy");
    ok(cudaMemcpy(tl, labels.data(), elems * 8, cudaMemcpyHostToDevice), "copy");
    std::vector<std::uint16_t> sign_bits(n);
    for (std::int64_t r = 0; r < n; ++r) sign_bits[r] = signs[r] > 0 ? 0x3f80 : 0xbf80;  // bf16 +-1
    ok(dt == DType::bf16 ? cudaMemcpy(ts, sign_bits.data(), n * 2, cudaMemcpyHostToDevice)
                         : cudaMemcpy(ts, signs.data(), n * 4, cudaMemcpyHostToDevice),
       "copy");
    ok(cudaDeviceSynchronize(), "fill");
    auto v = [&](void* p) { return view2(p, dt, n, d); };
    const auto cu = lossfuse::Device::cuda;
    const TensorView lv = TensorView::contiguous(loss, DType::f32, {}, cu);
    const TensorView cls_v = TensorView::contiguous(tc, DType::i64, {n}, cu);
    const TensorView lab_v = TensorView::contiguous(tl, DType::i64, {n, d}, cu);
    const TensorView sign_v = TensorView::contiguous(ts, dt, {n}, cu);
    struct Case {
      LossKind kind;
      int inputs;    // float inputs of (n, d) read (soft margin: its float target too)
      double extra;  // other bytes read (integer targets)
    };
    const Case cases[] = {{LossKind::triplet_margin, 3, 0},
                          {LossKind::cosine_embedding, 2, 0},
                          {LossKind::multi_margin, 1, n * 8.0},
                          {LossKind::multilabel_margin, 1, elems * 8.0},
                          {LossKind::multilabel_soft_margin, 2, 0}};
    for (const Case& c : cases) {
      for (bool backward : {false, true}) {
        const int grads = c.kind == LossKind::multilabel_soft_margin ? 1 : c.inputs;
        const double read = c.inputs * static_cast<double>(elems * esz) + c.extra;
        const double bytes = read + (backward ? grads * static_cast<double>(elems * esz) : 0.0);
        const double probe = backward ? copy_gbs : read_gbs;
        const double ms = median_ms(
            [&] {
              switch (c.kind) {
                case LossKind::triplet_margin:
                  if (!backward) return lossfuse::triplet_margin_forward(v(buf[0]), v(buf[1]), v(buf[2]), {}, lv);
                  return lossfuse::triplet_margin_backward(v(buf[0]), v(buf[1]), v(buf[2]), std::nullopt, {}, v(buf[3]),
                                                           v(buf[4]), v(buf[5]));
                case LossKind::cosine_embedding:
                  if (!backward) return lossfuse::cosine_embedding_forward(v(buf[0]), v(buf[1]), sign_v, {}, lv);
                  return lossfuse::cosine_embedding_backward(v(buf[0]), v(buf[1]), sign_v, std::nullopt, {}, v(buf[3]),
                                                             v(buf[4]));
                case LossKind::multi_margin:
                  if (!backward) return lossfuse::multi_margin_forward(v(buf[0]), cls_v, {}, lv);
                  return lossfuse::multi_margin_backward(v(buf[0]), cls_v, std::nullopt, {}, v(buf[3]));
                case LossKind::multilabel_margin:
                  if (!backward) return lossfuse::multilabel_margin_forward(v(buf[0]), lab_v, {}, lv);
                  return lossfuse::multilabel_margin_backward(v(buf[0]), lab_v, std::nullopt, {}, v(buf[3]));
                default:
                  if (!backward) return lossfuse::multilabel_soft_margin_forward(v(buf[0]), v(soft), {}, lv);
                  return lossfuse::multilabel_soft_margin_backward(v(buf[0]), v(soft), std::nullopt, {}, v(buf[3]),
                                                                   std::nullopt);
              }
            },
            30);
        const char* mode = backward ? "backward" : "forward";
        emit_row(csv, lossfuse::loss_kind_name(c.kind), n, d, dt, mode, ms, bytes, probe);
      }
    }
    for (void* p : buf) ok(cudaFree(p), "free");
    for (void* p : {tc, tl, ts, soft, loss}) ok(cudaFree(p), "free");
  }
}

}  // namespace

// CTC at (T, N, C, S) = (200, 32, 64, 50) and (1000, 64, 5000, 200) float32, padded int64 targets of S labels, every
// input length T, 'sum': the forward, and the forward (keeping log_alpha) then the backward, as a training step runs
// them. Bytes: log_probs read (forward), and its gradient written (forward_backward).
void bench_ctc(FILE* csv, double read_gbs, double copy_gbs) {
  struct Shape {
    std::int64_t T, N, C, S;
  };
  for (const Shape s : {Shape{200, 32, 64, 50}, Shape{1000, 64, 5000, 200}}) {
    const std::int64_t elems = s.T * s.N * s.C, L = 2 * s.S + 1;
    void *lp = nullptr, *grad = nullptr, *alpha = nullptr, *t = nullptr, *il = nullptr, *tl = nullptr, *loss = nullptr;
    ok(cudaMalloc(&lp, elems * 4), "malloc");
    ok(cudaMalloc(&grad, elems * 4), "malloc");
    ok(cudaMalloc(&alpha, s.T * s.N * L * 4), "malloc");
    ok(cudaMalloc(&t, s.N * s.S * 8), "malloc");
    ok(cudaMalloc(&il, s.N * 8), "malloc");
    ok(cudaMalloc(&tl, s.N * 8), "malloc");
    ok(cudaMalloc(&loss, 8), "malloc");
    // log-probabilities of a near-uniform distribution: random values in [-2, 2) shifted by -log C
    std::vector<float> host(static_cast<std::size_t>(elems));
    std::mt19937_64 rng(4);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (float& v : host) v = u(rng) - std::log(static_cast<float>(s.C));
    ok(cudaMemcpy(lp, host.data(), elems * 4, cudaMemcpyHostToDevice), "copy");
    std::vector<std::int64_t> labels(static_cast<std::size_t>(s.N * s.S)), ilv(s.N, s.T), tlv(s.N, s.S);
    for (auto& v : labels) v = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s.C - 1));
    ok(cudaMemcpy(t, labels.data(), labels.size() * 8, cudaMemcpyHostToDevice), "copy");
    ok(cudaMemcpy(il, ilv.data(), s.N * 8, cudaMemcpyHostToDevice), "copy");
    ok(cudaMemcpy(tl, tlv.data(), s.N * 8, cudaMemcpyHostToDevice), "copy");
    const auto dev = lossfuse::Device::cuda;
    const TensorView lpv = TensorView::contiguous(lp, DType::f32, {s.T, s.N, s.C}, dev);
    const TensorView gv = TensorView::contiguous(grad, DType::f32, {s.T, s.N, s.C}, dev);
    const TensorView av = TensorView::contiguous(alpha, DType::f32, {s.T, s.N, L}, dev);
    const TensorView tv = TensorView::contiguous(t, DType::i64, {s.N, s.S}, dev);
    const TensorView ilw = TensorView::contiguous(il, DType::i64, {s.N}, dev);
    const TensorView tlw = TensorView::contiguous(tl, DType::i64, {s.N}, dev);
    lossfuse::CtcOptions o;
    o.reduction = lossfuse::Reduction::sum;
    const lossfuse::CtcOutputs fwd{TensorView::contiguous(loss, DType::f32, {}, dev), std::nullopt, std::nullopt};
    const lossfuse::CtcOutputs kept{fwd.loss, std::nullopt, av};
    const double fwd_ms = median_ms([&] { lossfuse::ctc_forward(lpv, tv, ilw, tlw, o, fwd); }, 10);
    const double step_ms = median_ms(
        [&] {
          lossfuse::ctc_forward(lpv, tv, ilw, tlw, o, kept);
          lossfuse::ctc_backward(lpv, tv, ilw, tlw, std::nullopt, o, gv, av);
        },
        10);
    const std::string tag = "_T" + std::to_string(s.T) + "_S" + std::to_string(s.S);
    const double bytes = static_cast<double>(elems) * 4;
    emit_row(csv, "ctc", s.N, s.C, DType::f32, ("forward" + tag).c_str(), fwd_ms, bytes, read_gbs);
    emit_row(csv, "ctc", s.N, s.C, DType::f32, ("forward_backward" + tag).c_str(), step_ms, 2 * bytes, copy_gbs);
    for (void* p : {lp, grad, alpha, t, il, tl, loss}) ok(cudaFree(p), "free");
  }
}

// The fused linear loss at (N, H, V) bfloat16, forward with dx and dW (bfloat16) for the mean, against the same three
// products run alone on cuBLAS over the whole batch (logits in float32; dx and dW from a bfloat16 gradient): the
// floor a chunked loss approaches.
void bench_linear(FILE* csv) {
  constexpr std::int64_t N = 8192, H = 4096, V = 128256;
  const auto bytes = [](std::int64_t n, int esz) { return static_cast<std::size_t>(n) * esz; };
  void *x = nullptr, *w = nullptr, *gx = nullptr, *gw = nullptr, *t = nullptr, *loss = nullptr;
  ok(cudaMalloc(&x, bytes(N * H, 2)), "malloc");
  ok(cudaMalloc(&w, bytes(V * H, 2)), "malloc");
  ok(cudaMalloc(&gx, bytes(N * H, 2)), "malloc");
  ok(cudaMalloc(&gw, bytes(V * H, 2)), "malloc");
  ok(cudaMalloc(&t, bytes(N, 8)), "malloc");
  ok(cudaMalloc(&loss, 8), "malloc");
  fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(x), N * H, 21, true);
  fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(w), V * H, 23, true);
  std::vector<std::int64_t> targets(N);
  std::mt19937_64 rng(9);
  for (auto& v : targets) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(V));
  ok(cudaMemcpy(t, targets.data(), bytes(N, 8), cudaMemcpyHostToDevice), "copy");
  const TensorView xv = view2(x, DType::bf16, N, H), wv = view2(w, DType::bf16, V, H);
  const TensorView tv = TensorView::contiguous(t, DType::i64, {N}, lossfuse::Device::cuda);
  const lossfuse::CrossEntropyOutputs out{TensorView::contiguous(loss, DType::f32, {}, lossfuse::Device::cuda),
                                          std::nullopt, std::nullopt};
  const lossfuse::LinearCrossEntropyGrads grads{view2(gx, DType::bf16, N, H), view2(gw, DType::bf16, V, H),
                                                std::nullopt};
  const lossfuse::LinearCrossEntropyOptions o;
  const double lce_ms =
      median_ms([&] { lossfuse::linear_cross_entropy_forward(xv, wv, std::nullopt, tv, o, out, grads); }, 5);

  void *logits = nullptr, *g16 = nullptr, *dw32 = nullptr;
  ok(cudaMalloc(&logits, bytes(N * V, 4)), "malloc");
  ok(cudaMalloc(&g16, bytes(N * V, 2)), "malloc");
  ok(cudaMalloc(&dw32, bytes(V * H, 4)), "malloc");
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  const void* a, std::int64_t lda, const void* b, std::int64_t ldb, void* c, cudaDataType ct,
                  std::int64_t ldc) {
    if (cublasGemmEx_64(h, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &zero, c, ct, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed\n");
      std::exit(1);
    }
  };
  // column-major: logits^T (V x N) = W x^T; dx^T (H x N) = W^T G^T; dW^T (H x V) = x^T G
  const double gemm_ms = median_ms(
      [&] {
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, V, N, H, w, H, x, H, logits, CUDA_R_32F, V);
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, H, N, V, w, H, g16, V, gx, CUDA_R_16BF, H);
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, H, V, N, x, H, g16, V, dw32, CUDA_R_32F, H);
      },
      5);
  const double flops = 6.0 * N * H * V;
  const char* header = "kind,rows,classes,hidden,dtype,mode,us_per_call,tflop_per_s,time_over_gemms\n";
  for (FILE* f : {stdout, csv}) {
    if (f == nullptr) continue;
    std::fprintf(f, "%s", header);
    std::fprintf(f, "linear_cross_entropy,%lld,%lld,%lld,bf16,forward_with_grads,%.1f,%.1f,%.3f\n",
                 static_cast<long long>(N), static_cast<long long>(V), static_cast<long long>(H), lce_ms * 1e3,
                 flops / lce_ms / 1e9, lce_ms / gemm_ms);
    std::fprintf(f, "cublas_gemms,%lld,%lld,%lld,bf16,three_gemms,%.1f,%.1f,1.000\n", static_cast<long long>(N),
                 static_cast<long long>(V), static_cast<long long>(H), gemm_ms * 1e3, flops / gemm_ms / 1e9);
  }
  (void)cublasDestroy(h);
  for (void* p : {x, w, gx, gw, t, loss, logits, g16, dw32}) ok(cudaFree(p), "free");
}

int main(int argc, char** argv) {
  FILE* csv = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  if (argc > 1 && csv == nullptr) {
    std::fprintf(stderr, "lossfuse bench --device cuda: cannot write --csv file '%s'\n", argv[1]);
    return 2;
  }
  const std::string only = argc > 2 ? argv[2] : "";
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
    std::fprintf(stderr, "lossfuse bench --device cuda: no usable CUDA device 0: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // probes on 4 GiB (well past L2)
  const std::int64_t probe_bytes = std::int64_t{4} << 30;
  void *pa = nullptr, *pb = nullptr;
  unsigned* sink = nullptr;
  ok(cudaMalloc(&pa, probe_bytes), "malloc");
  ok(cudaMalloc(&pb, probe_bytes), "malloc");
  ok(cudaMalloc(&sink, 1 << 20), "malloc");
  fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(pa), probe_bytes / 2, 7, true);
  const double read_ms = median_ms(
      [&] { read_probe<<<prop.multiProcessorCount * 8, 512>>>(static_cast<const uint4*>(pa), probe_bytes / 16, sink); },
      10);
  const double copy_ms =
      median_ms([&] { ok(cudaMemcpyAsync(pb, pa, probe_bytes, cudaMemcpyDeviceToDevice), "copy"); }, 10);
  const double read_gbs = static_cast<double>(probe_bytes) / read_ms / 1e6;
  const double copy_gbs = 2.0 * static_cast<double>(probe_bytes) / copy_ms / 1e6;
  ok(cudaFree(pa), "free");
  ok(cudaFree(pb), "free");
  std::printf("probe: read %.0f GB/s, copy %.0f GB/s (read + write)\n", read_gbs, copy_gbs);
  const char* header = "kind,rows,classes,dtype,mode,us_per_call,bytes,gb_per_s,pct_of_probe\n";
  std::printf("%s", header);
  if (csv) {
    std::fprintf(csv, "probe,read,,,,,,%.1f,\nprobe,copy,,,,,,%.1f,\n", read_gbs, copy_gbs);
    std::fprintf(csv, "%s", header);
  }

  struct Shape {
    std::int64_t n, c;
    DType dt;
  };
  const Shape shapes[] = {{32, 32000, DType::f32},     {128, 32000, DType::f32},     {32, 50257, DType::f32},
                          {4096, 32000, DType::f32},   {4096, 32000, DType::bf16},   {8192, 32000, DType::bf16},
                          {8192, 128256, DType::bf16}, {16384, 131072, DType::bf16}, {8192, 128256, DType::f32}};
  for (const Shape& s : shapes) {
    const std::string shape_key =
        std::to_string(s.n) + "," + std::to_string(s.c) + "," + std::string(lossfuse::dtype_name(s.dt)) + ",";
    if (!only.empty() && only.rfind(shape_key, 0) != 0) continue;
    const std::int64_t elems = s.n * s.c;
    const std::size_t esz = lossfuse::dtype_size(s.dt);
    void *x = nullptr, *g = nullptr, *t = nullptr, *loss = nullptr, *lse = nullptr;
    ok(cudaMalloc(&x, elems * esz), "malloc");
    ok(cudaMalloc(&g, elems * esz), "malloc");
    ok(cudaMalloc(&t, s.n * 8), "malloc");
    ok(cudaMalloc(&loss, 8), "malloc");
    ok(cudaMalloc(&lse, s.n * 4), "malloc");
    fill_random<<<4096, 256>>>(static_cast<std::uint16_t*>(x), s.dt == DType::bf16 ? elems : elems, 11,
                               s.dt == DType::bf16);
    std::vector<std::int64_t> targets(s.n);
    std::mt19937_64 rng(5);
    for (auto& v : targets) v = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s.c));
    ok(cudaMemcpy(t, targets.data(), s.n * 8, cudaMemcpyHostToDevice), "copy");
    ok(cudaDeviceSynchronize(), "fill");

    const TensorView xv = view2(x, s.dt, s.n, s.c), gv = view2(g, s.dt, s.n, s.c);
    const TensorView tv = TensorView::contiguous(t, DType::i64, {s.n}, lossfuse::Device::cuda);
    lossfuse::CrossEntropyOutputs out;
    out.loss = TensorView::contiguous(loss, DType::f32, {}, lossfuse::Device::cuda);
    out.lse = TensorView::contiguous(lse, DType::f32, {s.n}, lossfuse::Device::cuda);
    const lossfuse::CrossEntropyOptions o;
    const int reps = elems >= (std::int64_t{1} << 28) ? 10 : 30;
    const double logits_bytes = static_cast<double>(elems * esz);
    struct Mode {
      const char* name;
      double bytes;
      double probe;
    };
    // *_unchecked: under CudaCheck::nan, no check record read back (a training step's calls, or capture's)
    const Mode modes[] = {{"forward", logits_bytes, read_gbs},
                          {"forward_unchecked", logits_bytes, read_gbs},
                          {"forward_backward", 2 * logits_bytes, copy_gbs},
                          {"forward_backward_unchecked", 2 * logits_bytes, copy_gbs},
                          {"forward_backward_in_place", 2 * logits_bytes, copy_gbs}};
    for (const Mode& m : modes) {
      std::string mode = m.name;
      if (!only.empty() && only != shape_key + mode) continue;
      const bool unchecked = mode.ends_with("_unchecked");
      if (unchecked) mode.resize(mode.size() - std::string_view("_unchecked").size());
      const lossfuse::CudaCheckScope check(unchecked ? lossfuse::CudaCheck::nan : lossfuse::CudaCheck::report);
      const double ms = median_ms(
          [&] {
            if (mode == "forward") {
              lossfuse::cross_entropy_forward(xv, tv, o, out);
            } else if (mode == "forward_backward") {
              lossfuse::cross_entropy_forward_backward(xv, tv, o, out, std::nullopt, gv);
            } else {
              lossfuse::cross_entropy_forward_backward(xv, tv, o, out, std::nullopt, xv, lossfuse::GradWrite::in_place);
            }
          },
          reps);
      emit_row(csv, "cross_entropy", s.n, s.c, s.dt, m.name, ms, m.bytes, m.probe);
    }
    for (void* p : {x, g, t, loss, lse}) ok(cudaFree(p), "free");
  }
  if (only.empty()) bench_pointwise(csv, read_gbs, copy_gbs);
  if (only.empty()) bench_margin(csv, read_gbs, copy_gbs);
  if (only.empty()) bench_ctc(csv, read_gbs, copy_gbs);
  if (only.empty()) bench_linear(csv);
  if (csv) std::fclose(csv);
  return 0;
}
