#include "models/core/state_dict.h"

#include <torch/nn/module.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace libreyolo::models::core {

std::string shape_string(at::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

namespace {

/// `key` with control characters written as \xNN: a checkpoint's keys are the file's bytes
/// (JSON allows "\n" in a name) and an error message stays one line (the fuzz invariant).
std::string visible(const std::string& key) {
  std::string out;
  for (const char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
    } else {
      static const char* hex = "0123456789abcdef";
      out += {'\\', 'x', hex[c >> 4], hex[c & 15]};
    }
  }
  return out;
}

/// The first `limit` items, comma-separated (control characters escaped), then how many more.
std::string join_limited(const std::vector<std::string>& items, size_t limit = 40) {
  std::ostringstream os;
  for (size_t i = 0; i < items.size() && i < limit; ++i) os << (i ? ", " : "") << visible(items[i]);
  if (items.size() > limit) os << ", ... (" << items.size() - limit << " more)";
  return os.str();
}

bool any_match(const std::vector<std::regex>& res, const std::string& key) {
  for (const auto& re : res)
    if (std::regex_match(key, re)) return true;
  return false;
}

std::vector<std::regex> compile(const std::vector<std::string>& patterns) {
  std::vector<std::regex> out;
  for (const auto& p : patterns) out.emplace_back(p, std::regex::ECMAScript | std::regex::optimize);
  return out;
}

}  // namespace

LoadReport load_state_dict(torch::nn::Module& module, const SafetensorsFile& file,
                           const LoadRules& rules, at::ScalarType dtype, const at::Device& device) {
  // Module tensors in registration order: parameters then buffers.
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    targets.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true))
    targets.emplace_back(b.key(), b.value());

  auto ignored = compile(rules.ignored_file_keys);
  ignored.emplace_back(R"(.*\.num_batches_tracked)");
  const auto optional = compile(rules.optional_module_keys);

  LoadReport report;
  std::set<std::string> used;
  std::vector<std::string> missing, mismatched;
  std::vector<std::pair<at::Tensor, std::string>> plan;  // (target, file key)
  for (const auto& [key, target] : targets) {
    std::string found;
    if (file.contains(key)) {
      found = key;
    } else if (rules.aliases) {
      for (const auto& alt : rules.aliases(key))
        if (file.contains(alt)) {
          found = alt;
          report.aliased.push_back(key + " <- " + alt);
          break;
        }
    }
    if (found.empty()) {
      if (!any_match(optional, key)) missing.push_back(key);
      continue;
    }
    used.insert(found);
    const auto& info = file.info(found);
    if (at::IntArrayRef(info.shape) != target.sizes()) {
      mismatched.push_back("'" + key + "': expected " + shape_string(target.sizes()) + ", found " +
                           shape_string(info.shape) +
                           (found == key ? std::string() : " (from '" + found + "')"));
      continue;
    }
    plan.emplace_back(target, found);
  }
  std::vector<std::string> unexpected;
  for (const auto& t : file.header().tensors) {
    if (used.count(t.key)) continue;
    if (any_match(ignored, t.key))
      report.ignored.push_back(t.key);
    else
      unexpected.push_back(t.key);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::ostringstream os;
    os << file.path() << ": checkpoint does not match the model:";
    if (!missing.empty())
      os << " missing keys (" << missing.size() << "): " << join_limited(missing) << ";";
    if (!unexpected.empty())
      os << " unexpected keys (" << unexpected.size() << "): " << join_limited(unexpected) << ";";
    if (!mismatched.empty()) os << " shape mismatch for " << join_limited(mismatched) << ";";
    std::string msg = os.str();
    msg.pop_back();
    throw CheckpointError(msg);
  }

  at::NoGradGuard no_grad;
  // Module::to() would also cast integer buffers: convert one by one instead. Tensors left at
  // their constructed value (optional ones) follow the requested dtype/device too.
  std::set<const void*> planned;
  for (const auto& entry : plan) planned.insert(entry.first.unsafeGetTensorImpl());
  for (auto& [key, target] : targets) {
    if (planned.count(target.unsafeGetTensorImpl())) continue;
    const auto type = at::isFloatingType(target.scalar_type()) ? dtype : target.scalar_type();
    if (target.device() != device || target.scalar_type() != type)
      target.set_data(target.to(device, type));
  }
  for (auto& [target, key] : plan) {
    const auto type = at::isFloatingType(target.scalar_type()) ? dtype : target.scalar_type();
    at::Tensor value = file.get(key, type, device);
    // set_data swaps the storage in place: the module keeps its tensor objects, so every
    // holder of the parameter (tied heads) sees the loaded value.
    target.set_data(value);
    ++report.loaded;
  }
  for (auto& p : module.parameters(true)) p.set_requires_grad(false);
  return report;
}

}  // namespace libreyolo::models::core
