// How a slot gets a `hub` implementation from a kernels-hub build: the op it needs (name and
// schema) and how to call it. Declared next to each slot
// (kernels/attention/ms_deform_attn_hub.cpp), so that the generic provider
// (kernels/hub/provider.cpp) knows no op's schema or arguments.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/registry.h"

namespace libreyolo::kernels::hub {

/// A loaded, schema-checked op of a hub build.
struct HubOp {
  c10::OperatorHandle handle;
  std::string backend;      ///< "cpu" | "cuda"
  std::string description;  ///< "org/name@sha build/<variant>"
};

/// The op of one lock entry, loaded now or at the first call outside a CUDA-graph capture
/// (the provider never downloads or dlopen()s while a graph is captured). Thread-safe.
class LazyHubOp {
 public:
  LazyHubOp(std::function<HubOp()> load, std::function<bool()> capturing)
      : load_(std::move(load)), capturing_(std::move(capturing)) {}
  /// The op when loaded, else null.
  std::shared_ptr<const HubOp> get() const { return std::atomic_load(&loaded_); }
  /// Loads (once); throws the load's error, again on every later call after a failure.
  std::shared_ptr<const HubOp> load_now();
  /// True while the current stream captures a CUDA graph.
  bool capturing() const { return capturing_ && capturing_(); }
  /// Set after the first successful call outside a capture (calls inside a capture decline
  /// before it: the op's first call may allocate or synchronise).
  std::atomic<bool> warmed{false};

 private:
  std::function<HubOp()> load_;
  std::function<bool()> capturing_;
  std::mutex mutex_;
  std::shared_ptr<const HubOp> loaded_;  // read with std::atomic_load
  std::string load_error_;
};

/// What a slot declares for the hub provider.
struct HubBinding {
  std::string slot;    ///< the slot name, as kernels.lock entries name it
  std::string op;      ///< the op in the build's namespace, e.g. "ms_deform_attn_forward"
  std::string schema;  ///< its schema without the namespace, as c10::FunctionSchema prints it
  /// Registers the slot's `hub` implementation, which calls `op`.
  std::function<void(Registry&, std::shared_ptr<LazyHubOp> op)> install;
};

/// Every slot's hub binding (today: ms_deform_attn, kernels-community/deformable-detr).
std::vector<HubBinding> builtin_bindings();

}  // namespace libreyolo::kernels::hub
