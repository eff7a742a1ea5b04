"""Published configurations, full size: a random-weight checkpoint of each model family at the
configuration its transformers 5.17 configuration file names (tools/bench_models/
make_random_checkpoint.py: D-FINE L, RF-DETR base, LW-DETR small, DEIMv2 N), run through
libreyolo-predict on a photograph and through transformers on the pixel_values libreyolo made;
logits within 1e-4 and boxes within 1e-5 (CPU, float32). The tiny fixtures cover the
arithmetic; this covers the configuration parsing of the real sizes (D-FINE L's HGNetV2 did not
load until 2026-12-01: its hidden_sizes differ from stage_out_channels for the unreturned stage).

    python published_configs.py LIBREYOLO_PREDICT WORK_DIR
"""
import os
import subprocess
import sys

import torch
import transformers as tr
from safetensors.torch import load_file

tr.logging.disable_progress_bar()

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = ["dfine_l", "rf_detr_base", "lw_detr_small", "deimv2_n"]


def main():
    predict, work = sys.argv[1], sys.argv[2]
    subprocess.run([sys.executable, os.path.join(ROOT, "tools/bench_models/make_random_checkpoint.py"),
                    work, "dfine,families"], check=True, stdout=subprocess.DEVNULL)
    image = os.path.join(ROOT, "tests/fixtures/images/coffee.jpg")
    failed = 0
    for name in MODELS:
        ckpt, dump = os.path.join(work, name), os.path.join(work, name + ".safetensors")
        r = subprocess.run([predict, "--model", ckpt, "--image", image, "--out", dump],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {name}: libreyolo-predict exit {r.returncode}: {r.stderr.strip()[-400:]}")
            failed += 1
            continue
        ours = load_file(dump)
        model = tr.AutoModelForObjectDetection.from_pretrained(ckpt).eval()
        with torch.inference_mode():
            ref = model(pixel_values=ours["pixel_values"])
        dl = (ref.logits - ours["logits"]).abs().max().item()
        db = (ref.pred_boxes - ours["pred_boxes"]).abs().max().item()
        ok = dl <= 1e-4 and db <= 1e-5
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name} {tuple(ours['pixel_values'].shape)}: "
              f"max|logits diff| {dl:.3g}, max|pred_boxes diff| {db:.3g}", flush=True)
    print(f"published configurations: {len(MODELS) - failed} of {len(MODELS)} match transformers")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
