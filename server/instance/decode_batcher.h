// Batched GPU decoding across requests: the encoded images that concurrent requests of one model
// hand in are decoded and preprocessed in rounds, each round one batched decode (nvJPEG's
// hardware engines work on batches: docs/BENCHMARKS.md, about 10,000 img/s batched against a
// few thousand one image per call from many threads) and one wait for the device.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/image/image_decode.h"
#include "kernels/image/image_preprocess.h"
#include "models/image/decode.h"
#include "models/image/processor.h"

namespace libreyolo::server {

/// Flat combining (Hendler et al., "Flat combining and the synchronization-parallelism tradeoff",
/// SPAA 2010): a caller that finds fewer than max_rounds rounds running leads one with the
/// images queued by then (oldest first, of the oldest one's decode options, up to max_images;
/// usually its own among them), and the callers whose images it took wait for it; the next
/// round's leader is whichever caller still waits when a round ends. A lone request leads at
/// once: no window, no thread of its own. Thread-safe.
class DecodeBatcher {
 public:
  /// One image's outcome: `out` (decoded and preprocessed), `error` (a bad image: the CPU
  /// decoder's text), `failure` (its preprocessing threw, e.g. a c10::Error on its size; height
  /// and width are the decoded image's), or none of them: declined, the caller decodes it on
  /// its own path. A round that throws declines every image of it (counted in failed_rounds()
  /// and logged), so that one request's failure is its own.
  struct Result {
    std::optional<image::ProcessorOutput> out;
    std::string error;
    std::exception_ptr failure;
    int64_t height = 0, width = 0;
  };
  /// Decodes and preprocesses one round's images with `options`; returns one Result per image,
  /// in order.
  using Round = std::function<std::vector<Result>(const std::vector<kernels::EncodedImage>&,
                                                  const image::DecodeOptions& options)>;

  /// What a round's leader reports after it (images taken, seconds it ran, whether it threw).
  struct RoundStats {
    std::size_t images = 0;
    double seconds = 0;
    bool failed = false;
  };
  using Observer = std::function<void(const RoundStats&)>;

  /// `max_images` >= 1 per round, `max_rounds` >= 1 rounds at once (2: one round's host work
  /// overlaps the other's device work). Throws std::invalid_argument for 0 or an empty `round`.
  DecodeBatcher(Round round, std::size_t max_images, std::size_t max_rounds = 1);

  /// `images` through the rounds (their bytes must stay valid until it returns); one Result
  /// per image, in order. Blocks until every one of them has been through a round. A round
  /// takes only images of one max_pixels / strict_jpeg / apply_orientation. Throws
  /// std::bad_alloc (nothing of this call left queued or running).
  std::vector<Result> run(const std::vector<kernels::EncodedImage>& images,
                          const image::DecodeOptions& options);

  /// Called by each round's leader after the round, outside the lock; its exceptions are
  /// swallowed. Set it before the first run() (not synchronised with running rounds).
  void set_observer(Observer observer) { observer_ = std::move(observer); }

  /// Rounds that threw so far; images waiting for a round (tests). The observer sees every round.
  std::size_t failed_rounds() const;
  std::size_t queued() const;

 private:
  struct Item {
    kernels::EncodedImage in;
    image::DecodeOptions options;
    Result result;
    bool done = false;
  };
  void lead(std::unique_lock<std::mutex>& lk);

  const Round round_;
  Observer observer_;
  const std::size_t max_images_;
  const std::size_t max_rounds_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item*> queue_;
  std::size_t running_ = 0;  ///< rounds being run
  std::atomic<std::size_t> failed_rounds_{0};
};

/// Whether the `image_preprocess` slot's `cuda` kernel takes `processor`'s pipeline (bilinear
/// antialiased resize, no center crop, not OWLv2's: kernels/image/image_preprocess.h). Where it
/// does not, the processor's ATen ops preprocess, and a DecodeBatcher would run them image after
/// image on its leader's thread instead of in parallel on the pool: such a model keeps the
/// per-image pool path. Never throws.
bool gpu_preprocess_takes(const image::ImageProcessor& processor);

/// The round of a model on CUDA: the images in batches of a power of two up to 32 (nvJPEG
/// initialises a decode state per batch size, and the states are kept per size: few sizes, few
/// re-initialisations) through `decode_batch` (what it declines comes back declined), each
/// decoded image through image::preprocess with `preprocess` into `dtype` on its device, then
/// one wait for the device. The work runs on a high-priority stream of `device`: it sits on the
/// requests' path while forwards fill the GPU. `processor` must outlive the returned function.
DecodeBatcher::Round gpu_decode_round(kernels::ImageDecodeBatchHandle decode_batch,
                                      kernels::ImagePreprocessHandle preprocess,
                                      const image::ImageProcessor& processor, at::ScalarType dtype,
                                      const at::Device& device);

}  // namespace libreyolo::server
