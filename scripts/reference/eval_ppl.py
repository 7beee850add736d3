"""Reference perplexity with Hugging Face transformers, same protocol as
`prunemem eval`: non-overlapping windows of SEQLEN tokens from the selected
lines of the text, per-window mean next-token loss, exp of the mean.

    python scripts/reference/eval_ppl.py MODEL_DIR TEXT [--lines first-half] [--seqlen 512] [--windows 40]

Lines keep their terminators (CRLF included) and halves split at n // 2,
exactly as prunemem's --lines does. Needs torch and transformers; prunemem's
tests do not use this script.
"""
import argparse
import json
import math
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def select(text, spec):
    lines = text.split("\n")
    lines = [l + "\n" for l in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    n = len(lines)
    if spec == "all":
        return text
    if spec == "first-half":
        return "".join(lines[: n // 2])
    if spec == "second-half":
        return "".join(lines[n // 2:])
    a, b = spec.split(":")
    return "".join(lines[int(a or 0): int(b) if b else n])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--lines", default="all")
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    text = select(open(a.text, encoding="utf-8", newline="").read(), a.lines)
    ids = tok(text, return_tensors="pt").input_ids
    n = ids.shape[1] // a.seqlen
    if a.windows:
        n = min(n, a.windows)
    t = time.time()
    losses = []
    with torch.no_grad():
        for i in range(n):
            x = ids[:, i * a.seqlen:(i + 1) * a.seqlen]
            logits = model(x).logits
            loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), x[0, 1:])
            losses.append(loss.item())
    ppl = math.exp(sum(losses) / len(losses))
    print(json.dumps({"perplexity": ppl, "windows": n, "seqlen": a.seqlen, "tokens": ids.shape[1],
                      "seconds": time.time() - t}))


if __name__ == "__main__":
    main()
