"""Compares the zero masks of two saved models (Hugging Face layout, any
number of safetensors shards) linear by linear: the fraction of positions
where both are zero or both are non-zero, and each side's sparsity, in
layer order.

    python scripts/reference/compare_masks.py REFERENCE_DIR PRUNEMEM_DIR

Needs numpy and safetensors; prunemem's tests do not use this script.
"""
import glob
import re
import sys

from safetensors.numpy import load_file


def load(d):
    out = {}
    for f in sorted(glob.glob(d + "/*.safetensors")):
        out.update(load_file(f))
    return out


def layer_of(name):
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def main(a_dir, b_dir):
    a, b = load(a_dir), load(b_dir)
    names = sorted((n for n in a if n.endswith("proj.weight") and n in b),
                   key=lambda n: (layer_of(n), n))
    for name in names:
        za, zb = a[name] == 0, b[name] == 0
        print(f"{name:45s} agree {(za == zb).mean():.6f}  sparsity {za.mean():.4f} / {zb.mean():.4f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
