#include "server/instance/decode_batcher.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "log/log.h"
#include "models/image/decode_slot.h"
#include "models/image/preprocess_slot.h"
#include "models/runtime/stream_guard.h"

namespace libreyolo::server {
namespace {

bool same_options(const image::DecodeOptions& a, const image::DecodeOptions& b) {
  return a.max_pixels == b.max_pixels && a.strict_jpeg == b.strict_jpeg &&
         a.apply_orientation == b.apply_orientation;
}

}  // namespace

DecodeBatcher::DecodeBatcher(Round round, std::size_t max_images, std::size_t max_rounds)
    : round_(std::move(round)), max_images_(max_images), max_rounds_(max_rounds) {
  if (!round_) throw std::invalid_argument("DecodeBatcher: no round function");
  if (max_images_ == 0) throw std::invalid_argument("DecodeBatcher: max_images must be >= 1");
  if (max_rounds_ == 0) throw std::invalid_argument("DecodeBatcher: max_rounds must be >= 1");
}

std::vector<DecodeBatcher::Result> DecodeBatcher::run(
    const std::vector<kernels::EncodedImage>& images, const image::DecodeOptions& options) {
  std::vector<Item> items(images.size());
  for (std::size_t i = 0; i < images.size(); ++i) {
    items[i].in = images[i];
    items[i].options = options;
  }
  const auto all_done = [&items] {
    return std::all_of(items.begin(), items.end(), [](const Item& it) { return it.done; });
  };
  std::unique_lock<std::mutex> lk(mu_);
  try {
    for (auto& it : items) queue_.push_back(&it);
    while (!all_done()) {
      if (running_ < max_rounds_ && !queue_.empty()) {
        lead(lk);
      } else {
        cv_.wait(lk);
      }
    }
  } catch (...) {
    // Out of memory queueing or leading: this caller's images leave the queue, and those another
    // leader took are waited for (its round writes into `items`).
    for (auto& it : items) {
      auto q = std::find(queue_.begin(), queue_.end(), &it);
      if (q != queue_.end()) {
        queue_.erase(q);
        it.done = true;
      }
    }
    cv_.wait(lk, all_done);
    throw;
  }
  std::vector<Result> out;
  out.reserve(items.size());
  for (auto& it : items) out.push_back(std::move(it.result));
  return out;
}

void DecodeBatcher::lead(std::unique_lock<std::mutex>& lk) {
  // The oldest images of the oldest one's options, up to max_images; the rest wait their turn.
  // Everything that may throw comes before the queue changes or inside the try below.
  std::vector<Item*> taken;
  taken.reserve(std::min(max_images_, queue_.size()));
  const image::DecodeOptions options = queue_.front()->options;
  for (auto it = queue_.begin(); it != queue_.end() && taken.size() < max_images_;) {
    if (same_options((*it)->options, options)) {
      taken.push_back(*it);
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  running_ += 1;
  lk.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Result> results;
  bool failed = false;
  try {
    std::vector<kernels::EncodedImage> in;
    in.reserve(taken.size());
    for (const Item* it : taken) in.push_back(it->in);
    results = round_(in, options);
    if (results.size() != taken.size())
      throw std::logic_error("DecodeBatcher: the round returned " + std::to_string(results.size()) +
                             " results for " + std::to_string(taken.size()) + " images");
  } catch (const std::exception& e) {
    failed = true;
    const std::size_t n = failed_rounds_.fetch_add(1) + 1;
    if (n == 1 || n % 1000 == 0)
      log::warn("decode batcher: a round of " + std::to_string(taken.size()) + " images failed (" +
                std::to_string(n) + " so far), each image decodes on its own: " + e.what());
  } catch (...) {
    failed = true;
    failed_rounds_.fetch_add(1);
  }
  if (observer_) {
    try {
      observer_({taken.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 failed});
    } catch (...) {
    }
  }
  lk.lock();
  for (std::size_t i = 0; i < taken.size(); ++i) {
    // A failed round declines its images: each request decodes its own on its own path, where a
    // failure is that request's alone.
    taken[i]->result = failed ? Result{} : std::move(results[i]);
    taken[i]->done = true;
  }
  running_ -= 1;
  cv_.notify_all();  // the round's callers, and the next round's leader
}

std::size_t DecodeBatcher::failed_rounds() const { return failed_rounds_.load(); }

std::size_t DecodeBatcher::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.size();
}

bool gpu_preprocess_takes(const image::ImageProcessor& processor) {
  try {
    const auto spec = image::preprocess_spec(processor, {at::zeros({3, 640, 640}, at::kByte)});
    return spec.resample == 2 && spec.antialias && !spec.native_uint8 && !spec.center_crop &&
           !spec.owlv2;
  } catch (const std::exception&) {
    return false;
  }
}

DecodeBatcher::Round gpu_decode_round(kernels::ImageDecodeBatchHandle decode_batch,
                                      kernels::ImagePreprocessHandle preprocess,
                                      const image::ImageProcessor& processor, at::ScalarType dtype,
                                      const at::Device& device) {
  return
      [decode_batch, preprocess, &processor, dtype, device](
          const std::vector<kernels::EncodedImage>& images, const image::DecodeOptions& options) {
        const models::StreamGuard stream(device, models::StreamGuard::Priority::high);
        kernels::ImageDecodeOptions o;
        o.max_pixels = options.max_pixels;
        o.strict_jpeg = options.strict_jpeg;
        o.device_index = device.index();
        std::vector<DecodeBatcher::Result> results(images.size());
        std::size_t begin = 0;
        while (begin < images.size()) {
          std::size_t n = 32;
          while (n > images.size() - begin) n /= 2;
          const std::vector<kernels::EncodedImage> chunk(images.begin() + begin,
                                                         images.begin() + begin + n);
          std::vector<int> orientations;
          for (const auto& im : chunk)
            orientations.push_back(
                options.apply_orientation ? image::image_orientation(im.data, im.size) : 1);
          // Declined by the slot (nullopt), or image by image (neither pixels nor error): the
          // caller's own path decodes them.
          if (auto decoded = decode_batch(chunk, orientations, o)) {
            for (std::size_t k = 0; k < n && k < decoded->size(); ++k) {
              auto& d = (*decoded)[k];
              auto& r = results[begin + k];
              if (!d.error.empty()) {
                r.error = d.error;
              } else if (d.pixels.defined() && d.pixels.is_cuda()) {
                r.height = d.pixels.size(1);
                r.width = d.pixels.size(2);
                try {
                  r.out = image::preprocess(preprocess, processor, {d.pixels}, dtype);
                } catch (...) {
                  r.failure = std::current_exception();
                }
              }
            }
          }
          begin += n;
        }
        // One wait for the round's decodes and kernels: its callers read finished pixels on other
        // streams (the instance copies them into its batch on its own).
        models::StreamEvent done(device);
        done.record();
        done.synchronize();
        return results;
      };
}

}  // namespace libreyolo::server
