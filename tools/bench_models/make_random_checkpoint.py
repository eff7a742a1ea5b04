"""Writes full-size checkpoints with random weights (transformers' own initialisation) as Hugging
Face folders, for the end-to-end forward benchmark (tools/bench_models).

Usage: make_random_checkpoint.py OUT_DIR [detectors|classifiers]
  detectors (default) -> OUT_DIR/rtdetr_r50vd, OUT_DIR/rtdetr_r18vd: the configurations of
      PekingU/rtdetr_r50vd and PekingU/rtdetr_r18vd (80 COCO classes, 300 queries, 640x640)
  classifiers -> OUT_DIR/vit_base (google/vit-base-patch16-224: ViTConfig's defaults, 1000
      labels) and OUT_DIR/swin_tiny (microsoft/swin-tiny-patch4-window7-224: SwinConfig's defaults)
Only the weights are random. Needs transformers 5.17 and torch.
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


VIT_PROCESSOR = ('{"image_processor_type": "ViTImageProcessor", "do_resize": true, '
                 '"size": {"height": 224, "width": 224}, "do_rescale": true, '
                 '"rescale_factor": 0.00392156862745098, "do_normalize": true, '
                 '"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}\n')


def classifiers(out):
    labels = {"id2label": {str(i): f"class_{i}" for i in range(1000)},
              "label2id": {f"class_{i}": i for i in range(1000)}}
    for name, model in (("vit_base", tr.ViTForImageClassification(tr.ViTConfig(**labels))),
                        ("swin_tiny", tr.SwinForImageClassification(tr.SwinConfig(**labels)))):
        d = os.path.join(out, name)
        model.eval().save_pretrained(d, safe_serialization=True)
        with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
            f.write(VIT_PROCESSOR)
        print(name, sum(p.numel() for p in model.parameters()), "parameters ->", d, flush=True)


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    if len(sys.argv) > 2 and sys.argv[2] == "classifiers":
        classifiers(out)
        return
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
