// serving.yaml `quantization` (torch-free: server/config reads it). What fp8 does:
// models/quantization/fp8.h.
#pragma once

namespace libreyolo::models::quantization {

/// none: the model computes in its dtype; fp8: its transformer blocks' Linear layers run FP8
/// GEMMs where the device can (models/quantization/fp8.h).
enum class Quantization { none, fp8 };

/// "none" | "fp8".
inline const char* quantization_name(Quantization q) {
  return q == Quantization::fp8 ? "fp8" : "none";
}

}  // namespace libreyolo::models::quantization
