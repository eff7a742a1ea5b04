#include "server/metrics/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <tuple>

#include "kernels/out_of_memory.h"
#include "kernels/registry.h"
#include "server/security/access_policy.h"

namespace libreyolo::server {
namespace {

// Latency buckets, seconds: 0.5 ms .. 30 s (roughly x2 steps), covering CPU and GPU serving.
const prometheus::Histogram::BucketBoundaries& latency_buckets() {
  static const prometheus::Histogram::BucketBoundaries b = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return b;
}

const prometheus::Histogram::BucketBoundaries& batch_buckets() {
  static const prometheus::Histogram::BucketBoundaries b = {1, 2, 4, 8, 16, 32, 64, 128};
  return b;
}

prometheus::ClientMetric value_metric(std::vector<prometheus::ClientMetric::Label> labels,
                                      double value, bool counter) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

/// The reason label of the always-zero series of every (slot, impl) pair.
constexpr const char* kNoReason = "none";

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& requests =
      prometheus::BuildCounter()
          .Name("libreyolo_inference_requests_total")
          .Help("ModelInfer requests by model, version and gRPC status code")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& request_seconds =
      prometheus::BuildHistogram()
          .Name("libreyolo_request_duration_seconds")
          .Help("ModelInfer duration inside the server, seconds")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& queue_seconds =
      prometheus::BuildHistogram()
          .Name("libreyolo_queue_duration_seconds")
          .Help("Time a request waited in the batching queue, seconds")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& compute_seconds =
      prometheus::BuildHistogram()
          .Name("libreyolo_compute_duration_seconds")
          .Help("Forward + post-processing time of the batch a request ran in, seconds")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& preprocess_seconds =
      prometheus::BuildHistogram()
          .Name("libreyolo_preprocess_duration_seconds")
          .Help("Decoding + image processing of a request, seconds")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& batch_size = prometheus::BuildHistogram()
                                                              .Name("libreyolo_batch_size")
                                                              .Help("Images per forward pass")
                                                              .Register(*registry);
  prometheus::Family<prometheus::Histogram>& decode_round_images =
      prometheus::BuildHistogram()
          .Name("libreyolo_decode_round_images")
          .Help("JPEGs per batched GPU decode round (concurrent requests' images together)")
          .Register(*registry);
  prometheus::Family<prometheus::Histogram>& decode_round_seconds =
      prometheus::BuildHistogram()
          .Name("libreyolo_decode_round_seconds")
          .Help("Seconds per batched GPU decode round: decode, preprocess, wait for the device")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& decode_round_failures =
      prometheus::BuildCounter()
          .Name("libreyolo_decode_round_failures_total")
          .Help("Batched GPU decode rounds that threw (their images decoded one by one)")
          .Register(*registry);
  prometheus::Family<prometheus::Gauge>& pending =
      prometheus::BuildGauge()
          .Name("libreyolo_pending_requests")
          .Help("Requests waiting in the batching queue")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& instance_batches =
      prometheus::BuildCounter()
          .Name("libreyolo_instance_batches_total")
          .Help("Batches a model instance ran (instance_group)")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& instance_images =
      prometheus::BuildCounter()
          .Name("libreyolo_instance_images_total")
          .Help("Images a model instance inferred (instance_group)")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& instance_compute =
      prometheus::BuildCounter()
          .Name("libreyolo_instance_compute_seconds_total")
          .Help("Seconds a model instance spent on its batches (input, forward)")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& instance_device =
      prometheus::BuildCounter()
          .Name("libreyolo_instance_device_seconds_total")
          .Help(
              "Seconds a model instance's batches spanned on its CUDA stream, from its input to "
              "its outputs copied to the host (CUDA events; launch stalls inside a forward "
              "included; not the GPU's utilisation)")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& prompt_cache_hits =
      prometheus::BuildCounter()
          .Name("libreyolo_prompt_cache_hits_total")
          .Help(
              "Distinct prompt pieces (OWL: labels, Grounding DINO: captions) of a batch "
              "found in an instance's prompt cache")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& prompt_cache_misses =
      prometheus::BuildCounter()
          .Name("libreyolo_prompt_cache_misses_total")
          .Help("Distinct prompt pieces of a batch encoded by the text encoder (not in the cache)")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& instance_requests =
      prometheus::BuildCounter()
          .Name("libreyolo_instance_requests_total")
          .Help("Requests a model instance took from the model's queue (instance_group)")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& instance_queue =
      prometheus::BuildCounter()
          .Name("libreyolo_instance_queue_seconds_total")
          .Help("Seconds the requests a model instance ran waited in the queue")
          .Register(*registry);
  prometheus::Family<prometheus::Gauge>& instance_ready =
      prometheus::BuildGauge()
          .Name("libreyolo_instance_ready")
          .Help("1 while a model instance is in rotation, 0 once its device failed")
          .Register(*registry);
  prometheus::Family<prometheus::Counter>& instance_failures =
      prometheus::BuildCounter()
          .Name("libreyolo_instance_failures_total")
          .Help("Times a model instance was taken out of rotation (CUDA error, out of memory)")
          .Register(*registry);
  prometheus::Family<prometheus::Gauge>& load_seconds =
      prometheus::BuildGauge()
          .Name("libreyolo_model_load_seconds")
          .Help("Time to load (and warm up) a model version, seconds")
          .Register(*registry);
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}
Metrics::~Metrics() = default;

void Metrics::request(const std::string& model, const std::string& version, const std::string& code,
                      double seconds) {
  impl_->requests.Add({{"model", model}, {"version", version}, {"code", code}}).Increment();
  impl_->request_seconds.Add({{"model", model}, {"version", version}}, latency_buckets())
      .Observe(seconds);
}

void Metrics::queue(const std::string& model, const std::string& version, double seconds) {
  impl_->queue_seconds.Add({{"model", model}, {"version", version}}, latency_buckets())
      .Observe(seconds);
}

void Metrics::compute(const std::string& model, const std::string& version, double seconds) {
  impl_->compute_seconds.Add({{"model", model}, {"version", version}}, latency_buckets())
      .Observe(seconds);
}

void Metrics::preprocess(const std::string& model, const std::string& version, double seconds) {
  impl_->preprocess_seconds.Add({{"model", model}, {"version", version}}, latency_buckets())
      .Observe(seconds);
}

void Metrics::batch(const std::string& model, std::int64_t size) {
  impl_->batch_size.Add({{"model", model}}, batch_buckets()).Observe(static_cast<double>(size));
}

void Metrics::decode_round(const std::string& model, std::int64_t images, double seconds,
                           bool failed) {
  impl_->decode_round_images.Add({{"model", model}}, batch_buckets())
      .Observe(static_cast<double>(images));
  impl_->decode_round_seconds.Add({{"model", model}}, latency_buckets()).Observe(seconds);
  if (failed) impl_->decode_round_failures.Add({{"model", model}}).Increment();
}

void Metrics::pending(const std::string& model, std::int64_t count) {
  impl_->pending.Add({{"model", model}}).Set(static_cast<double>(count));
}

void Metrics::instance_batch(const std::string& model, const std::string& instance,
                             const std::string& device, std::int64_t images, double compute_seconds,
                             double device_seconds) {
  const std::map<std::string, std::string> labels{
      {"model", model}, {"instance", instance}, {"device", device}};
  impl_->instance_batches.Add(labels).Increment();
  impl_->instance_images.Add(labels).Increment(static_cast<double>(images));
  impl_->instance_compute.Add(labels).Increment(compute_seconds);
  if (device_seconds >= 0) impl_->instance_device.Add(labels).Increment(device_seconds);
}

void Metrics::prompt_cache(const std::string& model, const std::string& instance,
                           const std::string& device, std::int64_t hits, std::int64_t misses) {
  const std::map<std::string, std::string> labels{
      {"model", model}, {"instance", instance}, {"device", device}};
  impl_->prompt_cache_hits.Add(labels).Increment(static_cast<double>(hits));
  impl_->prompt_cache_misses.Add(labels).Increment(static_cast<double>(misses));
}

void Metrics::instance_queue(const std::string& model, const std::string& instance,
                             const std::string& device, std::int64_t requests,
                             double queue_seconds) {
  const std::map<std::string, std::string> labels{
      {"model", model}, {"instance", instance}, {"device", device}};
  impl_->instance_requests.Add(labels).Increment(static_cast<double>(requests));
  impl_->instance_queue.Add(labels).Increment(queue_seconds);
}

void Metrics::instance_ready(const std::string& model, const std::string& instance,
                             const std::string& device, bool ready) {
  const std::map<std::string, std::string> labels{
      {"model", model}, {"instance", instance}, {"device", device}};
  impl_->instance_ready.Add(labels).Set(ready ? 1.0 : 0.0);
  if (!ready) impl_->instance_failures.Add(labels).Increment();
}

void Metrics::model_load(const std::string& model, const std::string& version, double seconds) {
  impl_->load_seconds.Add({{"model", model}, {"version", version}}).Set(seconds);
}

std::string Metrics::serialize(const std::vector<models::DeviceMemory>& gpus,
                               const security::AccessPolicy* access) const {
  auto families = impl_->registry->Collect();
  // Kernel registry, read at scrape time (its counters are the source of truth).
  auto& reg = kernels::Registry::process_default();
  prometheus::MetricFamily active{"libreyolo_kernel_active",
                                  "1 for the implementation selected for a slot",
                                  prometheus::MetricType::Gauge,
                                  {}};
  prometheus::MetricFamily calls{"libreyolo_kernel_calls_total",
                                 "Calls served by an implementation",
                                 prometheus::MetricType::Counter,
                                 {}};
  prometheus::MetricFamily declined{"libreyolo_kernel_declined_total",
                                    "Inputs an implementation declined, by reason",
                                    prometheus::MetricType::Counter,
                                    {}};
  prometheus::MetricFamily fallback{"libreyolo_kernel_fallback_total",
                                    "Runtime failures that disabled an implementation",
                                    prometheus::MetricType::Counter,
                                    {}};
  prometheus::MetricFamily oom{"libreyolo_kernel_oom_total",
                               "Out-of-memory failures of an implementation (the first in a row "
                               "fails its request RESOURCE_EXHAUSTED, the second disables it)",
                               prometheus::MetricType::Counter,
                               {}};
  for (const auto& slot : reg.report()) {
    for (const auto& c : slot.candidates) {
      active.metric.push_back(value_metric({{"slot", slot.slot}, {"impl", c.name}},
                                           c.name == slot.selected ? 1.0 : 0.0, false));
      calls.metric.push_back(value_metric({{"slot", slot.slot}, {"impl", c.name}},
                                          static_cast<double>(c.calls), true));
      oom.metric.push_back(value_metric(
          {{"slot", slot.slot}, {"impl", c.name}},
          static_cast<double>(kernels::out_of_memory_count(reg, slot.slot, c.name)), true));
      // Prometheus' convention: a counter known at start-up has a series from the first
      // scrape (rate()/increase() miss the first event of a series that appears with it, and
      // alerts on absent series stay silent). reason="none" is that series: always 0.
      declined.metric.push_back(
          value_metric({{"slot", slot.slot}, {"impl", c.name}, {"reason", kNoReason}}, 0.0, true));
      for (const auto& [reason, n] : c.declined) {
        if (reason == kNoReason) continue;
        declined.metric.push_back(
            value_metric({{"slot", slot.slot}, {"impl", c.name}, {"reason", reason}},
                         static_cast<double>(n), true));
      }
    }
  }
  std::map<std::tuple<std::string, std::string, std::string>, double> events;
  for (const auto& slot : reg.report()) {
    for (const auto& c : slot.candidates) events[{slot.slot, c.name, kNoReason}] = 0;
  }
  for (const auto& e : reg.events()) {
    if (e.reason != kNoReason) events[{e.slot, e.impl, e.reason}] += 1;
  }
  for (const auto& [k, n] : events) {
    fallback.metric.push_back(value_metric(
        {{"slot", std::get<0>(k)}, {"impl", std::get<1>(k)}, {"reason", std::get<2>(k)}}, n, true));
  }
  // Per model: what each model's handles call (Registry::bindings), the resolution per model.
  prometheus::MetricFamily model_active{
      "libreyolo_model_kernel_active",
      "1 for the implementation a model's handle tries first, per slot",
      prometheus::MetricType::Gauge,
      {}};
  prometheus::MetricFamily model_calls{"libreyolo_model_kernel_calls_total",
                                       "Calls a model's handle made to an implementation",
                                       prometheus::MetricType::Counter,
                                       {}};
  for (const auto& b : reg.bindings()) {
    for (const auto& c : b.candidates) {
      // Only bound candidates (eligible, or disabled after a failure) get series.
      std::vector<prometheus::ClientMetric::Label> labels{{"model", b.model}};
      if (!b.instance.empty()) labels.push_back({"instance", b.instance});
      labels.push_back({"slot", b.slot});
      labels.push_back({"impl", c.name});
      if (c.eligible || c.disabled) {
        model_active.metric.push_back(
            value_metric(labels, c.name == b.selected ? 1.0 : 0.0, false));
        model_calls.metric.push_back(value_metric(labels, static_cast<double>(c.calls), true));
      }
    }
  }
  for (auto* f : {&active, &calls, &declined, &fallback, &oom, &model_active, &model_calls})
    families.push_back(std::move(*f));
  // GPU memory per device (Triton: nv_gpu_memory_total_bytes / nv_gpu_memory_used_bytes).
  using Field = std::uint64_t models::DeviceMemory::*;
  const std::tuple<const char*, const char*, Field> gpu_families[] = {
      {"libreyolo_gpu_memory_total_bytes", "Memory of a GPU a model instance uses, bytes",
       &models::DeviceMemory::total_bytes},
      {"libreyolo_gpu_memory_used_bytes", "Memory in use on the GPU by every process, bytes",
       &models::DeviceMemory::used_bytes},
      {"libreyolo_gpu_memory_allocated_bytes", "Memory the daemon's tensors hold on the GPU, bytes",
       &models::DeviceMemory::allocated_bytes},
      {"libreyolo_gpu_memory_reserved_bytes",
       "Memory the daemon's caching allocator reserved on the GPU, bytes",
       &models::DeviceMemory::reserved_bytes}};
  for (const auto& [name, help, field] : gpu_families) {
    prometheus::MetricFamily f{name, help, prometheus::MetricType::Gauge, {}};
    for (const auto& g : gpus)
      f.metric.push_back(
          value_metric({{"device", g.device}}, static_cast<double>(g.*field), false));
    families.push_back(std::move(f));
  }
  if (access) {
    prometheus::MetricFamily denied{"libreyolo_api_denied_total",
                                    "Calls server.restricted_apis refused (PERMISSION_DENIED, 403)",
                                    prometheus::MetricType::Counter,
                                    {}};
    for (int i = 0; i < security::kApiGroups; ++i) {
      const auto g = static_cast<security::ApiGroup>(i);
      for (const auto p : {security::Protocol::grpc, security::Protocol::http}) {
        denied.metric.push_back(
            value_metric({{"group", security::group_name(g)},
                          {"protocol", p == security::Protocol::grpc ? "grpc" : "http"}},
                         static_cast<double>(access->denied(g, p)), true));
      }
    }
    families.push_back(std::move(denied));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace libreyolo::server
