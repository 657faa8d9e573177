"""pipelab: learn pipeline parallelism for transformer training by running it."""
from .model import ModelConfig, ToyGPT, build_layer, build_layers, layer_costs, loss_fn
from .data import (ALPHABET, VOCAB_SIZE, decode, encode, get_batch, load_corpus,
                   split_microbatches)
from .train import evaluate, sample, train

__all__ = [
    "ModelConfig", "ToyGPT", "build_layer", "build_layers", "layer_costs", "loss_fn",
    "ALPHABET", "VOCAB_SIZE", "decode", "encode", "get_batch", "load_corpus", "split_microbatches",
    "evaluate", "sample", "train",
]
