#include "report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

namespace libreyolo::bench {

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto n = static_cast<double>(sorted.size());
  const auto rank = static_cast<std::size_t>(std::max(1.0, std::ceil(p / 100.0 * n)));
  return sorted[std::min(rank, sorted.size()) - 1];
}

Summary summarize(const StepResult& r) {
  Summary s;
  s.mode = r.step.concurrency > 0 ? "concurrency" : "rate";
  s.load = r.step.concurrency > 0 ? r.step.concurrency : r.step.rate;
  s.batch = r.images_per_request;
  s.window_s = r.window_s;
  s.ok = r.ok;
  for (const auto& [code, n] : r.errors) s.errors += n;
  s.errors_by_code = r.errors;
  s.first_error = r.first_error;
  s.dropped = r.dropped;
  if (r.window_s > 0) {
    s.requests_per_s = static_cast<double>(r.ok) / r.window_s;
    s.inferences_per_s = s.requests_per_s * static_cast<double>(r.images_per_request);
  }
  std::vector<double> v = r.latency_ms;
  std::sort(v.begin(), v.end());
  s.p50_ms = percentile(v, 50);
  s.p90_ms = percentile(v, 90);
  s.p99_ms = percentile(v, 99);
  s.max_ms = v.empty() ? 0 : v.back();
  s.mean_ms = v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  return s;
}

namespace {

std::string codes(const std::map<std::string, std::uint64_t>& m) {
  std::string out;
  for (const auto& [code, n] : m) out += (out.empty() ? "" : ";") + code + "=" + std::to_string(n);
  return out;
}

}  // namespace

void print_table(std::ostream& os, const std::vector<Summary>& rows) {
  os << std::left << std::setw(12) << "mode" << std::right << std::setw(8) << "load" << std::setw(6)
     << "batch" << std::setw(9) << "ok" << std::setw(8) << "errors" << std::setw(11) << "infer/s"
     << std::setw(10) << "req/s" << std::setw(10) << "p50 ms" << std::setw(10) << "p90 ms"
     << std::setw(10) << "p99 ms" << std::setw(10) << "mean ms"
     << "  errors by code\n";
  os << std::fixed;
  for (const auto& r : rows) {
    os << std::left << std::setw(12) << r.mode << std::right << std::setw(8)
       << std::setprecision(r.mode == "rate" ? 1 : 0) << r.load << std::setw(6) << r.batch
       << std::setw(9) << r.ok << std::setw(8) << r.errors << std::setprecision(2) << std::setw(11)
       << r.inferences_per_s << std::setw(10) << r.requests_per_s << std::setw(10) << r.p50_ms
       << std::setw(10) << r.p90_ms << std::setw(10) << r.p99_ms << std::setw(10) << r.mean_ms
       << "  " << codes(r.errors_by_code);
    if (r.dropped) os << " dropped=" << r.dropped;
    if (!r.first_error.empty()) os << " (first: " << r.first_error << ")";
    os << "\n";
  }
  os.unsetf(std::ios::fixed);
}

void write_csv(std::ostream& os, const std::vector<Summary>& rows) {
  os << "mode,load,batch,window_s,ok,errors,dropped,inferences_per_s,requests_per_s,p50_ms,p90_ms,"
        "p99_ms,mean_ms,max_ms,errors_by_code\n";
  os << std::setprecision(6);
  for (const auto& r : rows) {
    os << r.mode << "," << r.load << "," << r.batch << "," << r.window_s << "," << r.ok << ","
       << r.errors << "," << r.dropped << "," << r.inferences_per_s << "," << r.requests_per_s
       << "," << r.p50_ms << "," << r.p90_ms << "," << r.p99_ms << "," << r.mean_ms << ","
       << r.max_ms << "," << codes(r.errors_by_code) << "\n";
  }
}

void write_json(std::ostream& os, const std::map<std::string, std::string>& run,
                const std::vector<Summary>& rows) {
  nlohmann::ordered_json j;
  j["run"] = run;
  j["steps"] = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    nlohmann::ordered_json s;
    s["mode"] = r.mode;
    if (r.mode == "rate")
      s["rate"] = r.load;
    else
      s["concurrency"] = static_cast<std::int64_t>(r.load);
    s["batch"] = r.batch;
    s["window_s"] = r.window_s;
    s["ok"] = r.ok;
    s["errors"] = r.errors;
    s["dropped"] = r.dropped;
    s["inferences_per_s"] = r.inferences_per_s;
    s["requests_per_s"] = r.requests_per_s;
    s["latency_ms"] = {{"p50", r.p50_ms},
                       {"p90", r.p90_ms},
                       {"p99", r.p99_ms},
                       {"mean", r.mean_ms},
                       {"max", r.max_ms}};
    s["errors_by_code"] = r.errors_by_code;
    if (!r.first_error.empty()) s["first_error"] = r.first_error;
    j["steps"].push_back(std::move(s));
  }
  os << j.dump(2) << "\n";
}

}  // namespace libreyolo::bench
