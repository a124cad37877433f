#!/usr/bin/env python3
"""Exports the zoo's architectures (zoo_models.py) to ONNX with a synthetic HDF5 training set and
an `mpigrad train` config each, for run_zoo.py. Optional, never needed by CI: torch, torchvision,
transformers, h5py and numpy.

For each model NAME it writes, into --out (default build/zoo, which git ignores; the files are
large and are never committed):
  NAME.onnx   the freshly initialized module (torch.manual_seed(0)), legacy exporter, opset 17,
              training mode (BatchNorm and Dropout stay layers), no constant folding, the batch
              dimension free;
  NAME.h5     /x and /y: uint8 images [N, 3, 32, 32] with class labels [N] (vision), int64
              token ids [N, T] with the next tokens [N, T] (GPT-2) or a class [N] (BERT);
              N = 64 batches, so one `mpigrad train` process of up to 64 steps stays in its
              first epoch;
  NAME.ini    the `mpigrad train` config (data, model, loss, optimizer, batch size); run_zoo.py
              adds the steps, the threads and the output folder.

    python3 benchmarks/zoo/export_models.py                 # the default set
    python3 benchmarks/zoo/export_models.py --models gpt2_124m,bert_base
    python3 benchmarks/zoo/export_models.py --all           # the large ones too
    python3 benchmarks/zoo/export_models.py --models resnet18 --image-size 224

--image-size N exports the image models for N x N images instead of 32 x 32 (the size the
architectures were built for is 224), as NAME_Npx.onnx/.h5/.ini, for mpigrad-bench-threads
(--input 3,N,N) and `mpigrad train`; run_zoo.py times the 32 x 32 exports only.

A model already exported is skipped unless --force.
"""
import argparse
import os
import sys
import time

import h5py
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402

BATCHES_IN_DATA = 64


def select(models_arg, all_models):
    if models_arg:
        names = [name.strip() for name in models_arg.split(",") if name.strip()]
        unknown = [name for name in names if name not in zoo_models.BY_NAME]
        if unknown:
            sys.exit(f"export_models.py: unknown model(s) {', '.join(unknown)}; known: "
                     f"{', '.join(zoo_models.BY_NAME)}")
        return [zoo_models.BY_NAME[name] for name in names]
    return [model for model in zoo_models.MODELS if all_models or not model.large]


def write_data(model, path, image_size):
    x, y = zoo_models.synthetic_data(model, BATCHES_IN_DATA * model.batch, image_size=image_size)
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("x", data=x)
        f.create_dataset("y", data=y)
    os.replace(tmp, path)


def write_config(model, path):
    name = os.path.basename(path)[:-len(".ini")]
    classes = model.vocab if model.kind == "lm" else model.classes
    text = (f"# {model.title}: written by benchmarks/zoo/export_models.py\n"
            f"[data]\ntrain = {name}.h5\nnum_classes = {classes}\n"
            f"[model]\nname = onnx\nfile = {name}.onnx\n"
            f"[loss]\nname = cross_entropy\n"
            f"[optim]\n{model.ini_optim()}"
            f"[train]\nbatch_size = {model.batch}\nshuffle = false\nepochs = 1\nlog_every = 1\n")
    with open(path, "w") as f:
        f.write(text)


def without_packed_sequence_check():
    """transformers 5 looks for packed sequences in the position ids with torch.diff, which the
    legacy exporter cannot write; the benchmark's sequences are never packed, so the export
    takes the answer the check gives them (None) and the graph keeps the plain causal mask."""
    try:
        import transformers.masking_utils as masking
    except ImportError:
        return
    if hasattr(masking, "find_packed_sequence_indices"):
        masking.find_packed_sequence_indices = lambda position_ids: None


def export(model, path, image_size):
    if model.kind != "image":
        without_packed_sequence_check()
    module = model.build().train()
    sample = zoo_models.example_input(model, model.batch, image_size)
    tmp = path + ".tmp"
    torch.onnx.export(module, (sample,), tmp, dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="build/zoo", help="folder for the files (build/zoo)")
    parser.add_argument("--models", help="comma-separated names (default: all but the large)")
    parser.add_argument("--all", action="store_true", help="the large models too")
    parser.add_argument("--force", action="store_true", help="export again what exists")
    parser.add_argument("--image-size", type=int, default=zoo_models.IMAGE_SHAPE[1],
                        help="image models' height and width (32); other sizes are written "
                             "as NAME_Npx")
    args = parser.parse_args()
    default_size = args.image_size == zoo_models.IMAGE_SHAPE[1]
    models = select(args.models, args.all)
    if args.image_size < 1:
        sys.exit(f"export_models.py: --image-size {args.image_size} is not a size in pixels")
    if not default_size:
        others = [model.name for model in models if model.kind != "image"]
        if others:
            sys.exit(f"export_models.py: --image-size is for image models; "
                     f"{', '.join(others)}: token models, no images")
    os.makedirs(args.out, exist_ok=True)
    for model in models:
        name = zoo_models.file_stem(model.name, args.image_size)
        stem = os.path.join(args.out, name)
        if os.path.exists(stem + ".onnx") and os.path.exists(stem + ".h5") and not args.force:
            print(f"{name}: exported already ({stem}.onnx)")
            write_config(model, stem + ".ini")
            continue
        start = time.time()
        export(model, stem + ".onnx", args.image_size)
        write_data(model, stem + ".h5", args.image_size)
        write_config(model, stem + ".ini")
        size = os.path.getsize(stem + ".onnx") / 2**20
        print(f"{name}: {stem}.onnx ({size:.0f} MiB), {stem}.h5, {stem}.ini "
              f"in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
