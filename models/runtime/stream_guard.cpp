#include "models/runtime/stream_guard.h"

#include <optional>
#include <stdexcept>

#if LIBREYOLO_TORCH_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace libreyolo::models {

#if LIBREYOLO_TORCH_CUDA
struct StreamGuard::Impl {
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

StreamGuard::StreamGuard(const at::Device& device, Priority priority)
    : impl_(std::make_unique<Impl>()) {
  if (device.is_cuda())
    impl_->guard.emplace(c10::cuda::getStreamFromPool(priority == Priority::high, device.index()));
}
#else
struct StreamGuard::Impl {};

StreamGuard::StreamGuard(const at::Device& device, Priority) : impl_(std::make_unique<Impl>()) {
  if (device.is_cuda()) throw std::runtime_error("StreamGuard: this build's LibTorch has no CUDA");
}
#endif

StreamGuard::~StreamGuard() = default;

#if LIBREYOLO_TORCH_CUDA
struct StreamEvent::Impl {
  explicit Impl(bool timed) : event(timed ? cudaEventDefault : cudaEventDisableTiming) {}
  bool cuda = false;
  c10::cuda::CUDAEvent event;
};

StreamEvent::StreamEvent(const at::Device& device, bool timed)
    : impl_(std::make_unique<Impl>(timed)) {
  impl_->cuda = device.is_cuda();
}
void StreamEvent::record() {
  if (impl_->cuda) impl_->event.record();
}
void StreamEvent::synchronize() {
  if (impl_->cuda) impl_->event.synchronize();
}
bool StreamEvent::query() const { return !impl_->cuda || impl_->event.query(); }
double StreamEvent::seconds_since(const StreamEvent& start) const {
  if (!impl_->cuda) return 0.0;
  return static_cast<double>(start.impl_->event.elapsed_time(impl_->event)) / 1000.0;
}
#else
struct StreamEvent::Impl {};

StreamEvent::StreamEvent(const at::Device& device, bool) : impl_(std::make_unique<Impl>()) {
  if (device.is_cuda()) throw std::runtime_error("StreamEvent: this build's LibTorch has no CUDA");
}
void StreamEvent::record() {}
void StreamEvent::synchronize() {}
bool StreamEvent::query() const { return true; }
double StreamEvent::seconds_since(const StreamEvent&) const { return 0.0; }
#endif

bool stream_is_capturing(const at::Device& device) {
#if LIBREYOLO_TORCH_CUDA
  if (!device.is_cuda()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(
      cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &status));
  return status != cudaStreamCaptureStatusNone;
#else
  (void)device;
  return false;
#endif
}

StreamEvent::~StreamEvent() = default;
StreamEvent::StreamEvent(StreamEvent&&) noexcept = default;
StreamEvent& StreamEvent::operator=(StreamEvent&&) noexcept = default;

}  // namespace libreyolo::models
