// The process registry's report of one model's binding, for the unit tests of CPU implementations.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/registry.h"

namespace libreyolo::kernels {

/// The report of the binding of `model` in the process registry (the only one by that name; a
/// test failure and an empty report when there is none). Bindings are listed while their handle
/// lives.
inline BindingReport binding_of(const std::string& model) {
  for (const auto& b : Registry::process_default().bindings())
    if (b.model == model) return b;
  ADD_FAILURE() << "no binding for " << model;
  return {};
}

}  // namespace libreyolo::kernels
