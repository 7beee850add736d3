"""Checks a prunemem compressed save against the compressed-tensors package
(0.14.0; 0.14.x are the last releases with its sparse compressors, 0.15.0
has none), once, by hand:

    pip install --target /tmp/ct compressed-tensors==0.14.0 loguru psutil --no-deps
    PYTHONPATH=/tmp/ct python3 scripts/reference/verify_compressed.py COMPRESSED_DIR DENSE_DIR

- ModelCompressor reads COMPRESSED_DIR's config.json and its sparsity
  compressor decompresses every weight: each must equal DENSE_DIR's tensor
  (prunemem's `--save-format dense` of the same run) exactly;
- the package's own compressor applied to DENSE_DIR's weights must produce
  the same tensors prunemem wrote (values, bitmask, row offsets, shape).
Prints one JSON line.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file

from compressed_tensors import ModelCompressor
from compressed_tensors.compressors.sparse_compressors.sparse_bitmask import BitmaskTensor
from compressed_tensors.compressors.sparse_compressors.sparse_24_bitmask import Sparse24BitMaskTensor

comp_dir, dense_dir = sys.argv[1], sys.argv[2]


def load_dir(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


dense = load_dir(dense_dir)
stored = load_dir(comp_dir)
mc = ModelCompressor.from_pretrained(comp_dir)
fmt = mc.sparsity_config.format
decompressed = dict(mc.sparsity_compressor.decompress(comp_dir))
mismatch = [n for n, t in dense.items() if n not in decompressed or not torch.equal(decompressed[n], t)]
extra = [n for n in decompressed if n not in dense]

same_layout, checked = 0, 0
for name, t in dense.items():
    prefix = name[: -len(".weight")]
    if f"{prefix}.compressed" not in stored:
        continue
    checked += 1
    if fmt == "sparse-bitmask":
        ref = BitmaskTensor.from_dense(t).dict(name_prefix=prefix)
    else:
        ref = Sparse24BitMaskTensor.from_dense(t).dict(name_prefix=prefix)
    ok = all(torch.equal(ref[k].to(stored[k].dtype), stored[k]) and ref[k].shape == stored[k].shape
             for k in ref)
    same_layout += ok

print(json.dumps({
    "format": fmt,
    "global_sparsity": mc.sparsity_config.global_sparsity,
    "tensors": len(dense),
    "decompressed_equal": len(dense) - len(mismatch),
    "mismatched": mismatch[:5],
    "extra": extra[:5],
    "compressed_weights": checked,
    "same_as_package_compressor": same_layout,
}))
