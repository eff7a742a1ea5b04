#include "models/runtime/stream_guard.h"

#include <optional>
#include <stdexcept>

#if LIBREYOLO_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace libreyolo::models {

#if LIBREYOLO_TORCH_CUDA
struct StreamGuard::Impl {
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

StreamGuard::StreamGuard(const at::Device& device) : impl_(std::make_unique<Impl>()) {
  if (device.is_cuda())
    impl_->guard.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()));
}
#else
struct StreamGuard::Impl {};

StreamGuard::StreamGuard(const at::Device& device) : impl_(std::make_unique<Impl>()) {
  if (device.is_cuda()) throw std::runtime_error("StreamGuard: this build's LibTorch has no CUDA");
}
#endif

StreamGuard::~StreamGuard() = default;

}  // namespace libreyolo::models
