"""Train the tiny model on the course's own prose, on CPU, in a few minutes.

Retrain (rewrites ``assets/tiny_model/weights.pt`` and ``config.json``)::

    python -m kvlab.models.tiny.train            # the shipped recipe; --help for the knobs

The corpus is what the repository already holds, so nothing is downloaded: the markdown cells of
``solutions/*.ipynb``, ``README.md`` and the docstrings of the ``kvlab`` modules (about 170 KB of
English, the last 5% held out). The recipe: 1,000 AdamW steps of 8 random 256-byte windows
(about 2M bytes, a dozen passes over the corpus), about 4.5 minutes on two CPU cores. The run is
deterministic for a given corpus, seed and thread count (two, as on the course's CPU machines);
the corpus grows with the course, so ``config.json`` records its size and SHA-256 beside the
recipe, the final losses and the wall time, and a retrained model can be told from the shipped
one. The model learns the course's vocabulary and phrasing, not facts, and greedy decoding soon
loops on its favourite phrases: it is here to push legible tokens through a real KV cache.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kvlab.core import files
from kvlab.models.tiny.model import TinyConfig, TinyLlama, save_model

PURPOSE = "python -m kvlab.models.tiny.train (it reads solutions/ and README.md)"


def checkout_out() -> Path:
    """Where retrained weights go: the checkout's ``assets/tiny_model``."""
    return files.checkout_path("assets", "tiny_model", purpose=PURPOSE)


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [
        n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
    ]
    return [d for d in (ast.get_docstring(n) for n in nodes) if d]


def corpus_text(repo: Path | None = None) -> str:
    """The training text: solution notebooks' markdown, the README, kvlab's docstrings (this
    package's own excluded, so editing it does not change the corpus), in a fixed order. Read
    from the checkout (``repo``), since a wheel carries no solutions."""
    repo = files.checkout_path(purpose=PURPOSE) if repo is None else Path(repo)
    parts = []
    for notebook in sorted((repo / "solutions").glob("*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        parts += ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    parts.append((repo / "README.md").read_text(encoding="utf-8"))
    for module in sorted((repo / "kvlab").rglob("*.py")):
        if "tiny" not in module.relative_to(repo / "kvlab").parts:
            parts += _docstrings(module)
    return "\n\n".join(p.strip() for p in parts if p.strip()) + "\n"


def batches(data: torch.Tensor, batch_size: int, context: int, generator: torch.Generator):
    """Random windows of ``context + 1`` bytes: inputs and the same shifted by one."""
    starts = torch.randint(0, len(data) - context - 1, (batch_size,), generator=generator)
    windows = torch.stack([data[s : s + context + 1] for s in starts.tolist()])
    return windows[:, :-1].long(), windows[:, 1:].long()


@torch.no_grad()
def evaluate(model: TinyLlama, data: torch.Tensor, context: int, max_windows: int = 64) -> float:
    """Mean cross-entropy (nats per byte) over consecutive windows of ``data``."""
    model.eval()
    n = min(max_windows, (len(data) - 1) // context)
    x = torch.stack([data[i * context : i * context + context] for i in range(n)]).long()
    y = torch.stack([data[i * context + 1 : i * context + context + 1] for i in range(n)]).long()
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train()
    return loss


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    *,
    steps: int = 1000,
    batch_size: int = 8,
    lr: float = 3e-3,
    warmup: int = 50,
    seed: int = 0,
    threads: int = 2,
    config: TinyConfig | None = None,
    out: Path | None | str = "checkout",
    log_every: int = 100,
) -> tuple[TinyLlama, dict]:
    """Train from scratch; save to ``out`` (``"checkout"``: the checkout's ``assets/tiny_model``;
    None: do not save). Returns the model and the record written to ``config.json``."""
    if out == "checkout":
        out = checkout_out()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    config = config or TinyConfig()
    text = corpus_text()
    data = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)
    split = int(len(data) * 0.95)  # the last 5% is held out for the validation loss
    train_data, val_data = data[:split], data[split:]
    model = TinyLlama(config)
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    smooth = None
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, warmup)
        x, y = batches(train_data, batch_size, config.max_context, generator)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if log_every and (step + 1) % log_every == 0:
            seconds = time.perf_counter() - start
            print(f"step {step + 1:5d}/{steps}  loss {smooth:.3f}  {seconds:6.1f} s", flush=True)
    seconds = time.perf_counter() - start
    model.eval().requires_grad_(False)
    record = {
        "corpus": {
            "sources": "solutions/*.ipynb markdown cells, README.md, kvlab docstrings (not kvlab/tiny)",
            "bytes": len(data),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "held_out_bytes": len(val_data),
        },
        "recipe": {
            "steps": steps,
            "batch_size": batch_size,
            "context": config.max_context,
            "lr": lr,
            "warmup": warmup,
            "schedule": "linear warm-up, cosine decay to lr/10",
            "optimizer": "AdamW betas (0.9, 0.95), weight decay 0.1 on matrices, grad clip 1.0",
            "seed": seed,
            "threads": threads,
            "torch": torch.__version__,
        },
        "results": {
            "train_loss_smoothed": round(smooth, 4),
            "train_loss": round(evaluate(model, train_data, config.max_context), 4),
            "val_loss": round(evaluate(model, val_data, config.max_context), 4),
            "wall_seconds": round(seconds, 1),
            "num_params": model.num_params,
        },
    }
    if out is not None:
        path = save_model(model, out, record)
        record["results"]["weights_bytes"] = path.stat().st_size
        save_model(model, out, record)
    return model, record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvlab.models.tiny.train", description=__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write the weights (default: the checkout's assets/tiny_model)",
    )
    args = parser.parse_args(argv)
    try:
        files.checkout_path(purpose=PURPOSE)  # before minutes of training, not after
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    _, record = train(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        threads=args.threads,
        out=args.out or "checkout",
    )
    print(json.dumps(record["results"], indent=2))


if __name__ == "__main__":
    main()
