// The DecodeBatcher's rounds (server/instance/decode_batcher.h), driven with a fake round that
// records what each round took and can be held open: concurrent callers' images are combined,
// in order, each caller gets its own results, and a failure reaches every image of its round.
// The GPU round itself (nvJPEG + the image_preprocess kernel) is tested by the
// ServerGpuImageDecode cases on a GPU.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "server/instance/decode_batcher.h"
#include "server/metrics/metrics.h"

namespace libreyolo::server {
namespace {

using namespace std::chrono_literals;

/// Encoded "images" whose one byte is their id.
struct Bytes {
  explicit Bytes(std::vector<std::uint8_t> ids) : data(std::move(ids)) {}
  std::vector<kernels::EncodedImage> images() const {
    std::vector<kernels::EncodedImage> out;
    for (const auto& b : data) out.push_back({&b, 1});
    return out;
  }
  std::vector<std::uint8_t> data;
};

/// A round that answers image id k with a (1, 1, 1, 1) tensor of value k (id 0: declined,
/// id 254 first: the round fails, id 255: a bad image), records the ids of each round, and,
/// when `hold`, holds every round until release().
struct FakeRound {
  explicit FakeRound(bool hold = false) : held(hold) {}
  DecodeBatcher::Round fn() {
    return [this](const std::vector<kernels::EncodedImage>& in, const image::DecodeOptions&) {
      std::vector<int> ids;
      for (const auto& e : in) ids.push_back(e.data[0]);
      {
        std::unique_lock<std::mutex> lk(mu);
        rounds.push_back(ids);
        cv.notify_all();
        cv.wait(lk, [this] { return !held; });
      }
      if (ids.front() == 254) throw std::runtime_error("the device failed");
      std::vector<DecodeBatcher::Result> out(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (ids[i] == 255) {
          out[i].error = "Not a JPEG file";
        } else if (ids[i] != 0) {
          image::ProcessorOutput p;
          p.pixel_values = at::full({1, 1, 1, 1}, static_cast<float>(ids[i]));
          out[i].out = std::move(p);
        }
      }
      return out;
    };
  }
  void release() {
    std::lock_guard<std::mutex> lk(mu);
    held = false;
    cv.notify_all();
  }
  /// Waits until `n` rounds have started (at most 10 s).
  bool started(std::size_t n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, 10s, [&] { return rounds.size() >= n; });
  }
  std::mutex mu;
  std::condition_variable cv;
  bool held;
  std::vector<std::vector<int>> rounds;
};

float value(const DecodeBatcher::Result& r) {
  if (!r.out) {
    ADD_FAILURE() << "no pixels";
    return -1;
  }
  return r.out->pixel_values.item<float>();
}

/// The results of a run() in `f`: at most 10 s, then the round is released, then 10 s more, then
/// the test aborts (a deadlocked batcher fails at once instead of at ctest's timeout).
std::vector<DecodeBatcher::Result> got(std::future<std::vector<DecodeBatcher::Result>>& f,
                                       FakeRound& fake) {
  if (f.wait_for(10s) != std::future_status::ready) {
    ADD_FAILURE() << "run() did not return within 10 s";
    fake.release();
    if (f.wait_for(10s) != std::future_status::ready) {
      std::fprintf(stderr, "DecodeBatcher test: run() hangs\n");
      std::abort();
    }
  }
  return f.get();
}

/// Waits (at most 10 s) until `n` images wait for a round: the order of arrival, made sure.
bool queued(const DecodeBatcher& batcher, std::size_t n) {
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (batcher.queued() != n) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(DecodeBatcher, ALoneCallerLeadsItsOwnRoundAtOnce) {
  FakeRound fake;
  DecodeBatcher batcher(fake.fn(), 64);
  std::vector<std::size_t> round_images;
  batcher.set_observer(
      [&round_images](const DecodeBatcher::RoundStats& s) { round_images.push_back(s.images); });
  const Bytes b({3, 0, 255});
  const auto r = batcher.run(b.images(), {});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(value(r[0]), 3.0f);
  EXPECT_FALSE(r[1].out.has_value());  // declined: the caller's own path
  EXPECT_TRUE(r[1].error.empty());
  EXPECT_EQ(r[1].failure, nullptr);
  EXPECT_EQ(r[2].error, "Not a JPEG file");
  EXPECT_EQ(fake.rounds, (std::vector<std::vector<int>>{{3, 0, 255}}));
  EXPECT_EQ(round_images, std::vector<std::size_t>{3});
}

TEST(DecodeBatcher, CallersArrivingDuringARoundShareTheNextInArrivalOrder) {
  FakeRound fake(/*hold=*/true);
  DecodeBatcher batcher(fake.fn(), 64);
  const Bytes first({1}), a({2, 3}), b({4}), c({5});
  auto lead = std::async(std::launch::async, [&] { return batcher.run(first.images(), {}); });
  EXPECT_TRUE(fake.started(1));
  // Three callers queue behind the held round, one after another.
  auto fa = std::async(std::launch::async, [&] { return batcher.run(a.images(), {}); });
  EXPECT_TRUE(queued(batcher, 2));
  auto fb = std::async(std::launch::async, [&] { return batcher.run(b.images(), {}); });
  EXPECT_TRUE(queued(batcher, 3));
  auto fc = std::async(std::launch::async, [&] { return batcher.run(c.images(), {}); });
  EXPECT_TRUE(queued(batcher, 4));
  fake.release();
  const auto r0 = got(lead, fake), ra = got(fa, fake), rb = got(fb, fake), rc = got(fc, fake);
  EXPECT_EQ(value(r0[0]), 1.0f);
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(value(ra[0]), 2.0f);
  EXPECT_EQ(value(ra[1]), 3.0f);
  EXPECT_EQ(value(rb[0]), 4.0f);
  EXPECT_EQ(value(rc[0]), 5.0f);
  EXPECT_EQ(fake.rounds, (std::vector<std::vector<int>>{{1}, {2, 3, 4, 5}}));
}

TEST(DecodeBatcher, ARoundTakesAtMostMaxImagesOldestFirst) {
  FakeRound fake(/*hold=*/true);
  DecodeBatcher batcher(fake.fn(), 3);
  const Bytes first({1}), a({2, 3}), b({4, 5});
  auto lead = std::async(std::launch::async, [&] { return batcher.run(first.images(), {}); });
  EXPECT_TRUE(fake.started(1));
  auto fa = std::async(std::launch::async, [&] { return batcher.run(a.images(), {}); });
  EXPECT_TRUE(queued(batcher, 2));
  auto fb = std::async(std::launch::async, [&] { return batcher.run(b.images(), {}); });
  EXPECT_TRUE(queued(batcher, 4));
  fake.release();
  got(lead, fake);
  const auto ra = got(fa, fake), rb = got(fb, fake);
  EXPECT_EQ(value(rb[1]), 5.0f);
  EXPECT_EQ(fake.rounds, (std::vector<std::vector<int>>{{1}, {2, 3, 4}, {5}}));
}

TEST(DecodeBatcher, AFailedRoundDeclinesEveryImageOfItAndNoOther) {
  FakeRound fake(/*hold=*/true);
  DecodeBatcher batcher(fake.fn(), 2);
  const Bytes first({7}), bad({254}), other({6}), later({8});
  auto lead = std::async(std::launch::async, [&] { return batcher.run(first.images(), {}); });
  EXPECT_TRUE(fake.started(1));
  auto fbad = std::async(std::launch::async, [&] { return batcher.run(bad.images(), {}); });
  EXPECT_TRUE(queued(batcher, 1));
  auto fother = std::async(std::launch::async, [&] { return batcher.run(other.images(), {}); });
  EXPECT_TRUE(queued(batcher, 2));
  auto flater = std::async(std::launch::async, [&] { return batcher.run(later.images(), {}); });
  EXPECT_TRUE(queued(batcher, 3));
  fake.release();
  EXPECT_EQ(value(got(lead, fake)[0]), 7.0f);
  const auto rbad = got(fbad, fake), rother = got(fother, fake), rlater = got(flater, fake);
  EXPECT_EQ(fake.rounds, (std::vector<std::vector<int>>{{7}, {254, 6}, {8}}));
  // The failed round's images come back declined: each request decodes them on its own path.
  for (const auto* r : {&rbad[0], &rother[0]}) {
    EXPECT_FALSE(r->out.has_value());
    EXPECT_TRUE(r->error.empty());
    EXPECT_EQ(r->failure, nullptr);
  }
  EXPECT_EQ(value(rlater[0]), 8.0f);
  EXPECT_EQ(batcher.failed_rounds(), 1u);
}

TEST(DecodeBatcher, TheObserverSeesEachRoundsImagesAndFailure) {
  FakeRound fake;
  DecodeBatcher batcher(fake.fn(), 64);
  std::vector<DecodeBatcher::RoundStats> seen;
  batcher.set_observer([&seen](const DecodeBatcher::RoundStats& r) {
    seen.push_back(r);
    throw std::runtime_error("an observer's exception stays out of the batcher");
  });
  const Bytes three({1, 2, 3}), bad({254, 4});
  EXPECT_EQ(value(batcher.run(three.images(), {})[2]), 3.0f);
  EXPECT_FALSE(batcher.run(bad.images(), {})[1].out.has_value());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].images, 3u);
  EXPECT_FALSE(seen[0].failed);
  EXPECT_GE(seen[0].seconds, 0.0);
  EXPECT_EQ(seen[1].images, 2u);
  EXPECT_TRUE(seen[1].failed);
}

TEST(DecodeBatcher, RoundsReachPrometheus) {
  Metrics metrics;
  metrics.decode_round("m", 32, 0.004, false);
  metrics.decode_round("m", 3, 0.001, true);
  const std::string text = metrics.serialize();
  for (const char* line : {"libreyolo_decode_round_images_count{model=\"m\"} 2\n",
                           "libreyolo_decode_round_images_sum{model=\"m\"} 35\n",
                           "libreyolo_decode_round_images_bucket{model=\"m\",le=\"4\"} 1\n",
                           "libreyolo_decode_round_seconds_count{model=\"m\"} 2\n",
                           "libreyolo_decode_round_failures_total{model=\"m\"} 1\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
}

TEST(DecodeBatcher, ARoundAnsweringTheWrongCountIsAFailedRound) {
  DecodeBatcher batcher(
      [](const std::vector<kernels::EncodedImage>&, const image::DecodeOptions&) {
        return std::vector<DecodeBatcher::Result>(1);
      },
      8);
  const Bytes two({1, 2});
  const auto r = batcher.run(two.images(), {});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_FALSE(r[0].out.has_value());
  EXPECT_FALSE(r[1].out.has_value());
  EXPECT_EQ(batcher.failed_rounds(), 1u);
  EXPECT_EQ(batcher.queued(), 0u);
}

TEST(DecodeBatcher, ImagesOfOtherDecodeOptionsWaitForARoundOfTheirOwn) {
  FakeRound fake(/*hold=*/true);
  DecodeBatcher batcher(fake.fn(), 64);
  image::DecodeOptions small;
  small.max_pixels = 100;
  const Bytes first({1}), a({2}), b({3}), c({4});
  auto lead = std::async(std::launch::async, [&] { return batcher.run(first.images(), {}); });
  EXPECT_TRUE(fake.started(1));
  auto fa = std::async(std::launch::async, [&] { return batcher.run(a.images(), {}); });
  EXPECT_TRUE(queued(batcher, 1));
  auto fb = std::async(std::launch::async, [&] { return batcher.run(b.images(), small); });
  EXPECT_TRUE(queued(batcher, 2));
  auto fc = std::async(std::launch::async, [&] { return batcher.run(c.images(), {}); });
  EXPECT_TRUE(queued(batcher, 3));
  fake.release();
  got(lead, fake);
  EXPECT_EQ(value(got(fa, fake)[0]), 2.0f);
  EXPECT_EQ(value(got(fb, fake)[0]), 3.0f);
  EXPECT_EQ(value(got(fc, fake)[0]), 4.0f);
  EXPECT_EQ(fake.rounds, (std::vector<std::vector<int>>{{1}, {2, 4}, {3}}));
}

TEST(DecodeBatcher, TwoRoundsAtOnceWhenMaxRoundsIsTwo) {
  FakeRound fake(/*hold=*/true);
  DecodeBatcher batcher(fake.fn(), 64, /*max_rounds=*/2);
  const Bytes first({1}), second({2}), third({3}), fourth({4});
  auto f1 = std::async(std::launch::async, [&] { return batcher.run(first.images(), {}); });
  EXPECT_TRUE(fake.started(1));
  // The first round is held: the second caller leads a round of its own at once.
  auto f2 = std::async(std::launch::async, [&] { return batcher.run(second.images(), {}); });
  EXPECT_TRUE(fake.started(2));
  // Two rounds run: the next two callers wait and then share one.
  auto f3 = std::async(std::launch::async, [&] { return batcher.run(third.images(), {}); });
  EXPECT_TRUE(queued(batcher, 1));
  auto f4 = std::async(std::launch::async, [&] { return batcher.run(fourth.images(), {}); });
  EXPECT_TRUE(queued(batcher, 2));
  fake.release();
  EXPECT_EQ(value(got(f1, fake)[0]), 1.0f);
  EXPECT_EQ(value(got(f2, fake)[0]), 2.0f);
  EXPECT_EQ(value(got(f3, fake)[0]), 3.0f);
  EXPECT_EQ(value(got(f4, fake)[0]), 4.0f);
  EXPECT_EQ(fake.rounds, (std::vector<std::vector<int>>{{1}, {2}, {3, 4}}));
}

TEST(DecodeBatcher, BatchesOnlyForProcessorsThePreprocessKernelTakes) {
  const std::string models = std::string(LIBREYOLO_TEST_FIXTURES) + "/models/";
  const auto takes = [&](const std::string& name) {
    return gpu_preprocess_takes(*image::load_image_processor(models + name));
  };
  EXPECT_TRUE(takes("rtdetr_tiny"));   // exact-size bilinear resize
  EXPECT_TRUE(takes("detr_tiny"));     // aspect-preserving resize + pad
  EXPECT_TRUE(takes("rf_detr_tiny"));  // RfDetrImageProcessor: rescale first, its own instance
  EXPECT_FALSE(takes("owlv2_tiny"));   // Owlv2ImageProcessor's own pipeline
  EXPECT_FALSE(takes("deit_tiny"));    // center crop
}

TEST(DecodeBatcher, RejectsAnEmptyRoundAndZeros) {
  EXPECT_THROW(DecodeBatcher(DecodeBatcher::Round(), 4), std::invalid_argument);
  FakeRound fake;
  EXPECT_THROW(DecodeBatcher(fake.fn(), 0), std::invalid_argument);
  EXPECT_THROW(DecodeBatcher(fake.fn(), 4, 0), std::invalid_argument);
}

}  // namespace
}  // namespace libreyolo::server
