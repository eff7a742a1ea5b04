// A CPU implementation of the kernels-community/deformable-detr ops with the Hub's schemas
// (hf-kernels-hub.md section 4.2), for the hub provider tests. Written as direct loops after the
// upstream CUDA kernel (ms_deform_im2col_cuda.cuh: bilinear, zeros outside, pixel = loc * size
// - 0.5) so that the parity test compares two independent implementations.
//
// Compiled once; every test artifact (hub_test_entry.cpp) links it and registers the ops in its
// own namespace with its own failure mode.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <stdexcept>
#include <string>

namespace {

int g_mode = 0;      // 0 ok, 1 no ms_deform_attn ops, 2 wrong forward schema
int g_throw_at = 0;  // > 0: calls >= this one throw
std::atomic<int> g_calls{0};

struct Corner {
  int64_t index;         // y * W + x, or -1 when outside
  float weight, dx, dy;  // bilinear weight and its derivatives along pixel x and y
};

// The four bilinear corners of pixel coordinate (x, y) on an H x W map.
void corners(float x, float y, int64_t H, int64_t W, Corner out[4]) {
  for (int i = 0; i < 4; ++i) out[i] = {-1, 0.f, 0.f, 0.f};
  if (!(y > -1.f && x > -1.f && y < static_cast<float>(H) && x < static_cast<float>(W))) return;
  const int64_t y0 = static_cast<int64_t>(std::floor(y)), x0 = static_cast<int64_t>(std::floor(x));
  const float ly = y - static_cast<float>(y0), lx = x - static_cast<float>(x0);
  const float hy = 1.f - ly, hx = 1.f - lx;
  const int64_t ys[4] = {y0, y0, y0 + 1, y0 + 1}, xs[4] = {x0, x0 + 1, x0, x0 + 1};
  const float w[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
  const float dx[4] = {-hy, hy, -ly, ly}, dy[4] = {-hx, -lx, hx, lx};
  for (int i = 0; i < 4; ++i) {
    if (ys[i] >= 0 && ys[i] < H && xs[i] >= 0 && xs[i] < W)
      out[i] = {ys[i] * W + xs[i], w[i], dx[i], dy[i]};
  }
}

void check(const at::Tensor& value, const at::Tensor& shapes, const at::Tensor& start,
           const at::Tensor& loc, const at::Tensor& attn, int64_t im2col_step) {
  TORCH_CHECK(value.is_cpu() && value.scalar_type() == at::kFloat && value.is_contiguous(),
              "hub test op: value must be contiguous CPU float32");
  TORCH_CHECK(loc.scalar_type() == at::kFloat && attn.scalar_type() == at::kFloat &&
                  loc.is_contiguous() && attn.is_contiguous(),
              "hub test op: sampling_loc/attn_weight must be contiguous float32");
  TORCH_CHECK(shapes.scalar_type() == at::kLong && start.scalar_type() == at::kLong,
              "hub test op: spatial_shapes/level_start_index must be int64");
  const int64_t B = value.size(0);
  const int64_t step = std::min(B, im2col_step);
  TORCH_CHECK(step > 0 && B % step == 0, "hub test op: batch must be divisible by im2col_step");
}

void maybe_throw() {
  const int n = ++g_calls;
  if (g_throw_at > 0 && n >= g_throw_at) {
    throw std::runtime_error("hub test op: injected failure at call " + std::to_string(n));
  }
}

at::Tensor forward(const at::Tensor& value, const at::Tensor& shapes, const at::Tensor& start,
                   const at::Tensor& loc, const at::Tensor& attn, int64_t im2col_step) {
  maybe_throw();
  check(value, shapes, start, loc, attn, im2col_step);
  const int64_t B = value.size(0), S = value.size(1), M = value.size(2), C = value.size(3);
  const int64_t Q = loc.size(1), L = loc.size(3), P = loc.size(4);
  auto out = at::zeros({B, Q, M * C}, value.options());
  const float* v = value.data_ptr<float>();
  const float* lp = loc.data_ptr<float>();
  const float* ap = attn.data_ptr<float>();
  const int64_t* sh = shapes.data_ptr<int64_t>();
  const int64_t* st = start.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  Corner cs[4];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t q = 0; q < Q; ++q)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t p = 0; p < P; ++p) {
            const int64_t i = (((b * Q + q) * M + m) * L + l) * P + p;
            const int64_t H = sh[2 * l], W = sh[2 * l + 1];
            corners(lp[2 * i] * W - 0.5f, lp[2 * i + 1] * H - 0.5f, H, W, cs);
            for (const auto& c : cs) {
              if (c.index < 0) continue;
              const float* src = v + ((b * S + st[l] + c.index) * M + m) * C;
              float* dst = o + (b * Q + q) * M * C + m * C;
              for (int64_t k = 0; k < C; ++k) dst[k] += ap[i] * c.weight * src[k];
            }
          }
  return out;
}

std::vector<at::Tensor> backward(const at::Tensor& value, const at::Tensor& shapes,
                                 const at::Tensor& start, const at::Tensor& loc,
                                 const at::Tensor& attn, const at::Tensor& grad_output,
                                 int64_t im2col_step) {
  maybe_throw();
  check(value, shapes, start, loc, attn, im2col_step);
  const auto g = grad_output.to(at::kFloat).contiguous();
  const int64_t B = value.size(0), S = value.size(1), M = value.size(2), C = value.size(3);
  const int64_t Q = loc.size(1), L = loc.size(3), P = loc.size(4);
  auto gv = at::zeros_like(value), gl = at::zeros_like(loc), ga = at::zeros_like(attn);
  const float* v = value.data_ptr<float>();
  const float* lp = loc.data_ptr<float>();
  const float* ap = attn.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  const int64_t* sh = shapes.data_ptr<int64_t>();
  const int64_t* st = start.data_ptr<int64_t>();
  float* gvp = gv.data_ptr<float>();
  float* glp = gl.data_ptr<float>();
  float* gap = ga.data_ptr<float>();
  Corner cs[4];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t q = 0; q < Q; ++q)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t p = 0; p < P; ++p) {
            const int64_t i = (((b * Q + q) * M + m) * L + l) * P + p;
            const int64_t H = sh[2 * l], W = sh[2 * l + 1];
            corners(lp[2 * i] * W - 0.5f, lp[2 * i + 1] * H - 0.5f, H, W, cs);
            const float* go = gp + (b * Q + q) * M * C + m * C;
            float sample_grad = 0.f, gx = 0.f, gy = 0.f;
            for (const auto& c : cs) {
              if (c.index < 0) continue;
              const int64_t row = ((b * S + st[l] + c.index) * M + m) * C;
              for (int64_t k = 0; k < C; ++k) {
                gvp[row + k] += ap[i] * c.weight * go[k];
                sample_grad += c.weight * v[row + k] * go[k];
                gx += c.dx * v[row + k] * go[k];
                gy += c.dy * v[row + k] * go[k];
              }
            }
            gap[i] = sample_grad;
            glp[2 * i] = ap[i] * gx * static_cast<float>(W);
            glp[2 * i + 1] = ap[i] * gy * static_cast<float>(H);
          }
  return {gv, gl, ga};
}

at::Tensor forward_without_step(const at::Tensor& value, const at::Tensor& shapes,
                                const at::Tensor& start, const at::Tensor& loc,
                                const at::Tensor& attn) {
  return forward(value, shapes, start, loc, attn, 64);
}

at::Tensor other_op(const at::Tensor& x) { return x; }

// Lets a test that runs twice in one process (--gtest_repeat) start from call 1 again.
void reset_calls() { g_calls = 0; }

}  // namespace

/// Registers the ops in namespace `ns` (what TORCH_LIBRARY(ns, m) expands to), `mode` 0: the
/// Hub schemas; 1: only an unrelated op; 2: a forward without im2col_step. `throw_at` > 0: the
/// ops throw from that call on.
void libreyolo_hubtest_register(const char* ns, int mode, int throw_at) {
  g_mode = mode;
  g_throw_at = throw_at;
  // Never destroyed: the library is never unloaded, and the ops must outlive static destruction.
  auto* def = new torch::Library(torch::Library::DEF, ns, std::nullopt, __FILE__, __LINE__);
  auto* impl =
      new torch::Library(torch::Library::IMPL, ns, c10::DispatchKey::CPU, __FILE__, __LINE__);
  if (g_mode == 1) {
    def->def("other_op(Tensor x) -> Tensor");
    impl->impl("other_op", &other_op);
    return;
  }
  if (g_mode == 2) {
    def->def(
        "ms_deform_attn_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
        "Tensor sampling_loc, Tensor attn_weight) -> Tensor");
    impl->impl("ms_deform_attn_forward", &forward_without_step);
    return;
  }
  def->def(
      "ms_deform_attn_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_loc, Tensor attn_weight, int im2col_step) -> Tensor");
  def->def(
      "ms_deform_attn_backward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_loc, Tensor attn_weight, Tensor grad_output, int im2col_step) -> Tensor[]");
  impl->impl("ms_deform_attn_forward", &forward);
  impl->impl("ms_deform_attn_backward", &backward);
  def->def("reset_calls() -> ()", &reset_calls);
}
