"""What the system shared-memory tests share over gRPC (shared_memory_test.py) and REST
(http_shared_memory_test.py): the client's POSIX regions, the fixture's inputs staged in one
region and the outputs read from another, and the comparison with the transformers reference
(tests/fixtures/models/rtdetr_tiny/expected.safetensors, the bounds of tritonclient_test.py
test_fp32_pixel_values)."""
import os

import numpy as np
import tritonclient.utils.shared_memory as shm
from safetensors.numpy import load_file

from peers_env import DETECTOR, FIXTURES

EXPECTED = f"{FIXTURES}/models/rtdetr_tiny/expected.safetensors"
NUM_QUERIES = 30  # tests/fixtures/models/rtdetr_tiny/config.json: every query is a candidate


class SharedMemoryRegions:
    """A unittest.TestCase mixin: `self.c` is the client (make_client), regions named after the
    test and destroyed, and every region unregistered, after each test."""

    TAG = "libreyolo_peers"

    def make_client(self):
        raise NotImplementedError

    def setUp(self):
        self.c = self.make_client()
        self.c.unregister_system_shared_memory()
        self.handles = []
        self.tag = f"/{self.TAG}_{os.getpid()}_{self.id().rsplit('.', 1)[-1]}"

    def tearDown(self):
        self.c.unregister_system_shared_memory()
        for h in self.handles:
            shm.destroy_shared_memory_region(h)

    def region(self, name, byte_size):
        h = shm.create_shared_memory_region(name, self.tag + "_" + name, byte_size)
        self.handles.append(h)
        return h

    def infer_fixture_through_shared_memory(self, client_module, **output_kwargs):
        """Infers the fixture's two images: FP32 pixel_values and INT64 target_sizes from region
        "in" (at offsets), scores and boxes into region "out" (boxes after the scores), labels
        and num_detections as usual. Returns (result, h_out, score_bytes, box_bytes)."""
        pixels = self.fixture_pixels()
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

        pv = client_module.InferInput("pixel_values", list(pixels.shape), "FP32")
        pv.set_shared_memory("in", pixels.nbytes, offset=in_offset)
        ts = client_module.InferInput("target_sizes", [2, 2], "INT64")
        ts.set_shared_memory("in", sizes.nbytes, offset=sizes_offset)
        outs = [client_module.InferRequestedOutput(n, **output_kwargs)
                for n in ("scores", "labels", "boxes", "num_detections")]
        outs[0].set_shared_memory("out", score_bytes)
        outs[2].set_shared_memory("out", box_bytes, offset=score_bytes)
        r = self.c.infer(DETECTOR, [pv, ts], outputs=outs, parameters={"threshold": 0.3})
        return r, h_out, score_bytes, box_bytes

    @staticmethod
    def fixture_pixels():
        expected = load_file(EXPECTED)
        return (expected["pixel_u8"].astype(np.float32) * np.float32(0.00392156862745098)).astype(np.float32)

    def check_detections(self, r, h_out, score_bytes, label):
        """The detections (counts and labels from the response, scores and boxes from region
        "out") against the fixture's at threshold 0.3: labels equal, scores within 1e-4, boxes
        within 1e-2 px."""
        expected = load_file(EXPECTED)
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
        print(f"\n  {label} system shared memory: max |score - expected| = {max_score:.3g}, "
              f"max |box - expected| = {max_box:.3g} px, {counts.tolist()} detections")
        self.assertLessEqual(max_score, 1e-4)
        self.assertLessEqual(max_box, 1e-2)
