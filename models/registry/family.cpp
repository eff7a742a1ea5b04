#include "models/registry/family.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "models/core/config.h"

namespace libreyolo::models {

bool path_has_segment(const std::string& path, const std::string& segment) {
  std::istringstream in(path);
  std::string part;
  while (std::getline(in, part, '.'))
    if (part == segment) return true;
  return false;
}

std::function<bool(const std::string& path)> path_with(std::string segment) {
  return [segment = std::move(segment)](const std::string& path) {
    return path_has_segment(path, segment);
  };
}

Family::Family(std::string name, std::vector<std::string> model_types, int order, FamilyLoader load)
    : name(std::move(name)), model_types(std::move(model_types)), order(order), load(load) {}

Family&& Family::predicts(std::vector<Task> what,
                          std::optional<image::DetectionHead> post_processing) && {
  tasks = std::move(what);
  head = post_processing;
  return std::move(*this);
}

Family&& Family::fused_attention(bool by_default) && {
  fused_attention_default = by_default;
  return std::move(*this);
}

Family&& Family::layouts(std::vector<LayoutClassRule> classes, std::vector<std::string> defaults,
                         std::vector<std::string> reduced_precision_defaults) && {
  layout_classes = std::move(classes);
  default_layouts = std::move(defaults);
  reduced_precision_layouts = std::move(reduced_precision_defaults);
  return std::move(*this);
}

Family&& Family::takes_pixel_mask() && {
  pixel_mask = true;
  return std::move(*this);
}

FamilyRegistry& FamilyRegistry::builtin() {
  static FamilyRegistry registry;
  return registry;
}

void FamilyRegistry::add(Family family) {
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument("family \"" + family.name + "\": " + what);
  };
  if (family.name.empty()) refuse("no name");
  if (family.model_types.empty()) refuse("no model_type");
  if (!family.load) refuse("no loader");
  for (const auto& type : family.model_types) {
    const Family* other = find(type);
    if (other || std::count(family.model_types.begin(), family.model_types.end(), type) > 1)
      throw std::invalid_argument("model_type \"" + type + "\" is registered twice (families " +
                                  (other ? other->name : family.name) + " and " + family.name +
                                  ")");
  }
  families_.push_back(std::make_unique<const Family>(std::move(family)));
}

const Family* FamilyRegistry::find(const std::string& model_type) const {
  for (const auto& f : families_)
    for (const auto& type : f->model_types)
      if (type == model_type) return f.get();
  return nullptr;
}

const Family& FamilyRegistry::require(const std::string& model_type,
                                      const core::ConfigView& config) const {
  const Family* f = find(model_type);
  if (!f) config.fail("model_type", "unsupported model type \"" + model_type + "\"");
  return *f;
}

std::vector<const Family*> FamilyRegistry::all() const {
  std::vector<const Family*> out;
  for (const auto& f : families_) out.push_back(f.get());
  std::sort(out.begin(), out.end(), [](const Family* a, const Family* b) {
    return a->order != b->order ? a->order < b->order : a->name < b->name;
  });
  return out;
}

FamilyRegistrar::FamilyRegistrar(Family family) {
  FamilyRegistry::builtin().add(std::move(family));
}

}  // namespace libreyolo::models
