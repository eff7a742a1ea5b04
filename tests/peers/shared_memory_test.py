"""Triton's system shared-memory extension through NVIDIA's own client (tritonclient.grpc and
tritonclient.utils.shared_memory, PyPI tritonclient[grpc]) against libreyolo-server.

The client creates POSIX regions, registers them, sends the fixture's FP32 pixel_values and
INT64 target_sizes from one region (at offsets) and has scores and boxes written into another;
the detections are compared with the transformers reference (tests/fixtures/models/rtdetr_tiny/
expected.safetensors, the bounds of tritonclient_test.py test_fp32_pixel_values). Status,
duplicate names, bounds errors and unregister are checked with Triton's status codes and
messages. CUDA shared memory needs a GPU: tests/gpu/cuda_shm_client.py.
"""
import unittest

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from peers_env import DETECTOR, GRPC
from shm_support import SharedMemoryRegions


class SystemSharedMemory(SharedMemoryRegions, unittest.TestCase):
    TAG = "libreyolo_peers"

    def make_client(self):
        return grpcclient.InferenceServerClient(url=GRPC)

    def test_infer_through_shared_memory_matches_the_fixture(self):
        r, h_out, score_bytes, _ = self.infer_fixture_through_shared_memory(grpcclient)
        response = r.get_response()
        # Host outputs keep their raw_output_contents; shared-memory ones name their region.
        self.assertEqual([o.name for o in response.outputs], ["labels", "num_detections", "scores", "boxes"])
        self.assertEqual(len(response.raw_output_contents), 2)
        params = {o.name: {k: v for k, v in o.parameters.items()} for o in response.outputs}
        self.assertEqual(params["scores"]["shared_memory_region"].string_param, "out")
        self.assertEqual(params["scores"]["shared_memory_byte_size"].int64_param, score_bytes)
        self.assertEqual(params["boxes"]["shared_memory_offset"].int64_param, score_bytes)
        self.check_detections(r, h_out, score_bytes, "tritonclient")

    def test_status_duplicates_bounds_and_unregister(self):
        self.region("a", 4096)
        self.c.register_system_shared_memory("a", self.tag + "_a", 1000, offset=100)
        status = self.c.get_system_shared_memory_status()
        self.assertEqual([(s.name, s.key, s.offset, s.byte_size) for s in status.regions.values()],
                         [("a", self.tag + "_a", 100, 1000)])
        self.assertEqual(self.c.get_system_shared_memory_status("a", as_json=True),
                         {"regions": {"a": {"name": "a", "key": self.tag + "_a", "offset": "100",
                                            "byte_size": "1000"}}})
        with self.assertRaises(InferenceServerException) as e:
            self.c.register_system_shared_memory("a", self.tag + "_a", 16)
        self.assertEqual(e.exception.status(), "StatusCode.ALREADY_EXISTS")
        self.assertEqual(e.exception.message(), "shared memory region 'a' already in manager")
        with self.assertRaises(InferenceServerException) as e:
            self.c.register_system_shared_memory("b", self.tag + "_a", 4000, offset=200)
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        self.assertTrue(e.exception.message().startswith(
            "failed to register shared memory region 'b': invalid args"), e.exception.message())
        with self.assertRaises(InferenceServerException) as e:
            self.c.get_system_shared_memory_status("nope")
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")
        self.assertEqual(e.exception.message(), "Unable to find system shared memory region: 'nope'")

        # An input beyond the region: Triton's message, no inference.
        pv = grpcclient.InferInput("pixel_values", [1, 3, 8, 8], "FP32")
        pv.set_shared_memory("a", 768, offset=500)
        with self.assertRaises(InferenceServerException) as e:
            self.c.infer(DETECTOR, [pv])
        self.assertEqual(e.exception.status(), "StatusCode.INVALID_ARGUMENT")
        self.assertEqual(e.exception.message(),
                         "Invalid offset + byte size for shared memory region: 'a' "
                         "(offset 500 + byte_size 768 > 1000 bytes)")

        self.c.unregister_system_shared_memory("a")
        self.assertEqual(len(self.c.get_system_shared_memory_status().regions), 0)
        with self.assertRaises(InferenceServerException) as e:
            self.c.infer(DETECTOR, [pv])
        self.assertEqual(e.exception.status(), "StatusCode.NOT_FOUND")
        self.assertEqual(e.exception.message(), "Unable to find shared memory region: 'a'")

    def test_cuda_status_is_empty(self):
        # Served on every build; registering needs a device (tests/gpu/cuda_shm_client.py).
        self.assertEqual(len(self.c.get_cuda_shared_memory_status().regions), 0)


if __name__ == "__main__":
    unittest.main()
