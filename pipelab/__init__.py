"""pipelab: learn pipeline parallelism for transformer training by running it."""
from .model import ModelConfig, ToyGPT, build_layer, build_layers, layer_costs, loss_fn

__all__ = [
    "ModelConfig", "ToyGPT", "build_layer", "build_layers", "layer_costs", "loss_fn",
]
