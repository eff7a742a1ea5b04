"""Writes full-size RT-DETR checkpoints with random weights (transformers' own initialisation) as
Hugging Face folders, for the end-to-end forward benchmark (tools/bench_models).

Usage: make_random_checkpoint.py OUT_DIR  ->  OUT_DIR/rtdetr_r50vd, OUT_DIR/rtdetr_r18vd
The configurations follow PekingU/rtdetr_r50vd and PekingU/rtdetr_r18vd (80 COCO classes, 300
queries, 640x640); only the weights are random. Needs transformers 5.17 and torch.
"""
import os
import sys

import torch
import transformers as tr


def r50():
    return tr.RTDetrConfig(num_labels=80)  # the defaults are R50-vd


def r18():
    bb = tr.RTDetrResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                               embedding_size=64, downsample_in_bottleneck=False,
                               out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])
    return tr.RTDetrConfig(backbone_config=bb, encoder_in_channels=[128, 256, 512], hidden_expansion=0.5,
                           decoder_layers=3, num_labels=80)


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    for name, cfg in (("rtdetr_r50vd", r50()), ("rtdetr_r18vd", r18())):
        d = os.path.join(out, name)
        model = tr.RTDetrForObjectDetection(cfg).eval()
        model.save_pretrained(d, safe_serialization=True)
        with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
            f.write('{"image_processor_type": "RTDetrImageProcessor", "do_resize": true, '
                    '"size": {"height": 640, "width": 640}, "do_rescale": true, '
                    '"rescale_factor": 0.00392156862745098, "do_normalize": false, "do_pad": false}\n')
        print(name, sum(p.numel() for p in model.parameters()), "parameters ->", d, flush=True)


if __name__ == "__main__":
    main()
