// Summaries of libreyolo-bench steps: percentiles, the console table, CSV and JSON.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "load.h"

namespace libreyolo::bench {

/// Nearest-rank percentile (p in [0, 100]) of `sorted` (ascending); 0 for an empty vector.
double percentile(const std::vector<double>& sorted, double p);

/// One step, summarised. Throughput counts OK responses completed inside the window.
struct Summary {
  std::string mode;  ///< "concurrency" or "rate"
  double load = 0;   ///< the concurrency, or the offered rate in requests/s
  std::int64_t batch = 1;
  double window_s = 0;
  std::uint64_t ok = 0, errors = 0, dropped = 0;
  double requests_per_s = 0;    ///< ok / window_s
  double inferences_per_s = 0;  ///< ok * batch / window_s (images/s)
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, mean_ms = 0, max_ms = 0;
  std::map<std::string, std::uint64_t> errors_by_code;
  std::string first_error;
};

Summary summarize(const StepResult& r);

/// A fixed-width table, one row per step, with a header.
void print_table(std::ostream& os, const std::vector<Summary>& rows);

/// CSV with a header line; errors_by_code as "CODE=n;CODE=n".
void write_csv(std::ostream& os, const std::vector<Summary>& rows);

/// JSON: {"run": <run>, "steps": [...]} where `run` holds the invocation (server, model, input).
void write_json(std::ostream& os, const std::map<std::string, std::string>& run,
                const std::vector<Summary>& rows);

}  // namespace libreyolo::bench
