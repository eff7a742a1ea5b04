// The `cuda` implementation of image_preprocess: kernels/image/cuda/image_preprocess_cuda.h for
// the settings and tensors image_preprocess_decline_reason accepts; anything else declines to
// the portable ATen path (models/image/preprocess_slot.h), counted per reason.
#include <ATen/cuda/CUDAContext.h>

#include "kernels/image/cuda/image_preprocess_cuda.h"
#include "kernels/image/image_preprocess.h"
#include "kernels/registry.h"

namespace libreyolo::kernels {
namespace {

Outcome<at::Tensor> image_preprocess_cuda(const std::vector<at::Tensor>& images,
                                          const ImagePreprocessSpec& spec, const at::Tensor& out) {
  if (const char* why = image_preprocess_decline_reason(images, spec, out)) return Decline{why};
  cuda::image_preprocess(images, spec, out);
  return out;
}

}  // namespace

void register_image_preprocess_cuda(Registry& registry) {
  registry.register_impl(
      kImagePreprocess, "cuda", &image_preprocess_cuda, [] { return at::cuda::is_available(); },
      cuda_models_only);
}

}  // namespace libreyolo::kernels
