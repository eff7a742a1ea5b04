"""Writes full-size checkpoints with random weights (transformers' own initialisation) as Hugging
Face folders, for the end-to-end forward benchmark (tools/bench_models).

Usage: make_random_checkpoint.py OUT_DIR [SET[,SET...]] [--tiny]
  detectors (default) -> OUT_DIR/rtdetr_r50vd, OUT_DIR/rtdetr_r18vd: the configurations of
      PekingU/rtdetr_r50vd and PekingU/rtdetr_r18vd (80 COCO classes, 300 queries, 640x640)
  classifiers -> OUT_DIR/vit_base (google/vit-base-patch16-224: ViTConfig's defaults, 1000
      labels) and OUT_DIR/swin_tiny (microsoft/swin-tiny-patch4-window7-224: SwinConfig's defaults)
  dfine -> OUT_DIR/dfine_l: D-FINE L as published (ustc-community/dfine-large-coco: DFineConfig's
      defaults = HGNetV2-B4 backbone, hidden 256, expansion 1.0, depth_mult 1.0, 6 decoder
      layers; decoder_n_points [3, 6, 3] of the original dfine_hgnetv2.yml; 80 classes, 640x640)
  deformable -> OUT_DIR/deformable_detr: SenseTime/deformable-detr (DeformableDetrConfig's
      defaults: 300 queries, 4 levels, 6 + 6 layers, 91 labels) with transformers' own ResNet-50
      instead of timm's (the same architecture; what libreyolo loads), 800x1333 processor
  families -> the ViT-backbone and DEIMv2 families at their transformers defaults, i.e. the configurations the
      configuration files name: OUT_DIR/rf_detr_base (Roboflow/rf-detr-base, 560x560, with
      RFDETRBaseConfig's dec_n_points 2 of roboflow/rf-detr rfdetr/config.py: the transformers
      default is 4), OUT_DIR/rf_detr_nano, rf_detr_small, rf_detr_medium (RFDETRNanoConfig /
      RFDETRSmallConfig / RFDETRMediumConfig: patch 16, 2 windows, features of blocks 3/6/9/12,
      2 / 3 / 4 decoder layers, 384 / 512 / 576 square),
      OUT_DIR/lw_detr_small (AnnaZhang/lwdetr_small_60e_coco, 640x640, with its one projector
      level: the default's list is empty), OUT_DIR/deimv2_default (Deimv2Config()'s defaults:
      HGNetV2 with the hybrid encoder, 29.9 M parameters, 92.6 GFLOPs at 640x640, D-FINE-L
      sized; NOT the published DEIMv2-N, Intellindust/DEIMv2_HGNetv2_N_COCO, of about 3.6 M);
      80 labels; OUT_DIR/deimv2_s (DEIMv2-S, deimv2_s() below: the published S model's
      layout: 9.9 M parameters and 27.9 GFLOPs at 640x640 by torch.utils.flop_counter, the
      README says 9.7 M and 25.6); and OUT_DIR/detr_resnet50 (facebook/detr-resnet-50:
      DetrConfig's defaults, timm's resnet50 backbone (needs timm), 100 queries, 91 labels,
      800x1333 processor);
      --tiny is ignored for this set except by detr_resnet50
  detr -> OUT_DIR/detr_resnet50 alone (the DETR-R50 benchmark row)
  owl -> the open-vocabulary OWL checkpoints: OUT_DIR/owlvit_base_patch32
      (google/owlvit-base-patch32: OwlViTConfig's defaults, ViT-B/32 at 768x768, CLIP text tower
      of 16 positions) and OUT_DIR/owlv2_base_patch16 (google/owlv2-base-patch16-ensemble:
      ViT-B/16 at 960x960, 3600 patches), with their processors
  grounding_dino -> OUT_DIR/grounding_dino_tiny (IDEA-Research/grounding-dino-tiny:
      GroundingDinoConfig's defaults = Swin-T backbone, BERT-base text tower, 900 queries,
      max_text_len 256, two-stage; GroundingDinoProcessor's 800 / 1333 resize)
  omdet -> OUT_DIR/omdet_turbo_swin_tiny (omlab/omdet-turbo-swin-tiny-hf: OmDetTurboConfig's
      defaults = CLIP text tower, 900 queries, 6 decoder layers, 640x640; with transformers' Swin-T
      (SwinConfig: embed 96, depths 2/2/6/2, window 7, out_indices 2/3/4) in place of the
      published folder's timm swin_tiny_patch4_window7_224: the same architecture and FLOPs)
  prompted -> owl, grounding_dino and omdet.
  all -> every set above but doclayout and prompted.
The prompted folders' tokenizers are NOT the published ones (the Hub is not reachable here):
they are the repository's tokenizer fixtures, copied (PROMPTED_TOKENIZERS): the tiny CLIP BPE of
tests/fixtures/tokenizers/clip_tiny (2,110 entries, its end token the largest id, so CLIP's
argmax pooling finds it) as the owlvit_tiny / owlv2_tiny fixtures lay it out, and the
grounding_dino_tiny fixture's WordPiece vocabulary (1,099 entries with bert-base-uncased's ids
where the model reads them: [CLS] 101, [SEP] 102, '.' 1012). Each is loaded by libreyolo and by
transformers' processors alike. What the benchmark times does not depend on the vocabulary: OWL
pads every label to 16 tokens, and "a cat. a dog." has the same 8 WordPiece tokens
([CLS] a cat . a dog . [SEP]) in both vocabularies.
--tiny writes the same folders with small widths and depths (for testing the scripts on a CPU;
the names are the same, so point the tools at another OUT_DIR).
Only the weights are random. Needs transformers 5.17 and torch.
"""
import os
import shutil
import sys

import torch
import transformers as tr

RTDETR_PROCESSOR = ('{"image_processor_type": "RTDetrImageProcessor", "do_resize": true, '
                    '"size": {"height": 640, "width": 640}, "do_rescale": true, '
                    '"rescale_factor": 0.00392156862745098, "do_normalize": false, "do_pad": false}\n')
VIT_PROCESSOR = ('{"image_processor_type": "ViTImageProcessor", "do_resize": true, '
                 '"size": {"height": 224, "width": 224}, "do_rescale": true, '
                 '"rescale_factor": 0.00392156862745098, "do_normalize": true, '
                 '"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}\n')
DEFORMABLE_PROCESSOR = ('{"image_processor_type": "DeformableDetrImageProcessor", "do_resize": true, '
                        '"size": {"shortest_edge": 800, "longest_edge": 1333}, "do_rescale": true, '
                        '"rescale_factor": 0.00392156862745098, "do_normalize": true, '
                        '"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], '
                        '"do_pad": true}\n')

IMAGENET_NORM = ('"do_normalize": true, "image_mean": [0.485, 0.456, 0.406], '
                 '"image_std": [0.229, 0.224, 0.225]')


def fixed_processor(kind, side, normalize=True):
    return ('{"image_processor_type": "%s", "do_resize": true, "size": {"height": %d, "width": %d}, '
            '"do_rescale": true, "rescale_factor": 0.00392156862745098, %s, "do_pad": false}\n'
            % (kind, side, side, IMAGENET_NORM if normalize else '"do_normalize": false'))


CLIP_NORM = ('"do_normalize": true, "image_mean": [0.48145466, 0.4578275, 0.40821073], '
             '"image_std": [0.26862954, 0.26130258, 0.27577711]')
# google/owlvit-base-patch32's and google/owlv2-base-patch16-ensemble's preprocessor_config.json.
OWLVIT_PROCESSOR = ('{"image_processor_type": "OwlViTImageProcessor", "processor_class": "OwlViTProcessor", '
                    '"do_resize": true, "size": {"height": 768, "width": 768}, "resample": 3, '
                    '"do_center_crop": false, "crop_size": {"height": 768, "width": 768}, '
                    '"do_rescale": true, "rescale_factor": 0.00392156862745098, %s}\n' % CLIP_NORM)
OWLV2_PROCESSOR = ('{"image_processor_type": "Owlv2ImageProcessor", "processor_class": "Owlv2Processor", '
                   '"do_resize": true, "size": {"height": 960, "width": 960}, "resample": 2, '
                   '"do_rescale": true, "rescale_factor": 0.00392156862745098, "do_pad": true, %s}\n'
                   % CLIP_NORM)
GROUNDING_DINO_PROCESSOR = ('{"image_processor_type": "GroundingDinoImageProcessor", '
                            '"processor_class": "GroundingDinoProcessor", "do_resize": true, '
                            '"size": {"shortest_edge": 800, "longest_edge": 1333}, "resample": 2, '
                            '"do_rescale": true, "rescale_factor": 0.00392156862745098, %s, '
                            '"do_pad": true, "format": "coco_detection"}\n' % IMAGENET_NORM)
# omlab/omdet-turbo-swin-tiny-hf's preprocessor_config.json: DetrImageProcessor, 640x640, no padding.
OMDET_PROCESSOR = ('{"image_processor_type": "DetrImageProcessor", "processor_class": "OmDetTurboProcessor", '
                   '"do_resize": true, "size": {"height": 640, "width": 640}, "resample": 2, '
                   '"do_rescale": true, "rescale_factor": 0.00392156862745098, %s, '
                   '"do_pad": false, "format": "coco_detection"}\n' % IMAGENET_NORM)
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                        "models")
# Folder written -> (fixture folder, its tokenizer files); see the module's docstring.
PROMPTED_TOKENIZERS = {
    "owlvit_base_patch32": ("owlvit_tiny", ("tokenizer.json", "tokenizer_config.json",
                                            "special_tokens_map.json")),
    "owlv2_base_patch16": ("owlv2_tiny", ("vocab.json", "merges.txt", "tokenizer_config.json",
                                          "special_tokens_map.json")),
    "grounding_dino_tiny": ("grounding_dino_tiny", ("vocab.txt", "tokenizer.json", "tokenizer_config.json")),
    "omdet_turbo_swin_tiny": ("omdet_turbo_tiny", ("tokenizer.json", "tokenizer_config.json",
                                                   "special_tokens_map.json")),
}


def save_prompted(model, out, name, processor):
    """save() plus the tokenizer files of PROMPTED_TOKENIZERS[name]."""
    save(model, out, name, processor)
    fixture, files = PROMPTED_TOKENIZERS[name]
    for f in files:
        shutil.copy(os.path.join(FIXTURES, fixture, f), os.path.join(out, name, f))


def owl(v2, tiny):
    """The published OWL configurations (see the docstring); tiny: 2 + 2 narrow layers, 64x64."""
    if tiny:
        text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2)
        vision = dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=64, patch_size=16 if v2 else 32)
        extra = dict(projection_dim=32)
    else:
        text, vision, extra = {}, dict(image_size=960, patch_size=16) if v2 else {}, {}
    return (tr.Owlv2Config if v2 else tr.OwlViTConfig)(text_config=text, vision_config=vision, **extra)


def omdet(tiny):
    """OmDet-Turbo Swin-T as published (see the docstring); tiny: the test fixture's widths."""
    if tiny:  # tests/fixtures/models/omdet_turbo_tiny/make_fixtures.py's widths, 64x64
        swin = tr.SwinConfig(embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4,
                             image_size=64, out_indices=[2, 3, 4])
        return tr.OmDetTurboConfig(
            backbone_config=swin, use_timm_backbone=False, backbone=None, image_size=64,
            text_config=dict(model_type="clip_text_model", hidden_size=24, intermediate_size=32,
                             num_hidden_layers=1, num_attention_heads=2),
            apply_layernorm_after_vision_backbone=False, encoder_in_channels=[16, 32, 64],
            text_projection_in_dim=24, text_projection_out_dim=24, class_embed_dim=24,
            task_encoder_hidden_dim=32, encoder_hidden_dim=16, decoder_hidden_dim=16,
            vision_features_channels=[16, 16, 16], encoder_attention_heads=2, encoder_dim_feedforward=24,
            decoder_num_heads=2, decoder_num_layers=2, decoder_dim_feedforward=24, decoder_num_points=2,
            num_queries=20)
    swin = tr.SwinConfig(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24], window_size=7,
                         image_size=640, out_indices=[2, 3, 4], out_features=["stage2", "stage3", "stage4"])
    # transformers' SwinBackbone normalises its maps itself (hidden_states_norms), so the extra
    # layer norms of the timm variant are off, as in tests/fixtures/models/omdet_turbo_tiny.
    return tr.OmDetTurboConfig(backbone_config=swin, use_timm_backbone=False, backbone=None,
                               apply_layernorm_after_vision_backbone=False)


def grounding_dino(tiny):
    if not tiny:
        return tr.GroundingDinoConfig()  # the defaults are grounding-dino-tiny's
    swin = tr.SwinConfig(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4], window_size=7,
                         out_indices=[2, 3, 4], out_features=["stage2", "stage3", "stage4"])
    bert = tr.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)
    return tr.GroundingDinoConfig(backbone_config=swin, text_config=bert, d_model=32, encoder_layers=1,
                                  decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                  encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=30)


def coco_labels(n):
    return {"id2label": {str(i): f"class_{i}" for i in range(n)},
            "label2id": {f"class_{i}": i for i in range(n)}}


def r50(tiny):
    if tiny:
        bb = tr.RTDetrResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                                   out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])
        return tr.RTDetrConfig(backbone_config=bb, encoder_in_channels=[32, 48, 64], encoder_hidden_dim=32,
                               encoder_ffn_dim=64, d_model=32, decoder_in_channels=[32, 32, 32],
                               decoder_ffn_dim=64, decoder_layers=2, num_queries=30, num_labels=80)
    return tr.RTDetrConfig(num_labels=80)  # the defaults are R50-vd


def r18(tiny):
    bb = tr.RTDetrResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                               embedding_size=64, downsample_in_bottleneck=False,
                               out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])
    if tiny:
        bb = tr.RTDetrResNetConfig(layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[16, 16, 32, 48],
                                   embedding_size=16, out_features=["stage2", "stage3", "stage4"],
                                   out_indices=[2, 3, 4])
        return tr.RTDetrConfig(backbone_config=bb, encoder_in_channels=[16, 32, 48], encoder_hidden_dim=32,
                               encoder_ffn_dim=64, d_model=32, decoder_in_channels=[32, 32, 32],
                               hidden_expansion=0.5, decoder_ffn_dim=64, decoder_layers=2, num_queries=30,
                               num_labels=80)
    return tr.RTDetrConfig(backbone_config=bb, encoder_in_channels=[128, 256, 512], hidden_expansion=0.5,
                           decoder_layers=3, num_labels=80)


def dfine_l(tiny):
    if tiny:
        # The widths of tests/live_parity/live_parity.py hgnet_backbone("b").
        bb = tr.HGNetV2Config(stem_channels=[3, 8, 16], stage_in_channels=[16, 32, 48, 64],
                              stage_mid_channels=[8, 16, 24, 32], stage_out_channels=[32, 48, 64, 96],
                              stage_num_blocks=[1, 2, 1, 1], stage_downsample=[False, True, True, True],
                              stage_light_block=[False, True, False, True], stage_kernel_size=[3, 5, 3, 5],
                              stage_numb_of_layers=[2, 3, 2, 2], hidden_sizes=[32, 48, 64, 96],
                              out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])
        return tr.DFineConfig(backbone_config=bb, encoder_in_channels=[48, 64, 96], encoder_hidden_dim=32,
                              encoder_ffn_dim=64, d_model=32, decoder_in_channels=[32, 32, 32],
                              decoder_ffn_dim=64, decoder_layers=2, num_queries=30, depth_mult=0.34,
                              decoder_n_points=[3, 6, 3], **coco_labels(80))
    return tr.DFineConfig(decoder_n_points=[3, 6, 3], **coco_labels(80))


def deformable(tiny):
    if tiny:
        bb = tr.ResNetConfig(embedding_size=16, hidden_sizes=[16, 24, 40, 56], depths=[1, 1, 1, 1],
                             out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])
        extra = dict(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=20)
    else:
        bb = tr.ResNetConfig(out_features=["stage2", "stage3", "stage4"], out_indices=[2, 3, 4])  # R50
        extra = {}
    return tr.DeformableDetrConfig(use_timm_backbone=False, backbone=None, backbone_config=bb,
                                   use_pretrained_backbone=False, **extra, **coco_labels(91))


def detr(tiny):
    """facebook/detr-resnet-50: DetrConfig's defaults (timm resnet50 backbone, 100 queries), 91
    COCO labels; tiny: a small transformer on the same backbone."""
    extra = dict(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                 num_queries=20) if tiny else {}
    return tr.DetrConfig(use_timm_backbone=True, backbone="resnet50", use_pretrained_backbone=False,
                         **extra, **coco_labels(91))


def save_detr(out, tiny):
    """OUT_DIR/detr_resnet50. DETR's timm backbone needs timm (scripts/requirements.txt)."""
    save(tr.DetrForObjectDetection(detr(tiny)), out, "detr_resnet50",
         DEFORMABLE_PROCESSOR.replace("DeformableDetrImageProcessor", "DetrImageProcessor"))


def save_doclayout(out, tiny):
    """OUT_DIR/pp_doclayout_v3: PPDocLayoutV3Config()'s defaults (HGNetV2 backbone, d_model 256,
    300 queries) with the 25 layout classes of PaddlePaddle/PP-DocLayoutV3 and its 800x800
    PPDocLayoutV3ImageProcessor (bicubic, rescale only); tiny: one encoder/decoder layer."""
    extra = dict(decoder_layers=1, encoder_layers=1, num_queries=20) if tiny else {}
    save(tr.PPDocLayoutV3ForObjectDetection(tr.PPDocLayoutV3Config(**extra, **coco_labels(25))), out,
         "pp_doclayout_v3",
         '{"image_processor_type": "PPDocLayoutV3ImageProcessor", "do_resize": true, "size": '
         '{"height": 800, "width": 800}, "resample": 3, "do_rescale": true, "rescale_factor": '
         '0.00392156862745098, "do_normalize": true, "image_mean": [0, 0, 0], "image_std": [1, 1, 1]}\n')


def save(model, out, name, processor):
    d = os.path.join(out, name)
    model.eval().save_pretrained(d, safe_serialization=True)
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        f.write(processor)
    print(name, sum(p.numel() for p in model.parameters()), "parameters ->", d, flush=True)


def rf_detr_windowed_small(decoder_layers, side):
    """RFDETRNanoConfig / RFDETRSmallConfig / RFDETRMediumConfig of roboflow/rf-detr
    (rfdetr/config.py) in transformers' terms: the DINOv2-small windowed backbone with patch 16
    and a side/16 position grid (image_size = side), 2 windows, features after blocks 3, 6, 9
    and 12; `decoder_layers` decoder layers (nano 2, small 3, medium 4) of 2 points per level."""
    backbone = tr.RfDetrDinov2Config(hidden_size=384, num_attention_heads=6, num_hidden_layers=12,
                                     patch_size=16, image_size=side, num_windows=2,
                                     num_register_tokens=0,
                                     out_features=["stage3", "stage6", "stage9", "stage12"])
    return tr.RfDetrConfig(backbone_config=backbone, decoder_layers=decoder_layers,
                           decoder_n_points=2, **coco_labels(80))


def deimv2_s():
    """DEIMv2-S as Intellindust-AI-Lab/DEIMv2 configs/deimv2/deimv2_dinov3_s_coco.yml builds it
    (on configs/base/deimv2.yml): the DINOv3-distilled ViT-Tiny (engine/backbone/vit_tiny.py: 192
    wide, 12 blocks of 3 heads, MLP 768, qkv bias, [CLS] and no register tokens, RoPE base 100,
    LayerNorm eps 1e-6) with features after blocks 4 / 8 / 12, the spatial tuning adapter of 16
    planes, the hybrid encoder and a 4-layer decoder at 192 wide with 512-wide FFNs, 8 heads,
    [3, 6, 3] points, depth_mult 0.67, expansion 0.34, 300 queries."""
    vit = tr.DINOv3ViTConfig(
        patch_size=16, hidden_size=192, intermediate_size=768, num_hidden_layers=12, num_attention_heads=3,
        num_register_tokens=0, image_size=640, layerscale_value=1.0, rope_theta=100.0, layer_norm_eps=1e-6,
        key_bias=True, out_features=["stage4", "stage8", "stage12"], out_indices=[4, 8, 12],
        apply_layernorm=True, reshape_hidden_states=True)
    return tr.Deimv2Config(
        backbone_config=vit, spatial_tuning_adapter_inplanes=16, encoder_hidden_dim=192,
        encoder_in_channels=[192, 192, 192], feat_strides=[8, 16, 32], encoder_layers=1, encoder_ffn_dim=512,
        encoder_attention_heads=8, hidden_expansion=0.34, depth_mult=0.67, d_model=192,
        decoder_in_channels=[192, 192, 192], decoder_ffn_dim=512, decoder_layers=4, decoder_attention_heads=8,
        decoder_n_points=[3, 6, 3], num_feature_levels=3, num_queries=300, **coco_labels(80))


def main():
    args = [a for a in sys.argv[1:] if a != "--tiny"]
    tiny = "--tiny" in sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    out = args[0]
    sets = (args[1] if len(args) > 1 else "detectors").split(",")
    if "all" in sets:
        sets = ["detectors", "classifiers", "dfine", "deformable", "families"]
    if "prompted" in sets:
        sets = [s for s in sets if s != "prompted"] + ["owl", "grounding_dino", "omdet"]
    unknown = set(sets) - {"detectors", "classifiers", "dfine", "deformable", "families", "detr",
                           "doclayout", "owl", "grounding_dino", "omdet"}
    if unknown:
        print(f"make_random_checkpoint.py: unknown set(s) {sorted(unknown)} (expected detectors, "
              "classifiers, dfine, deformable, families, detr, doclayout, owl, grounding_dino, omdet, "
              "prompted, all)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    for s in sets:
        if s == "detectors":
            for name, cfg in (("rtdetr_r50vd", r50(tiny)), ("rtdetr_r18vd", r18(tiny))):
                save(tr.RTDetrForObjectDetection(cfg), out, name, RTDETR_PROCESSOR)
        elif s == "classifiers":
            small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
            vit = tr.ViTConfig(**(small if tiny else {}), **coco_labels(1000))
            swin = tr.SwinConfig(**(dict(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2]) if tiny
                                    else {}), **coco_labels(1000))
            save(tr.ViTForImageClassification(vit), out, "vit_base", VIT_PROCESSOR)
            save(tr.SwinForImageClassification(swin), out, "swin_tiny", VIT_PROCESSOR)
        elif s == "dfine":
            save(tr.DFineForObjectDetection(dfine_l(tiny)), out, "dfine_l", RTDETR_PROCESSOR)
        elif s == "deformable":
            save(tr.DeformableDetrForObjectDetection(deformable(tiny)), out, "deformable_detr",
                 DEFORMABLE_PROCESSOR)
        elif s == "families":
            save(tr.RfDetrForObjectDetection(tr.RfDetrConfig(decoder_n_points=2, **coco_labels(80))),
                 out, "rf_detr_base", fixed_processor("RfDetrImageProcessor", 560))
            for name, layers, side in (("rf_detr_nano", 2, 384), ("rf_detr_small", 3, 512),
                                       ("rf_detr_medium", 4, 576)):
                save(tr.RfDetrForObjectDetection(rf_detr_windowed_small(layers, side)), out, name,
                     fixed_processor("RfDetrImageProcessor", side))
            # LwDetrConfig's default projector_scale_factors is empty (no feature level: not a
            # model); lwdetr_small_60e_coco's config.json has the single P4 level, scale 1.0.
            lw = tr.LwDetrConfig(projector_scale_factors=[1.0], **coco_labels(80))
            save(tr.LwDetrForObjectDetection(lw), out, "lw_detr_small",
                 fixed_processor("DeformableDetrImageProcessor", 640))
            save(tr.Deimv2ForObjectDetection(tr.Deimv2Config(**coco_labels(80))), out, "deimv2_default",
                 fixed_processor("RTDetrImageProcessor", 640, normalize=False))
            save(tr.Deimv2ForObjectDetection(deimv2_s()), out, "deimv2_s",
                 fixed_processor("RTDetrImageProcessor", 640))
            save_detr(out, tiny)
        elif s == "detr":
            save_detr(out, tiny)
        elif s == "doclayout":
            save_doclayout(out, tiny)
        elif s == "owl":
            save_prompted(tr.OwlViTForObjectDetection(owl(False, tiny)), out, "owlvit_base_patch32",
                          OWLVIT_PROCESSOR.replace("768", "64") if tiny else OWLVIT_PROCESSOR)
            save_prompted(tr.Owlv2ForObjectDetection(owl(True, tiny)), out, "owlv2_base_patch16",
                          OWLV2_PROCESSOR.replace("960", "64") if tiny else OWLV2_PROCESSOR)
        elif s == "grounding_dino":
            save_prompted(tr.GroundingDinoForObjectDetection(grounding_dino(tiny)), out,
                          "grounding_dino_tiny", GROUNDING_DINO_PROCESSOR)
        elif s == "omdet":
            save_prompted(tr.OmDetTurboForObjectDetection(omdet(tiny)), out, "omdet_turbo_swin_tiny",
                          OMDET_PROCESSOR.replace("640", "64") if tiny else OMDET_PROCESSOR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
