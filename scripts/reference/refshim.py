"""Shims that let the Wanda authors' code (locuslab/wanda, lib/prune.py)
run unmodified on CPU with current transformers; shared by
run_reference.py and tests/fixtures/make_reference_masks.py.

- `datasets` is stubbed (their lib/data.py imports it at module level);
- decoder layers called without `position_embeddings` (their 4.x-era call)
  get them computed from `position_ids`;
- `Tensor.cuda()` is the identity (their magnitude path sorts on CUDA) and
  `torch.cuda.synchronize()` a no-op (SparseGPT times itself with it);
- `model.hf_device_map = {}` (one device).
"""
import os
import sys
import types

import torch


def import_reference(wanda_repo):
    sys.modules.setdefault("datasets", types.SimpleNamespace(load_dataset=None))
    sys.path.insert(0, os.path.abspath(wanda_repo))
    torch.Tensor.cuda = lambda self, *args, **kw: self
    torch.cuda.synchronize = lambda *args, **kw: None
    import lib.prune as P
    return P


def prepare_model(model, seqlen):
    model.seqlen = seqlen
    model.hf_device_map = {}
    rotary = model.model.rotary_emb
    layer_class = type(model.model.layers[0])  # Llama's, Mistral's, ...
    original = layer_class.forward
    if getattr(original, "_prunemem_shim", False):
        return model

    def forward(self, hidden_states, *args, position_embeddings=None, position_ids=None, **kw):
        if position_embeddings is None:
            if position_ids is None:
                position_ids = torch.arange(hidden_states.shape[1],
                                            device=hidden_states.device).unsqueeze(0)
            position_embeddings = rotary(hidden_states, position_ids)
        return original(self, hidden_states, *args, position_ids=position_ids,
                        position_embeddings=position_embeddings, **kw)

    forward._prunemem_shim = True
    layer_class.forward = forward
    return model


def loader_from_windows(windows):
    """A `get_loaders` replacement returning fixed windows (lists of ids)."""
    def get_loaders(name, nsamples=128, seed=0, seqlen=2048, tokenizer=None):
        out = []
        for w in windows[:nsamples]:
            inp = torch.tensor([w])
            tar = inp.clone()
            tar[:, :-1] = -100
            out.append((inp, tar))
        return out, None
    return get_loaders
