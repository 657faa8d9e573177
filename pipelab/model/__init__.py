"""Floor 1, the model: the toy GPT and everything about it that needs no pipeline.

    config.py       ModelConfig, vocabulary shards    gpt.py        the layers, ToyGPT, layer costs
    moe.py          the mixture-of-experts MLP         weight_grad.py the Linear whose W pass waits
    data.py         corpus, tokens, batches            train.py      the single-process reference
    memory.py       the byte model (activations, weights, optimizer); memory_moe.py its MoE part,
                    memory_rules.py how each action kind changes a stage's live bytes
    footprint.py    a run's memory lower bound against what the machine has
    source.py       ModelSource: what the runtime needs of any model (layers, loss, batches)
    gpt_source.py   the toy GPT as a ModelSource    custom.py     CustomModel: your own stack
    importable.py   'module:function' names resolved in the parent and in every worker
    custom_profile.py a custom model's layers timed and measured one by one (F, I, W, bytes)

Imports only `pipelab.checks` and `pipelab.support`.
"""
from .config import ModelConfig
from .gpt import (AttentionCore, Block, Embedding, Head, ToyGPT, build_layer, build_layers,
                  layer_costs, loss_fn)

__all__ = ["ModelConfig", "AttentionCore", "Block", "Embedding", "Head", "ToyGPT", "build_layer",
           "build_layers", "layer_costs", "loss_fn"]
