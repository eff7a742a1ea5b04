#include "server/config/serving_config.h"

#include <yaml-cpp/yaml.h>

#include "kernels/policy.h"
#include "models/layouts/kernel_config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace libreyolo::server {
namespace {

std::string where(const std::string& file, const YAML::Node& node) {
  return kernels::yaml_location(file, node);
}

[[noreturn]] void fail(const std::string& file, const YAML::Node& node, const std::string& msg) {
  throw std::runtime_error(where(file, node) + ": " + kernels::printable(msg));
}

/// User text echoed in a message, clipped: a 20 MB scalar must not become a 20 MB model
/// reason (RepositoryIndex would exceed the gRPC message limit) or log line.
std::string clip(const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 77) + "..."; }

/// Longest accepted queue delay / timeout: one day. Larger values overflow the steady_clock
/// arithmetic of the scheduler (a wrapped deadline lies in the past).
constexpr std::uint64_t kMaxMicroseconds = 86400ull * 1000 * 1000;

template <class T>
T as(const std::string& file, const YAML::Node& v, const std::string& key, const char* what) {
  if (!v.IsScalar()) fail(file, v, key + " must be " + what);
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    fail(file, v, key + " must be " + what + ", got '" + clip(v.Scalar()) + "'");
  }
}

/// Longest accepted instance count of one group entry (per GPU): each instance holds a copy of
/// the weights and a worker thread.
constexpr std::int64_t kMaxInstances = 64;

std::vector<InstanceGroup> parse_instance_group(const YAML::Node& v, const std::string& file) {
  if (!v.IsSequence())
    fail(file, v, "instance_group must be a list of {count, kind, gpus} entries");
  std::vector<InstanceGroup> out;
  for (const auto& entry : v) {
    if (!entry.IsMap()) fail(file, entry, "instance_group entry must be a mapping");
    InstanceGroup g;
    g.origin = where(file, entry);
    for (const auto& kv : entry) {
      const std::string key = kv.first.Scalar();
      const YAML::Node& x = kv.second;
      if (key == "count") {
        g.count = as<std::int64_t>(file, x, "instance_group.count", "an integer");
        if (g.count < 1 || g.count > kMaxInstances)
          fail(file, x,
               "instance_group.count must be between 1 and 64, got " + std::to_string(g.count));
      } else if (key == "kind") {
        const auto k =
            as<std::string>(file, x, "instance_group.kind", "KIND_GPU, KIND_CPU or KIND_AUTO");
        if (k == "KIND_GPU")
          g.kind = InstanceGroup::Kind::gpu;
        else if (k == "KIND_CPU")
          g.kind = InstanceGroup::Kind::cpu;
        else if (k == "KIND_AUTO")
          g.kind = InstanceGroup::Kind::automatic;
        else
          fail(
              file, x,
              "instance_group.kind must be KIND_GPU, KIND_CPU or KIND_AUTO, got '" + clip(k) + "'");
      } else if (key == "gpus") {
        if (!x.IsSequence()) fail(file, x, "instance_group.gpus must be a list of GPU indices");
        for (const auto& i : x) {
          const auto gpu = as<std::int64_t>(file, i, "instance_group.gpus", "a GPU index");
          if (gpu < 0 || gpu > 1023)
            fail(file, i,
                 "instance_group.gpus: GPU index must be between 0 and 1023, got " +
                     std::to_string(gpu));
          for (auto seen : g.gpus)
            if (seen == gpu)
              fail(file, i, "instance_group.gpus: GPU " + std::to_string(gpu) + " is listed twice");
          g.gpus.push_back(gpu);
        }
      } else {
        fail(file, kv.first,
             "unknown key instance_group." + clip(key) + " (expected count, kind, gpus)");
      }
    }
    if (g.kind == InstanceGroup::Kind::cpu && !g.gpus.empty())
      fail(file, entry, "instance_group: KIND_CPU takes no gpus");
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

const char* instance_kind_name(InstanceGroup::Kind kind) {
  switch (kind) {
    case InstanceGroup::Kind::gpu:
      return "KIND_GPU";
    case InstanceGroup::Kind::cpu:
      return "KIND_CPU";
    case InstanceGroup::Kind::automatic:
      return "KIND_AUTO";
  }
  return "KIND_AUTO";
}

ServingConfig parse_serving_config(const std::string& yaml_text, const std::string& file) {
  ServingConfig c;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(file + ":" + std::to_string(e.mark.line + 1) + ": " +
                             kernels::printable(e.msg));
  }
  if (!root || root.IsNull()) return c;
  if (!root.IsMap()) fail(file, root, "serving.yaml must be a mapping");
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (key == "device") {
      c.device = as<std::string>(file, v, key, "cpu, cuda or cuda:N");
    } else if (key == "dtype") {
      c.dtype = as<std::string>(file, v, key, "float32, float16 or bfloat16");
      if (c.dtype != "float32" && c.dtype != "float16" && c.dtype != "bfloat16") {
        fail(file, v, "dtype must be float32, float16 or bfloat16, got '" + clip(c.dtype) + "'");
      }
      c.dtype_origin = where(file, v);
    } else if (key == "max_batch_size") {
      c.max_batch_size = as<std::int64_t>(file, v, key, "an integer");
      if (c.max_batch_size < 1) fail(file, v, "max_batch_size must be >= 1");
    } else if (key == "max_queue_delay_microseconds") {
      c.max_queue_delay_microseconds = as<std::uint64_t>(file, v, key, "an integer");
      if (c.max_queue_delay_microseconds > kMaxMicroseconds)
        fail(file, v, "max_queue_delay_microseconds must be at most 86400000000 (one day)");
    } else if (key == "refill_wait_fraction") {
      c.refill_wait_fraction = as<double>(file, v, key, "a number from 0 to 1");
      if (!(c.refill_wait_fraction >= 0 && c.refill_wait_fraction <= 1))
        fail(file, v, "refill_wait_fraction must be a number from 0 to 1");
    } else if (key == "max_queue_size") {
      c.max_queue_size = as<std::uint32_t>(file, v, key, "an integer");
      if (c.max_queue_size < 1) fail(file, v, "max_queue_size must be >= 1");
    } else if (key == "default_timeout_microseconds") {
      c.default_timeout_microseconds = as<std::uint64_t>(file, v, key, "an integer");
      if (c.default_timeout_microseconds > kMaxMicroseconds)
        fail(file, v, "default_timeout_microseconds must be at most 86400000000 (one day)");
    } else if (key == "threshold") {
      c.threshold = as<double>(file, v, key, "a number");
      if (!std::isfinite(c.threshold)) fail(file, v, "threshold must be a finite number");
    } else if (key == "top_k") {
      c.top_k = as<std::int64_t>(file, v, key, "an integer");
      // The request parameter's rule (server/tasks/image_inputs.h kMaxTopK).
      if (c.top_k < 0 || c.top_k > 1000000000)
        fail(file, v, "top_k must be an integer from 0 to 1000000000");
    } else if (key == "warmup") {
      c.warmup = as<bool>(file, v, key, "true or false");
    } else if (key == "fused_attention") {
      // Same spellings as the server's kernels.fused_attention: YAML 1.1 reads bare on/off as
      // booleans, so true/false mean on/off too.
      const std::string s = v.IsScalar() ? kernels::normalize(v.Scalar()) : "";
      if (s == "default") {
        c.fused_attention = kernels::FusedAttention::family_default;
      } else if (s == "on" || s == "true") {
        c.fused_attention = kernels::FusedAttention::on;
      } else if (s == "off" || s == "false") {
        c.fused_attention = kernels::FusedAttention::off;
      } else {
        fail(file, v,
             "fused_attention must be default, on or off, got '" +
                 (v.IsScalar() ? clip(v.Scalar()) : std::string("a non-scalar")) + "'");
      }
      c.fused_attention_origin = where(file, v);
    } else if (key == "cuda_graphs") {
      c.cuda_graphs = as<bool>(file, v, key, "on or off");
    } else if (key == "prompt_cache_mb") {
      c.prompt_cache_mb = as<std::int64_t>(file, v, key, "an integer");
      if (c.prompt_cache_mb < 0 || c.prompt_cache_mb > (1 << 20))
        fail(file, v, "prompt_cache_mb must be from 0 to 1048576");
    } else if (key == "quantization") {
      const std::string s = v.IsScalar() ? kernels::normalize(v.Scalar()) : "";
      if (s == "none") {
        c.quantization = models::quantization::Quantization::none;
      } else if (s == "fp8") {
        c.quantization = models::quantization::Quantization::fp8;
      } else {
        fail(file, v,
             "quantization must be none or fp8, got '" +
                 (v.IsScalar() ? clip(v.Scalar()) : std::string("a non-scalar")) + "'");
      }
      c.quantization_origin = where(file, v);
    } else if (key == "kernels") {
      c.kernels = kernels::parse_model_kernels(v, file);
    } else if (key == "kernel_config") {
      c.kernel_config = models::layouts::parse_kernel_config(v, file);
    } else if (key == "instance_group") {
      c.instance_group = parse_instance_group(v, file);
    } else {
      fail(file, kv.first,
           "unknown key " + clip(key) +
               " (expected device, dtype, max_batch_size, max_queue_delay_microseconds, "
               "refill_wait_fraction, max_queue_size, default_timeout_microseconds, threshold, "
               "top_k, warmup, fused_attention, cuda_graphs, prompt_cache_mb, quantization, "
               "kernels, kernel_config, instance_group)");
    }
  }
  return c;
}

ServingConfig load_serving_config(const std::string& file) {
  std::ifstream in(file);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  return parse_serving_config(text.str(), file);
}

}  // namespace libreyolo::server
