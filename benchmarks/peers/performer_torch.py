"""Peer timing: performer-pytorch ``FastAttention`` on CPU torch (run with a torch interpreter).

  /work/torchvenv/bin/python benchmarks/peers/performer_torch.py \
      --lengths 256 1024 4096 16384 [--repeats 5] [--threads 2]

Times ``FastAttention(dim_heads=64, nb_features=128, causal=...)`` forward (under
``torch.no_grad``) and forward + backward (sum of outputs, gradients for q, k, v) on
(1, 4, T, 64) float32 tensors; prints one JSON object (rows and the causal path in use).
Self-contained: it needs only torch and performer-pytorch, not rfjax or JAX.

Without the ``fast_transformers`` CUDA extension, performer-pytorch's causal mode falls back to
``causal_linear_attention_noncuda``: ``torch.chunk`` into 128 pieces (each of T / 128 rows), and
per piece the (T / 128, m, d) cumulative sum of outer products k v^T, so O(T m d) time and memory
(fully stored for the backward pass), not a quadratic (T, T) matrix.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    with contextlib.redirect_stdout(io.StringIO()) as captured:
        import performer_pytorch
        from performer_pytorch import FastAttention

        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        modules = {
            causal: FastAttention(
                dim_heads=args.head_dim, nb_features=args.features, causal=causal
            ).eval()
            for causal in (False, True)
        }
    causal_path = modules[True].causal_linear_fn
    causal_path = getattr(causal_path, "func", causal_path).__name__

    rows = []
    for length in args.lengths:
        shape = (args.batch, args.heads, length, args.head_dim)
        q, k, v = (torch.randn(shape) for _ in range(3))
        repeats = args.repeats if length <= 4096 else max(2, args.repeats // 2)
        for causal, module in modules.items():

            def forward(module=module, q=q, k=k, v=v):
                with torch.no_grad():
                    return module(q, k, v)

            def forward_backward(module=module, q=q, k=k, v=v):
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                module(qg, kg, vg).sum().backward()
                return qg.grad, kg.grad, vg.grad

            functions = {"forward": forward, "forward_backward": forward_backward}
            for fn in functions.values():
                for _ in range(3 if length <= 1024 else 1):
                    fn()  # warmup
            samples: dict[str, list[float]] = {name: [] for name in functions}
            for _ in range(repeats):
                for name, fn in functions.items():
                    start = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - start)
            for name, times in samples.items():
                rows.append(
                    {
                        "length": length,
                        "mode": "causal" if causal else "bidirectional",
                        "pass": name,
                        "median_s": statistics.median(times),
                        "min_s": min(times),
                        "repeats": repeats,
                    }
                )
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "performer_pytorch": getattr(performer_pytorch, "__version__", "1.1.4"),
                "threads": torch.get_num_threads(),
                "causal_path": causal_path,
                "import_messages": captured.getvalue().strip(),
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
