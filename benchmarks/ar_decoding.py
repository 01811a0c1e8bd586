"""Benchmark batched KV-cache action decoding of the OpenVLA-style policy on the CPU.

For each setting, all ``batch`` envs' action tokens are decoded greedily two
ways and checked to agree token for token:

- **re-run**: for every action token the whole sequence (images, prompt and
  the tokens so far) goes through the model again (no cache);
- **KV cache**: one prefill pass over the batch's prompts, then one
  single-token pass per action token (what :meth:`AutoregressiveVLAPolicy.act` does).

It also times ``act`` (explore: decoding, sampling, value head, action
de-normalization) and ``evaluate`` (the teacher-forced re-scoring PPO runs).
Models are random LLaVAs (SigLIP + Llama) built offline; the "openvla-shaped"
setting keeps OpenVLA's proportions (256 image tokens, ~20 prompt tokens,
7 action tokens per step) at a width a CPU can run.

Run::

    OMP_NUM_THREADS=1 python benchmarks/ar_decoding.py [--batch 16] [--repeats 3] [--quick] [--clock wall]

Prints and publishes a markdown table (``benchmarks/harness.py``). Timings are medians in milliseconds on one thread,
by default of this thread's CPU time (``--clock wall`` for elapsed time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import harness
import torch

from policies.autoregressive import AutoregressiveVLAConfig, AutoregressiveVLAPolicy, TinyVLMConfig, decode
from policies.base import ActMode

TASKS = ("pick up the red cube", "open the top drawer of the cabinet", "push the block to the target",
         "put the bowl on the plate")


@dataclass(frozen=True)
class Setting:
    """One benchmark row: model sizes and the decoding shape."""

    name: str
    tiny: TinyVLMConfig
    image: int  # env image side; also the vision tower's input side
    action_dim: int
    chunk_size: int


def settings(quick: bool) -> list[Setting]:
    """The benchmarked configurations (``quick``: only the smallest two)."""
    test_model = TinyVLMConfig()
    shaped = TinyVLMConfig(text_hidden_size=256, text_layers=4, text_heads=8, text_kv_heads=8,
                           vision_hidden_size=128, vision_layers=2, vision_heads=4, vision_image_size=128,
                           patch_size=8)
    rows = [
        Setting("test model (16 img tok)", test_model, 32, 7, 1),
        Setting("test model, chunk 4", test_model, 32, 7, 4),
        Setting("openvla-shaped (256 img tok)", shaped, 128, 7, 1),
        Setting("openvla-shaped, chunk 4", shaped, 128, 7, 4),
    ]
    return rows[:2] if quick else rows


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def median_ms(fn: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    """Median time of ``fn`` in ms over ``repeats`` runs (callers warm up first)."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append((clock() - start) * 1000)
    return statistics.median(times)


def run(setting: Setting, batch: int, repeats: int, clock: Callable[[], float]) -> dict[str, float | int | str]:
    """Time one setting; raises AssertionError if the two decoders disagree."""
    config = AutoregressiveVLAConfig(tiny=setting.tiny, image_size=(setting.image, setting.image),
                                     action_dim=setting.action_dim, chunk_size=setting.chunk_size,
                                     max_text_tokens=32)
    policy = AutoregressiveVLAPolicy(config).eval()
    g = torch.Generator().manual_seed(0)
    obs = {
        "observation.images.front": torch.randint(0, 256, (batch, setting.image, setting.image, 3),
                                                  dtype=torch.uint8, generator=g),
        "task": [TASKS[i % len(TASKS)] for i in range(batch)],
    }
    prompts, pixels = policy.encode_observation(obs)
    bins = policy.action_tokenizer
    length = config.num_action_tokens

    def decoder(use_cache: bool) -> Callable[[], object]:
        def call() -> object:
            with torch.no_grad():
                return decode(policy.backbone, prompts, pixels, length, bins.first_id, bins.num_bins, greedy=True,
                              temperature=1.0, restrict=True, use_cache=use_cache)
        return call

    cached, rerun = decoder(True)(), decoder(False)()  # also the warm-up
    assert torch.equal(cached.tokens, rerun.tokens), f"{setting.name}: KV-cache and re-run decoding disagree"
    rerun_ms = median_ms(decoder(False), repeats, clock)
    cached_ms = median_ms(decoder(True), repeats, clock)
    out = policy.act(obs, ActMode.EXPLORE)
    act_ms = median_ms(lambda: policy.act(obs, ActMode.EXPLORE), repeats, clock)

    def evaluate() -> None:
        logp, _, value = policy.evaluate(obs, out.extras)
        (logp.sum() + value.sum()).backward()
        policy.zero_grad(set_to_none=True)

    evaluate()
    eval_ms = median_ms(evaluate, repeats, clock)
    params = sum(p.numel() for p in policy.parameters())
    return {
        "setting": setting.name,
        "params": params,
        "prompt": prompts.input_ids.shape[1],
        "tokens": length,
        "rerun": rerun_ms,
        "cached": cached_ms,
        "speedup": rerun_ms / cached_ms,
        "act": act_ms,
        "eval": eval_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16, help="envs decoded together")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")
    parser.add_argument("--quick", action="store_true", help="only the small test-model settings")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: this thread's CPU time (robust to other processes on a shared machine); "
                             "wall: elapsed time")
    args = harness.add_output_args(parser).parse_args()
    torch.set_num_threads(1)
    lines = [
        f"Batch {args.batch}, torch {torch.__version__}, {torch.get_num_threads()} thread, {args.clock} clock, "
        f"median of {args.repeats} runs (ms), load average {os.getloadavg()[0]:.1f}. "
        "Target: KV-cache decoding >= 5x re-running the prompt per token.",
        "",
        "| setting | params | prompt tok | action tok | re-run ms | KV-cache ms | speedup | act ms "
        "| act ms/env | evaluate+backward ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines))
    rows = []
    for setting in settings(args.quick):
        r = run(setting, args.batch, args.repeats, CLOCKS[args.clock])
        rows.append(r)
        lines.append(f"| {r['setting']} | {r['params'] / 1e6:.2f}M | {r['prompt']} | {r['tokens']} | {r['rerun']:.1f} "
                     f"| {r['cached']:.1f} | {r['speedup']:.1f}x | {r['act']:.1f} | {r['act'] / args.batch:.2f} "
                     f"| {r['eval']:.1f} |")
        print(lines[-1], flush=True)
    harness.publish("ar_decoding", args, "\n".join(lines), rows=rows)


if __name__ == "__main__":
    main()
