"""NVIDIA's perf_analyzer (from tritonclient 2.51.0's wheel, installed by scripts/setup.sh) against
libreyolo-server: `perf_analyzer -m rtdetr_tiny -i grpc --concurrency-range 1:8` must run to
completion with its server-side section (read from ModelStatistics) filled at every concurrency.

perf_analyzer reads ModelMetadata and ModelConfig at start-up, then ServerMetadata's extensions
(for "statistics") and ModelStatistics around every measurement window. The inputs are optional
in ModelConfig, so a JSON --input-data file naming only `images` sends only that input; its b64
content is the tensor's raw bytes, i.e. the OIP BYTES layout (4-byte little-endian length, then
the JPEG).
"""
import base64
import csv
import json
import os
import re
import struct
import subprocess
import time
import unittest

import numpy as np
import tritonclient.grpc as grpcclient

from peers_env import DETECTOR, GRPC, WORK, image

PERF_ANALYZER = os.environ.get(
    "LIBREYOLO_PERF_ANALYZER",
    os.path.expanduser("~/.cache/libreyolo-server/perf-analyzer-2.51.0/bin/perf_analyzer"))
# Short windows that are always "stable": 3 windows of 8 requests per concurrency, so that the
# 8 concurrency levels take seconds on 2 CPU cores (the defaults measure 5 s windows until 3 agree
# within 10 %).
FAST = ["--measurement-mode", "count_windows", "--measurement-request-count", "8",
        "--stability-percentage", "1000", "--max-trials", "3"]


def stats():
    s = grpcclient.InferenceServerClient(url=GRPC).get_inference_statistics(DETECTOR).model_stats[0]
    return s.inference_count, s.inference_stats.success.count


def blocks(stdout):
    """{concurrency: text of its 'Request concurrency: N' block}."""
    parts = re.split(r"^Request concurrency: (\d+)\s*$", stdout, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def number(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


class PerfAnalyzer(unittest.TestCase):
    def run_pa(self, name, args, timeout=90):
        self.assertTrue(os.access(PERF_ANALYZER, os.X_OK),
                        f"{PERF_ANALYZER} missing: run scripts/setup.sh (it installs perf_analyzer)")
        csv_path = os.path.join(WORK, f"perf_{name}.csv")
        cmd = [PERF_ANALYZER, "-m", DETECTOR, "-i", "grpc", "-u", GRPC, "-f", csv_path] + args
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        took = time.time() - t0
        with open(os.path.join(WORK, f"perf_{name}.log"), "w") as f:
            f.write(r.stdout + r.stderr)
        hint = ""
        if "unable to set shape for the input" in r.stdout + r.stderr or "model's input shape of []" in r.stdout + r.stderr:
            hint = ("\nperf_analyzer takes every input's per-request shape from ModelMetadata minus the batch "
                    "dimension and refuses an empty one: the daemon must advertise images as BYTES [-1, 1].")
        self.assertEqual(r.returncode, 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}{hint}")
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
        return r.stdout, rows, took

    def check(self, stdout, rows, levels, what):
        found = blocks(stdout)
        self.assertEqual(sorted(found), levels, stdout[-2000:])
        for c in levels:
            b = found[c]
            self.assertIn("Server:", b, f"{what} concurrency {c}: no server-side section\n{b}")
            inference = number(r"Inference count: (\d+)", b)
            execution = number(r"Execution count: (\d+)", b)
            success = number(r"Successful request count: (\d+)", b)
            compute = number(r"compute infer (\d+) usec", b)
            queue = number(r"queue (\d+) usec", b)
            throughput = number(r"Throughput: ([0-9.]+) infer/sec", b)
            for label, v in (("inference count", inference), ("execution count", execution),
                             ("successful request count", success), ("compute infer usec", compute),
                             ("throughput", throughput)):
                self.assertIsNotNone(v, f"{what} concurrency {c}: no {label}\n{b}")
                self.assertGreater(v, 0, f"{what} concurrency {c}: {label} = {v}\n{b}")
            self.assertIsNotNone(queue, b)
            # One image per request, so inferences >= successes, but perf_analyzer takes both as
            # deltas of two statistics snapshots: a request whose batch the first snapshot counted
            # in the inferences (the daemon counts a batch before it answers) and whose success it
            # did not (counted when the answer leaves) adds to the success delta only. At most the
            # c requests in flight do (seen once: 234 inferences, 235 successes at c=7).
            self.assertGreaterEqual(inference + c, success, b)
            self.assertLessEqual(execution, inference)   # batches <= images
            print(f"  {what} c={c}: {throughput:.1f} infer/s, server: inference {inference:.0f}, "
                  f"execution {execution:.0f}, success {success:.0f}, queue {queue:.0f} us, "
                  f"compute infer {compute:.0f} us")
        # perf_analyzer writes the CSV rows sorted by throughput, not by concurrency.
        self.assertEqual(sorted(int(r["Concurrency"]) for r in rows), levels)
        for r in rows:
            self.assertGreater(float(r["Inferences/Second"]), 0, r)
            self.assertGreater(float(r["Server Compute Infer"]), 0, r)
            self.assertGreater(float(r["p99 latency"]), 0, r)

    def test_images_bytes_concurrency_1_to_8(self):
        jpeg = image("astronaut.jpg")
        data = os.path.join(WORK, "perf_images.json")
        with open(data, "w") as f:
            json.dump({"data": [{"images": {"b64": base64.b64encode(
                struct.pack("<I", len(jpeg)) + jpeg).decode(), "shape": [1]}}]}, f)
        before = stats()
        stdout, rows, took = self.run_pa("images", ["--concurrency-range", "1:8", "--input-data", data] + FAST)
        after = stats()
        print(f"\n  perf_analyzer --concurrency-range 1:8 (BYTES images) finished in {took:.1f} s")
        self.check(stdout, rows, list(range(1, 9)), "images")
        # Every measured request reached the daemon's statistics (plus perf_analyzer's own extra).
        measured = sum(int(number(r"Request count: (\d+)", b)) for b in blocks(stdout).values())
        self.assertGreaterEqual(after[1] - before[1], measured)
        self.assertEqual(after[0] - before[0], after[1] - before[1])  # 1 image per request

    def test_pixel_values_fp32_shape(self):
        # The tensor path: raw FP32 pixel_values of the --shape given, zeros, no image decoding.
        pixels = np.zeros((3, 320, 320), dtype=np.float32)
        data = os.path.join(WORK, "perf_pixels.json")
        with open(data, "w") as f:
            json.dump({"data": [{"pixel_values": {"b64": base64.b64encode(pixels.tobytes()).decode(),
                                                  "shape": [3, 320, 320]}}]}, f)
        stdout, rows, took = self.run_pa(
            "pixels", ["--concurrency-range", "1:2", "--shape", "pixel_values:3,320,320",
                       "--input-data", data] + FAST)
        print(f"\n  perf_analyzer --concurrency-range 1:2 (FP32 pixel_values 320x320) finished in {took:.1f} s")
        self.check(stdout, rows, [1, 2], "pixel_values")


if __name__ == "__main__":
    unittest.main()
