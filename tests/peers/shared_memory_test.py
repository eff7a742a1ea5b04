"""Triton's system shared-memory extension through NVIDIA's own client (tritonclient.grpc and
tritonclient.utils.shared_memory, PyPI tritonclient[grpc]) against libreyolo-server.

The client creates POSIX regions, registers them, sends the fixture's FP32 pixel_values and
INT64 target_sizes from one region (at offsets) and has scores and boxes written into another;
the detections are compared with the transformers reference (tests/fixtures/models/rtdetr_tiny/
expected.safetensors, the bounds of tritonclient_test.py test_fp32_pixel_values). Status,
duplicate names, bounds errors and unregister are checked with Triton's status codes and
messages. CUDA shared memory needs a GPU: tests/gpu/cuda_shm_client.py.
"""
import os
import unittest

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from safetensors.numpy import load_file
from tritonclient.utils import InferenceServerException

from peers_env import DETECTOR, FIXTURES, GRPC

EXPECTED = f"{FIXTURES}/models/rtdetr_tiny/expected.safetensors"
NUM_QUERIES = 30  # tests/fixtures/models/rtdetr_tiny/config.json: every query is a candidate


def client():
    return grpcclient.InferenceServerClient(url=GRPC)


class SystemSharedMemory(unittest.TestCase):
    def setUp(self):
        self.c = client()
        self.c.unregister_system_shared_memory()
        self.handles = []
        self.tag = f"/libreyolo_peers_{os.getpid()}_{self.id().rsplit('.', 1)[-1]}"

    def tearDown(self):
        self.c.unregister_system_shared_memory()
        for h in self.handles:
            shm.destroy_shared_memory_region(h)

    def region(self, name, byte_size):
        h = shm.create_shared_memory_region(name, self.tag + "_" + name, byte_size)
        self.handles.append(h)
        return h

    def test_infer_through_shared_memory_matches_the_fixture(self):
        expected = load_file(EXPECTED)
        pixels = (expected["pixel_u8"].astype(np.float32) * np.float32(0.00392156862745098)).astype(np.float32)
        sizes = np.array([[512, 512], [400, 600]], dtype=np.int64)
        in_offset = 64  # the pixels do not start the region
        sizes_offset = in_offset + pixels.nbytes
        h_in = self.region("in", sizes_offset + sizes.nbytes)
        shm.set_shared_memory_region(h_in, [pixels], offset=in_offset)
        shm.set_shared_memory_region(h_in, [sizes], offset=sizes_offset)
        score_bytes = 2 * NUM_QUERIES * 4
        box_bytes = 2 * NUM_QUERIES * 4 * 4
        h_out = self.region("out", score_bytes + box_bytes)
        self.c.register_system_shared_memory("in", self.tag + "_in", sizes_offset + sizes.nbytes)
        self.c.register_system_shared_memory("out", self.tag + "_out", score_bytes + box_bytes)

        pv = grpcclient.InferInput("pixel_values", list(pixels.shape), "FP32")
        pv.set_shared_memory("in", pixels.nbytes, offset=in_offset)
        ts = grpcclient.InferInput("target_sizes", [2, 2], "INT64")
        ts.set_shared_memory("in", sizes.nbytes, offset=sizes_offset)
        outs = [grpcclient.InferRequestedOutput(n) for n in ("scores", "labels", "boxes", "num_detections")]
        outs[0].set_shared_memory("out", score_bytes)
        outs[2].set_shared_memory("out", box_bytes, offset=score_bytes)
        r = self.c.infer(DETECTOR, [pv, ts], outputs=outs, parameters={"threshold": 0.3})
        response = r.get_response()
        # Host outputs keep their raw_output_contents; shared-memory ones name their region.
        self.assertEqual([o.name for o in response.outputs], ["labels", "num_detections", "scores", "boxes"])
        self.assertEqual(len(response.raw_output_contents), 2)
        params = {o.name: {k: v for k, v in o.parameters.items()} for o in response.outputs}
        self.assertEqual(params["scores"]["shared_memory_region"].string_param, "out")
        self.assertEqual(params["scores"]["shared_memory_byte_size"].int64_param, score_bytes)
        self.assertEqual(params["boxes"]["shared_memory_offset"].int64_param, score_bytes)
        counts = r.as_numpy("num_detections")
        labels = r.as_numpy("labels")
        scores = shm.get_contents_as_numpy(h_out, np.float32, [2, NUM_QUERIES])
        boxes = shm.get_contents_as_numpy(h_out, np.float32, [2, NUM_QUERIES, 4], offset=score_bytes)
        max_score = max_box = 0.0
        for i in range(2):
            p = f"th0.3_img{i}_"
            es, el, eb = expected[p + "scores"], expected[p + "labels"], expected[p + "boxes"]
            n = int(counts[i])
            self.assertEqual(n, es.shape[0], f"image {i}")
            np.testing.assert_array_equal(labels[i, :n], el, err_msg=f"image {i} labels")
            max_score = max(max_score, float(np.abs(scores[i, :n] - es).max(initial=0)))
            max_box = max(max_box, float(np.abs(boxes[i, :n] - eb).max(initial=0)))
        print(f"\n  tritonclient system shared memory: max |score - expected| = {max_score:.3g}, "
              f"max |box - expected| = {max_box:.3g} px, {counts.tolist()} detections")
        self.assertLessEqual(max_score, 1e-4)
        self.assertLessEqual(max_box, 1e-2)

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
