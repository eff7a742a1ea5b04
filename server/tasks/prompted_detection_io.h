// Open-vocabulary (text-prompted) detection I/O of ModelInfer (DESIGN.md "Serving"; the
// contract of every models::PromptedDetector family: OWL-ViT, OWLv2, Grounding DINO and
// OmDet-Turbo). server/README.md "Open-vocabulary detection I/O" documents it for clients.
//
// Inputs: the detector's `images` BYTES [N] / `pixel_values` FP32 [N,3,H,W] and optional
// `target_sizes` INT64 [N,2] (detector_io.h), plus `text` BYTES:
// - [1] or [N]: one prompt per image, or one shared by the batch. A prompt is either Grounding
//   DINO's form, labels separated by '.' ("a cat. a remote control." -> "a cat", "a remote
//   control"; each trimmed, empty ones dropped), or a JSON array of label strings
//   ('["a cat", "Dr. Pepper"]', for labels that hold a '.').
// - [1,L] or [N,L]: the labels themselves, one per element ("" elements skipped).
// Parameters: `box_threshold` (alias `threshold`; default: the family's processor's),
// `text_threshold` (only for families that have one: Grounding DINO; INVALID_ARGUMENT
// otherwise), and for OmDet-Turbo only (INVALID_ARGUMENT for the others, as text_threshold)
// `nms_threshold` (a number in [0, 1], default 0.5) and `task` (a string, the task sentence of
// every image of the request, default OmDetTurboProcessor's "Detect <labels joined by ', '>.";
// non-empty, UTF-8, at most kMaxPromptBytes; cut to 77 tokens as the processor does, reported as
// `truncated_task` true on the `labels` output). Each request keeps its own thresholds and task
// when requests batch together (models::PromptedDetector::encode_with_tasks).
// Outputs (K = the largest detection count among the request's images): `boxes` FP32 [N,K,4]
// (x0, y0, x1, y1 pixels of target_sizes or the original image), `scores` FP32 [N,K], `labels`
// BYTES [N,K] (the label text of each box, "" padding), `num_detections` INT32 [N]; on request
// `label_ids` INT64 [N,K] (the label's index in its image's list, -1 padding), `logits`
// FP32 [N,Q,Lmax] and `pred_boxes` FP32 [N,Q,4]. A label cut to the model's token limit (as the
// tokenizer truncates) is reported in the `labels` output's parameters: `truncated_labels`
// (string "image:label" pairs, comma separated, e.g. "0:2,1:0") and `max_text_tokens` (int64).
//
// Refused with INVALID_ARGUMENT naming `text`: a missing text input, a datatype other than
// BYTES, a shape other than the above, an element that is not UTF-8, longer than
// kMaxPromptBytes, or a JSON array that is not one of strings, an image left with no label, more
// labels than the model takes per image (models::PromptedDetector::max_labels).
#pragma once

#include <memory>

#include "models/prompted.h"
#include "server/tasks/task_adapter.h"

namespace libreyolo::server {

/// The longest `text` element accepted, bytes (a label is cut to the model's tokens anyway; this
/// bounds the tokenizer's work on one element).
constexpr std::size_t kMaxPromptBytes = 65536;

/// The labels of one prompt string: a JSON array of strings when it starts with '[' (after
/// spaces), else split at '.' with each part trimmed of spaces and empty parts dropped. Throws
/// api::Error INVALID_ARGUMENT "input 'text': element <i>: <problem>" for a malformed array.
std::vector<std::string> prompt_labels(std::string_view prompt, std::size_t element);

/// The adapter of a model that models::prompted_detector finds (`detector` is that model, which
/// must outlive the adapter).
std::unique_ptr<TaskAdapter> make_prompted_detection_task(const models::Model& model,
                                                          const models::PromptedDetector& detector,
                                                          const ServingConfig& serving);

}  // namespace libreyolo::server
