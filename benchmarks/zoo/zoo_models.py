"""The model zoo of benchmarks/zoo: each architecture, how it is built in PyTorch, the data it
trains on and the optimizer, in one table that export_models.py (ONNX files and data) and
run_zoo.py (the timing) both read, so the two sides of a comparison cannot drift apart.

Optional, never needed by CI: torch, torchvision and transformers from PyPI.

Choices that make a model export cleanly and train the same way on both sides:
  * every module is built from torch.manual_seed(0), so the exported weights and the ones
    PyTorch times are the same numbers;
  * stochastic depth is off (torchvision's draws a Bernoulli mask, which the legacy exporter
    writes as random ops); the classifier's dropout stays (ONNX Dropout, in training mode on
    both sides);
  * the transformers models use eager attention (plain MatMul and Softmax in the graph, no
    scaled_dot_product_attention), no dropout (as llm.c's GPT-2 trainer) and no KV cache;
  * GPT-2 returns its logits as [N, V, T], the layout cross-entropy takes with labels [N, T]
    (PyTorch's F.cross_entropy and mpigrad's alike), so both sides run the same transpose;
  * the BERT-base-sized encoder carries a sequence-classification head on the pooled first
    token (2 classes, labels [N]): it exports without the masked-LM head's tied decoder over
    the 30,522-token vocabulary, and its cost is the encoder's.
"""
from dataclasses import dataclass

import torch
from torch import nn

IMAGE_SHAPE = (3, 32, 32)
IMAGE_CLASSES = 10
GPT2_VOCAB = 50257


@dataclass(frozen=True)
class ZooModel:
    name: str
    title: str          # as the table shows it
    kind: str           # "image": uint8 [N, 3, 32, 32] -> class [N]; "lm": ids [N, T] -> next
                        # ids [N, T]; "seqcls": ids [N, T] -> class [N]
    batch: int
    optimizer: str      # "sgd" (lr 0.01, momentum 0.9) or "adamw" (lr 1e-4, no weight decay)
    seq_len: int = 0    # token models
    vocab: int = 0      # token models
    classes: int = IMAGE_CLASSES
    steps: int = 6      # timed steps per round and side (run_zoo.py --steps overrides)
    warmup: int = 2     # untimed steps at the start of each mpigrad process and of PyTorch
    large: bool = False  # minutes a run: left out unless asked for (run_zoo.py --all)

    def build(self) -> nn.Module:
        torch.manual_seed(0)
        return _BUILDERS[self.name]()

    def optimizer_for(self, parameters):
        if self.optimizer == "sgd":
            return torch.optim.SGD(parameters, lr=SGD_LR, momentum=SGD_MOMENTUM)
        return torch.optim.AdamW(parameters, lr=ADAMW_LR, weight_decay=0.0)

    def ini_optim(self) -> str:
        if self.optimizer == "sgd":
            return f"name = sgd\nlr = {SGD_LR}\nmomentum = {SGD_MOMENTUM}\n"
        return f"name = adamw\nlr = {ADAMW_LR}\nweight_decay = 0\n"


SGD_LR, SGD_MOMENTUM = 0.01, 0.9
ADAMW_LR = 1e-4


class LogitsVT(nn.Module):
    """A causal LM whose output is [N, V, T] logits (cross-entropy's layout with [N, T] labels)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids).logits.transpose(1, 2)


class Logits(nn.Module):
    """A transformers classifier returning its logits tensor, not a ModelOutput."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).logits


def _torchvision(name, **kwargs):
    import torchvision
    return getattr(torchvision.models, name)(weights=None, num_classes=IMAGE_CLASSES, **kwargs)


def _gpt2(layers, width, heads):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=GPT2_VOCAB, n_positions=1024, n_embd=width, n_layer=layers,
                        n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        use_cache=False)
    config._attn_implementation = "eager"
    return LogitsVT(GPT2LMHeadModel(config))


def _bert_base():
    from transformers import BertConfig, BertForSequenceClassification
    config = BertConfig(num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config._attn_implementation = "eager"
    return Logits(BertForSequenceClassification(config))


_BUILDERS = {
    "resnet18": lambda: _torchvision("resnet18"),
    "resnet50": lambda: _torchvision("resnet50"),
    "mobilenet_v3_small": lambda: _torchvision("mobilenet_v3_small"),
    "mobilenet_v3_large": lambda: _torchvision("mobilenet_v3_large"),
    "efficientnet_b0": lambda: _torchvision("efficientnet_b0", stochastic_depth_prob=0.0),
    "convnext_tiny": lambda: _torchvision("convnext_tiny", stochastic_depth_prob=0.0),
    "gpt2_tiny": lambda: _gpt2(2, 64, 4),
    "gpt2_124m": lambda: _gpt2(12, 768, 12),
    "bert_base": _bert_base,
}

MODELS = [
    ZooModel("resnet18", "ResNet-18", "image", batch=8, optimizer="sgd"),
    ZooModel("resnet50", "ResNet-50", "image", batch=8, optimizer="sgd"),
    ZooModel("mobilenet_v3_small", "MobileNetV3-Small", "image", batch=8, optimizer="sgd"),
    ZooModel("mobilenet_v3_large", "MobileNetV3-Large", "image", batch=8, optimizer="sgd"),
    ZooModel("efficientnet_b0", "EfficientNet-B0", "image", batch=8, optimizer="sgd"),
    ZooModel("convnext_tiny", "ConvNeXt-Tiny", "image", batch=8, optimizer="sgd"),
    ZooModel("gpt2_tiny", "GPT-2 (2 layers, width 64)", "lm", batch=8, optimizer="sgd",
             seq_len=64, vocab=GPT2_VOCAB),
    ZooModel("bert_base", "BERT-base encoder (classifier)", "seqcls", batch=4,
             optimizer="adamw", seq_len=64, vocab=30522, classes=2, steps=3, warmup=1,
             large=True),
    ZooModel("gpt2_124m", "GPT-2 124M", "lm", batch=4, optimizer="adamw", seq_len=64,
             vocab=GPT2_VOCAB, steps=3, warmup=1, large=True),
]

BY_NAME = {model.name: model for model in MODELS}


def file_stem(name: str, image_size: int = IMAGE_SHAPE[1]) -> str:
    """The exported files' name: NAME at the zoo's 32 x 32 images, NAME_Npx at N x N."""
    return name if image_size == IMAGE_SHAPE[1] else f"{name}_{image_size}px"


def image_shape(size: int = IMAGE_SHAPE[1]):
    """An image's shape at `size` x `size` pixels (the zoo's own: 32)."""
    return (IMAGE_SHAPE[0], size, size)


def example_input(model: ZooModel, batch: int, image_size: int = IMAGE_SHAPE[1]) -> torch.Tensor:
    if model.kind == "image":
        return torch.rand(batch, *image_shape(image_size))
    return torch.randint(0, model.vocab, (batch, model.seq_len), dtype=torch.int64)


def synthetic_data(model: ZooModel, samples: int, seed: int = 1,
                   image_size: int = IMAGE_SHAPE[1]):
    """The training set as numpy arrays (x, y): random images (image_size x image_size pixels) or
    token streams, fixed by seed."""
    import numpy as np
    rng = np.random.default_rng(seed)
    if model.kind == "image":
        x = rng.integers(0, 256, size=(samples, *image_shape(image_size)), dtype=np.uint8)
        y = rng.integers(0, model.classes, size=samples, dtype=np.int64)
    elif model.kind == "lm":
        stream = rng.integers(0, model.vocab, size=(samples, model.seq_len + 1), dtype=np.int64)
        x, y = stream[:, :-1].copy(), stream[:, 1:].copy()
    else:
        x = rng.integers(0, model.vocab, size=(samples, model.seq_len), dtype=np.int64)
        y = rng.integers(0, model.classes, size=samples, dtype=np.int64)
    return x, y
