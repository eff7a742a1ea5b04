// What the torch fuzz targets share (no torch, no protobuf in this header: the OIP target's
// protobuf translation unit includes it; DESIGN.md "Header traps").
#pragma once

#include <string>

#include "server/core/core.h"

namespace libreyolo::fuzz {

/// tests/fixtures of the checkout the targets were built from, or $LIBREYOLO_FUZZ_FIXTURES when
/// set (prebuilt binaries run on another machine: scripts/fuzz-campaign.sh).
std::string fixtures();

/// A fresh folder under $TMPDIR (default /tmp), removed with its content at exit.
std::string temp_folder(const std::string& tag);

/// The OIP target's models: a folder whose path contains "classifier" loads as a fake ViT-like
/// classifier (5 classes, logits that do not depend on the pixels), one containing "segmenter"
/// as the FakeSegmenter, any other as the fake detector of
/// tests/integration/server_test_support.h (4 queries, 3 classes). Cheap: no
/// modules, no weights, so an execution costs the request's parsing and validation.
server::ModelFactory fake_models();

/// Writes <repo>/fake_detector/1 (RT-DETR's preprocessor_config.json), <repo>/fake_segmenter/1
/// (the same files) and <repo>/fake_classifier/1 (ViT's) with the config.json the core reads,
/// and returns <repo>.
std::string write_fake_repository();

}  // namespace libreyolo::fuzz
