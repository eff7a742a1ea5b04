"""libreyolo-bench (tools/bench_serving) against the daemon: its JSON/CSV agree with themselves and
with the daemon's ModelStatistics, errors are counted by status code, bad invocations fail fast.
"""
import csv
import json
import os
import subprocess
import unittest

import tritonclient.grpc as grpcclient

from peers_env import DETECTOR, FIXTURES, GRPC, WORK

BENCH = os.path.join(os.environ.get("LIBREYOLO_PEERS_BUILD", "build"), "bin", "libreyolo-bench")


def successes():
    s = grpcclient.InferenceServerClient(url=GRPC).get_inference_statistics(DETECTOR).model_stats[0]
    return s.inference_stats.success.count


@unittest.skipUnless(os.access(BENCH, os.X_OK), f"{BENCH} is not built")
class BenchServing(unittest.TestCase):
    def bench(self, *args, timeout=60):
        return subprocess.run([BENCH, "--server", GRPC, "--model", DETECTOR] + list(args),
                              capture_output=True, text=True, timeout=timeout)

    def test_concurrency_sweep_json_and_csv(self):
        js, cs = os.path.join(WORK, "bench.json"), os.path.join(WORK, "bench.csv")
        before = successes()
        r = self.bench("--image", os.path.join(FIXTURES, "images", "coffee.jpg"), "--batch", "2",
                       "--concurrency", "1,2", "--duration", "1.5", "--warmup", "0.5",
                       "--json", js, "--csv", cs)
        self.assertEqual(r.returncode, 0, r.stderr)
        after = successes()
        with open(js) as f:
            report = json.load(f)
        self.assertEqual(report["run"]["model"], DETECTOR)
        self.assertIn("probe", report["run"])
        steps = report["steps"]
        self.assertEqual([(s["mode"], s["concurrency"], s["batch"]) for s in steps],
                         [("concurrency", 1, 2), ("concurrency", 2, 2)])
        ok_total = 0
        for s in steps:
            self.assertGreater(s["ok"], 0, s)
            self.assertEqual((s["errors"], s["errors_by_code"]), (0, {}), s)
            self.assertAlmostEqual(s["inferences_per_s"], s["ok"] * 2 / 1.5, places=6)
            self.assertAlmostEqual(s["requests_per_s"], s["ok"] / 1.5, places=6)
            l = s["latency_ms"]
            self.assertTrue(0 < l["p50"] <= l["p90"] <= l["p99"] <= l["max"], l)
            ok_total += s["ok"]
        # Every recorded response is a success in the daemon's statistics (plus the probe and
        # the calls outside the windows).
        self.assertGreaterEqual(after - before, ok_total + 1)
        with open(cs) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([int(r["ok"]) for r in rows], [s["ok"] for s in steps])
        print(f"\n  libreyolo-bench: {[round(s['inferences_per_s'], 2) for s in steps]} infer/s, "
              f"{ok_total} recorded, daemon successes +{after - before}")

    def test_rate_mode_and_deadline_errors(self):
        js = os.path.join(WORK, "bench_rate.json")
        r = self.bench("--shape", "3,64,64", "--rate", "20", "--duration", "1", "--warmup", "0",
                       "--json", js)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(js) as f:
            s = json.load(f)["steps"][0]
        self.assertEqual((s["mode"], s["rate"], s["errors"]), ("rate", 20, 0), s)
        self.assertGreater(s["ok"], 0, s)
        # A 1 ms deadline cannot be met by preprocessing + a forward pass: every recorded call
        # fails, and is counted under its status code (the probe has its own 60 s deadline).
        r = self.bench("--shape", "3,64,64", "--rate", "20", "--duration", "1", "--warmup", "0",
                       "--timeout", "0.001", "--json", js)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(js) as f:
            s = json.load(f)["steps"][0]
        self.assertEqual(s["ok"], 0, s)
        self.assertGreater(s["errors"], 0, s)
        self.assertEqual(s["errors_by_code"], {"DEADLINE_EXCEEDED": s["errors"]}, s)
        self.assertTrue(s["first_error"], s)

    def test_bad_invocations(self):
        r = subprocess.run([BENCH, "--server", GRPC, "--model", "nope", "--shape", "3,64,64"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("NOT_FOUND: unknown model 'nope'", r.stderr)
        r = subprocess.run([BENCH, "--shape", "3,64"], capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--shape is [N,]3,H,W", r.stderr)
        r = subprocess.run([BENCH, "--image", "x.jpg", "--shape", "3,8,8"], capture_output=True,
                           text=True, timeout=10)
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
