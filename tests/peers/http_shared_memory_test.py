"""Triton's system shared-memory extension over KServe v2 REST through NVIDIA's own client
(tritonclient.http and tritonclient.utils.shared_memory, PyPI tritonclient[http]) against
libreyolo-server's HTTP port.

The HTTP twin of shared_memory_test.py: the client creates POSIX regions, registers them over
REST, sends the fixture's FP32 pixel_values and INT64 target_sizes from one region (at offsets)
and has scores and boxes written into another; the detections are compared with the
transformers reference (tests/fixtures/models/rtdetr_tiny/expected.safetensors). Status JSON,
duplicate names, bounds errors and unregister are checked with the HTTP statuses and the gRPC
side's messages, and a region registered over gRPC is used over REST (one registry for both
transports). CUDA shared memory needs a GPU: tests/gpu/cuda_shm_client.py --protocol http.
"""
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from peers_env import DETECTOR, GRPC, HTTP
from shm_support import NUM_QUERIES, SharedMemoryRegions


class HttpSystemSharedMemory(SharedMemoryRegions, unittest.TestCase):
    TAG = "libreyolo_peers_http"

    def make_client(self):
        return httpclient.InferenceServerClient(url=HTTP)

    def test_infer_through_shared_memory_matches_the_fixture(self):
        r, h_out, score_bytes, box_bytes = self.infer_fixture_through_shared_memory(
            httpclient, binary_data=True)
        # Outputs written into shared memory: their parameters name the region, no data (Triton).
        self.assertEqual(r.get_output("scores"), {
            "name": "scores", "datatype": "FP32", "shape": [2, NUM_QUERIES],
            "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": score_bytes}})
        self.assertEqual(r.get_output("boxes")["parameters"], {
            "shared_memory_region": "out", "shared_memory_byte_size": box_bytes,
            "shared_memory_offset": score_bytes})
        self.check_detections(r, h_out, score_bytes, "tritonclient.http")

    def test_status_duplicates_bounds_and_unregister(self):
        self.region("a", 4096)
        self.c.register_system_shared_memory("a", self.tag + "_a", 1000, offset=100)
        entry = {"name": "a", "key": self.tag + "_a", "offset": 100, "byte_size": 1000}
        self.assertEqual(self.c.get_system_shared_memory_status(), [entry])
        self.assertEqual(self.c.get_system_shared_memory_status("a"), [entry])
        self.assertEqual(self.c.get_cuda_shared_memory_status(), [])
        with self.assertRaises(InferenceServerException) as e:
            self.c.register_system_shared_memory("a", self.tag + "_a", 16)
        self.assertEqual(e.exception.status(), "400")
        self.assertEqual(e.exception.message(), "shared memory region 'a' already in manager")
        with self.assertRaises(InferenceServerException) as e:
            self.c.register_system_shared_memory("b", self.tag + "_a", 4000, offset=200)
        self.assertEqual(e.exception.status(), "400")
        self.assertTrue(e.exception.message().startswith(
            "failed to register shared memory region 'b': invalid args"), e.exception.message())
        with self.assertRaises(InferenceServerException) as e:
            self.c.get_system_shared_memory_status("nope")
        self.assertEqual(e.exception.status(), "404")
        self.assertEqual(e.exception.message(), "Unable to find system shared memory region: 'nope'")

        # An input beyond the region: the registry's message, no inference.
        pv = httpclient.InferInput("pixel_values", [1, 3, 8, 8], "FP32")
        pv.set_shared_memory("a", 768, offset=500)
        with self.assertRaises(InferenceServerException) as e:
            self.c.infer(DETECTOR, [pv])
        self.assertEqual(e.exception.status(), "400")
        self.assertEqual(e.exception.message(),
                         "Invalid offset + byte size for shared memory region: 'a' "
                         "(offset 500 + byte_size 768 > 1000 bytes)")

        self.c.unregister_system_shared_memory("a")
        self.assertEqual(self.c.get_system_shared_memory_status(), [])
        with self.assertRaises(InferenceServerException) as e:
            self.c.infer(DETECTOR, [pv])
        self.assertEqual(e.exception.status(), "404")
        self.assertEqual(e.exception.message(), "Unable to find shared memory region: 'a'")

    def test_a_region_registered_over_grpc_is_used_over_http(self):
        g = grpcclient.InferenceServerClient(url=GRPC)
        pixels = np.full([1, 3, 64, 64], 0.5, dtype=np.float32)
        h = self.region("g", pixels.nbytes)
        shm.set_shared_memory_region(h, [pixels])
        g.register_system_shared_memory("g", self.tag + "_g", pixels.nbytes)
        self.assertEqual(self.c.get_system_shared_memory_status("g"),
                         [{"name": "g", "key": self.tag + "_g", "offset": 0, "byte_size": pixels.nbytes}])
        pv = httpclient.InferInput("pixel_values", list(pixels.shape), "FP32")
        pv.set_shared_memory("g", pixels.nbytes)
        via_shm = self.c.infer(DETECTOR, [pv]).as_numpy("num_detections")
        pv_data = httpclient.InferInput("pixel_values", list(pixels.shape), "FP32")
        pv_data.set_data_from_numpy(pixels)
        np.testing.assert_array_equal(via_shm, self.c.infer(DETECTOR, [pv_data]).as_numpy("num_detections"))
        self.c.unregister_system_shared_memory("g")
        self.assertEqual(len(g.get_system_shared_memory_status().regions), 0)


if __name__ == "__main__":
    unittest.main()
