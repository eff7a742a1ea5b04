// The contract between the models and their users (server, tools, tests): a loaded Hugging Face
// checkpoint folder that turns pixel tensors into raw outputs. Pre- and post-processing live in
// models/image/ and are driven by the model's processor settings.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "models/image/postprocess.h"
#include "models/layers/bound_kernels.h"
#include "models/layouts/options.h"
#include "models/quantization/fp8.h"

namespace torch::nn {
class Module;
}

namespace libreyolo::models {

using LayoutOptions = layouts::LayoutOptions;
using LayoutReport = layouts::LayoutReport;

/// What the model predicts (Hugging Face pipeline task names). panoptic_segmentation:
/// DetrForSegmentation (logits, pred_boxes, pred_masks; DetrImageProcessor.
/// post_process_panoptic_segmentation, models/image/panoptic.h).
enum class Task {
  object_detection,
  image_classification,
  instance_segmentation,
  panoptic_segmentation
};

/// How to load a checkpoint.
struct LoadOptions {
  at::ScalarType dtype = at::kFloat;  ///< float32, float16 or bfloat16 (parameters and compute)
  at::Device device = at::kCPU;       ///< cpu, cuda:N, or cuda (load_model: the current device)
  /// The registry the model binds its slots from; null: kernels::Registry::process_default().
  /// It must outlive the model.
  kernels::Registry* registry = nullptr;
  /// The model's own per-slot lists (serving.yaml `kernels.slots`), replacing the process
  /// policy's for those slots (kernels::Filter::overridden).
  kernels::SlotAllow kernel_slots;
  /// The model's name in kernel reports and fallback events ("" = the folder's name).
  std::string name;
  /// The instance's name when the model has several (the server's instance_group:
  /// "<model>_<i>"): its kernel bindings are reported under it. "" for one instance.
  std::string instance;
  /// Which layouts (models/layouts/) transform the loaded modules; applied once, after the
  /// checkpoint's tensors are loaded.
  LayoutOptions layouts;
  /// serving.yaml `quantization`: fp8 binds the `fp8_gemm` slot and quantises the transformer
  /// blocks' Linear layers after the layouts (models/quantization/fp8.h); none leaves them.
  quantization::Quantization quantization = quantization::Quantization::none;
};

/// What load_model did for LoadOptions::quantization (Model::quantization()).
struct QuantizationReport {
  quantization::Quantization requested = quantization::Quantization::none;
  /// The fp8_gemm implementation the quantised layers call first ("scaled_mm"), or "" when none
  /// can serve the model; then `unavailable` says why (every candidate's reason, "; "-joined).
  std::string implementation;
  std::string unavailable;
  quantization::Fp8Report fp8;
};

/// What a loaded checkpoint is, read from its config.json once by load_model: its users (the
/// server's task adapters, the tools) read nothing else, so config.json is parsed in one place.
struct ModelDescription {
  std::string model_type;  ///< config.json `model_type` ("rt_detr", "vit", ...)
  Task task = Task::object_detection;
  /// C, the logits' class dimension: config.json `id2label` size when it has one, else -1.
  int64_t num_labels = -1;
  /// Detectors: Q, the query count of `logits`/`pred_boxes` (config.json `num_queries`); -1 else.
  int64_t num_queries = -1;
  /// Detectors: the family's post-processor (transformers' post_process_object_detection).
  image::DetectionHead head = image::DetectionHead::rt_detr;
  /// Detectors: config.json `use_focal_loss` (RT-DETR lineage; default true: sigmoid scores).
  bool use_focal_loss = true;
};

/// The one input rule of every family's forward() (models/model.cpp): pixel_values must be
/// (B >= 1, `channels`, H, W) with H, W >= `min_size` and multiples of `multiple`, of a
/// floating dtype the models compute in (float32, float16, bfloat16). Throws
/// std::invalid_argument "<model_type>: pixel_values must be (B, C, H, W) with B >= 1 and
/// H, W >= m[ and multiples of k], got [...]" or "<model_type>: pixel_values must be float32,
/// float16 or bfloat16, got Double". forward() then converts to the model's dtype and device
/// (at::Tensor::to: no copy when they already match, which is what the server sends).
void check_pixel_values(const std::string& model_type, const at::Tensor& pixel_values,
                        int64_t channels, int64_t min_size = 1, int64_t multiple = 1);

/// Raw model outputs. Detectors: `logits` (B, Q, num_labels) and `pred_boxes` (B, Q, 4) as
/// (cx, cy, w, h) normalised to [0, 1], both float32 on the model's device regardless of the
/// compute dtype. Classifiers: `logits` (B, num_labels), `pred_boxes` undefined. Instance
/// segmentation: a detector's two plus `pred_masks` (B, Q, h, w) mask logits (float32; RF-DETR:
/// h, w = the input's H/4, W/4), undefined for the other tasks. Document-layout detectors
/// (PP-DocLayoutV3) also return `pred_masks` (B, Q, H/4, W/4) mask logits and `order_logits`
/// (B, Q, Q), the reading-order logits (image::post_process_document_layout); undefined elsewhere.
struct ModelOutput {
  at::Tensor logits;
  at::Tensor pred_boxes;
  at::Tensor pred_masks;
  at::Tensor order_logits;
};

/// A loaded checkpoint. forward() is const and thread-compatible: concurrent calls are safe
/// (no mutable state), and it runs under at::NoGradGuard / inference mode set by the caller.
class Model {
 public:
  virtual ~Model() = default;

  /// `model_type` from config.json, one that a registered family loads ("rt_detr", "vit", ...:
  /// models/registry/family.h).
  virtual std::string model_type() const = 0;
  virtual Task task() const = 0;

  /// pixel_values (B, 3, H, W) in the model's dtype and on its device, already rescaled and
  /// normalised by the processor. pixel_mask (B, H, W) int64 with 1 on real pixels (Deformable
  /// DETR pads batches of different sizes); undefined means "all valid".
  /// Throws std::invalid_argument when the input shape is not acceptable to the model.
  virtual ModelOutput forward(const at::Tensor& pixel_values,
                              const at::Tensor& pixel_mask = at::Tensor()) const = 0;

  /// config.json `id2label` (class index -> name); empty when the file has none.
  virtual const std::map<int64_t, std::string>& id2label() const = 0;

  /// The options it was loaded with.
  virtual const LoadOptions& options() const = 0;

  /// Number of attention modules whose `fused_attn` flag changed (set_fused_attention).
  virtual int set_fused_attention(bool enabled) = 0;

  /// The family's root module (what load_model binds and the layouts transform).
  virtual torch::nn::Module& root() = 0;

  /// The handles the model's modules were bound to at load (kept here so that the registry's
  /// per-model report lists every slot, called or not).
  const layers::BoundKernels& kernels() const { return kernels_; }
  /// Binds the model's slots (load_model calls it once, after the layouts, before the first
  /// forward).
  void bind_kernels(kernels::Registry& registry, const kernels::BindContext& context,
                    const kernels::Filter& filter) {
    kernels_ = layers::bind_kernels(root(), registry, context, filter);
  }

  /// The layouts load_model applied, in application order (empty: none).
  const std::vector<LayoutReport>& layouts() const { return layout_reports_; }
  /// What LoadOptions::quantization did (requested none: an empty report).
  const QuantizationReport& quantization() const { return quantization_; }
  /// What load_model read of config.json (task, labels, queries, post-processing).
  const ModelDescription& description() const { return description_; }

 private:
  friend std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options);
  layers::BoundKernels kernels_;
  std::vector<LayoutReport> layout_reports_;
  QuantizationReport quantization_;

 protected:
  /// Filled by load_model from config.json; a Model made without load_model (a test's fake)
  /// fills it itself.
  ModelDescription description_;
};

/// Loads a checkpoint folder (config.json + model.safetensors [+ preprocessor_config.json])
/// through the family that registers config.json `model_type` (FamilyRegistry::builtin()). Throws
/// std::runtime_error with a one-line message naming the file and the field or tensor key for
/// anything wrong (unknown model_type, unsupported option, missing/unexpected/mis-shaped tensors,
/// corrupt safetensors). A `cuda` device without an index becomes the current CUDA device (cuda:N):
/// the model's inputs must then be on cuda:N. Then applies options.layouts
/// (models/layouts/layouts.h; a kernel_config entry that cannot be honoured throws
/// std::runtime_error naming the entry) and binds the model to options.registry (its process filter
/// overridden by options.kernel_slots) for its device and dtype; with options.quantization fp8,
/// binds `fp8_gemm` too and quantises the transformer blocks' Linear layers when an
/// implementation can serve the model (Model::quantization() says what happened; a weight
/// holding a non-finite value throws std::runtime_error "<dir>: quantization fp8: fp8: weight
/// row R of [N, K] holds a non-finite value").
std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options = {});

}  // namespace libreyolo::models
