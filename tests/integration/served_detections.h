// A detector's answer over gRPC (boxes, scores, labels, num_detections: server/README.md), read
// back image by image for the served-detection tests.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "server/grpc/client.h"
#include "server_test_support.h"

namespace libreyolo::server::testing {

/// One detection: score, class id, box (x1, y1, x2, y2) in the image's original pixels.
struct Detection {
  float score;
  int64_t label;
  std::array<float, 4> box;
};

/// Detections of image `i` of a detector's response (num_detections of them, rows padded to
/// the response's second dimension). Throws std::out_of_range when an output is missing.
inline std::vector<Detection> detections(const rpc::InferResult& r, int i) {
  const auto counts = values<int32_t>(r.output("num_detections").data);
  const int64_t k = r.output("scores").shape.at(1);
  const auto scores = values<float>(r.output("scores").data);
  const auto labels = values<int64_t>(r.output("labels").data);
  const auto boxes = values<float>(r.output("boxes").data);
  std::vector<Detection> out;
  for (int64_t j = 0; j < counts.at(i); ++j) {
    const int64_t row = i * k + j;
    out.push_back({scores[row],
                   labels[row],
                   {boxes[row * 4], boxes[row * 4 + 1], boxes[row * 4 + 2], boxes[row * 4 + 3]}});
  }
  return out;
}

}  // namespace libreyolo::server::testing
