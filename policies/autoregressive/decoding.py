"""Batched action-token decoding with a KV cache, and teacher-forced re-scoring.

All envs' prompts are decoded together: one prefill pass over the
left-padded prompts (images included) fills the KV cache, then each of the
``L = H * A`` action tokens costs one single-token pass per batch. The
reference :func:`decode` with ``use_cache=False`` re-runs the whole sequence
(prompt, images and tokens so far) for every token; it exists to test and
benchmark the cached path, which must produce the same tokens and log-probs.

Sampling always draws from the 256 action-bin ids, so every sample decodes
to an action. The reported log-prob is either that restricted distribution's
(``restrict=True``: the exact behaviour probability) or the full-vocabulary
softmax at the chosen id (``restrict=False``: the language model's token
probability, as in VLA-RL; it is lower by the probability mass on non-action
tokens). Temperature scales the logits for sampling and for log-probs alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from policies.autoregressive.backbones import Prompts, VLMBackbone, positions_from_mask


@dataclass
class Decoded:
    """Result of decoding ``L`` action tokens for ``B`` prompts.

    Attributes:
        tokens: ``int64 [B, L]`` vocabulary ids of the action tokens.
        logp: ``float32 [B, L]`` log-prob of each token (see module doc).
        entropy: ``float32 [B, L]`` entropy of each token's distribution.
        prompt_hidden: ``[B, D]`` last-layer hidden state at the last prompt
            token (the critic's input).
    """

    tokens: Tensor
    logp: Tensor
    entropy: Tensor
    prompt_hidden: Tensor


def token_logp_entropy(
    logits: Tensor, tokens: Tensor, first_id: int, num_bins: int, temperature: float, restrict: bool
) -> tuple[Tensor, Tensor]:
    """Log-prob of ``tokens`` and entropy under ``softmax(logits / temperature)``.

    Args:
        logits: ``[..., V]`` next-token logits.
        tokens: ``int64 [...]`` chosen ids (action ids when ``restrict``).
        first_id: id of the first action token; action ids are ``first_id .. first_id + num_bins - 1``.
        num_bins: number of action ids.
        temperature: > 0.
        restrict: softmax over the action ids only (True) or the whole vocabulary.

    Returns:
        ``(logp [...], entropy [...])`` in float32.
    """
    scaled = logits.float() / temperature
    index = tokens
    if restrict:
        scaled = scaled[..., first_id : first_id + num_bins]
        index = tokens - first_id
    logprobs = F.log_softmax(scaled, dim=-1)
    logp = logprobs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return logp, entropy


def choose_tokens(
    logits: Tensor, first_id: int, num_bins: int, greedy: bool, temperature: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one action id per row from ``logits [B, V]``: argmax, or a sample at ``temperature``.

    Returns:
        ``int64 [B]`` vocabulary ids in ``[first_id, first_id + num_bins)``.
    """
    bins = logits[:, first_id : first_id + num_bins].float()
    if greedy:
        index = bins.argmax(-1)
    else:
        probs = torch.softmax(bins / temperature, dim=-1)
        index = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return first_id + index


def decode(
    backbone: VLMBackbone,
    prompts: Prompts,
    pixel_values: Tensor,
    num_tokens: int,
    first_id: int,
    num_bins: int,
    greedy: bool,
    temperature: float,
    restrict: bool,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Decoded:
    """Decode ``num_tokens`` action tokens for every prompt of the batch.

    Args:
        backbone: the vision-language model.
        prompts: left-padded prompts ``[B, P]``.
        pixel_values: the backbone's preprocessed images for the batch.
        num_tokens: L, tokens per prompt (``A`` per step, ``A * H`` per chunk).
        first_id, num_bins: the action id range.
        greedy: argmax (evaluation) instead of sampling (exploration).
        temperature: sampling and log-prob temperature, > 0.
        restrict: log-probs over the action ids only (see module doc).
        generator: RNG for sampling.
        use_cache: KV-cache decoding (True) or the re-run-everything reference (False).

    Returns:
        :class:`Decoded` (no gradients are tracked by callers that wrap this in ``no_grad``).
    """
    ids, mask = prompts.input_ids, prompts.attention_mask
    out = backbone(ids, mask, prompts.position_ids, pixel_values, keep=1, use_cache=use_cache)
    prompt_hidden = out.hidden[:, -1]
    tokens, logps, entropies = [], [], []
    next_position = prompts.position_ids[:, -1:] + 1
    for step in range(num_tokens):
        logits = out.logits[:, -1]
        token = choose_tokens(logits, first_id, num_bins, greedy, temperature, generator)
        logp, entropy = token_logp_entropy(logits, token, first_id, num_bins, temperature, restrict)
        tokens.append(token)
        logps.append(logp)
        entropies.append(entropy)
        if step == num_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        if use_cache:
            out = backbone(token.unsqueeze(1), mask, next_position, None, past=out.past, keep=1, use_cache=True)
            next_position = next_position + 1
        else:
            ids = torch.cat([ids, token.unsqueeze(1)], dim=1)
            out = backbone(ids, mask, positions_from_mask(mask), pixel_values, keep=1, use_cache=False)
    return Decoded(
        tokens=torch.stack(tokens, 1),
        logp=torch.stack(logps, 1),
        entropy=torch.stack(entropies, 1),
        prompt_hidden=prompt_hidden,
    )


def score(
    backbone: VLMBackbone,
    prompts: Prompts,
    pixel_values: Tensor,
    tokens: Tensor,
    first_id: int,
    num_bins: int,
    temperature: float,
    restrict: bool,
) -> Decoded:
    """Teacher-forced log-probs of recorded action ``tokens [B, L]`` in one differentiable pass.

    The model reads ``prompt + tokens[:, :-1]``; the logits of the last ``L``
    positions predict ``tokens``. Matches :func:`decode`'s log-probs and
    entropies for the same tokens.

    Raises:
        ValueError: if ``tokens`` and the prompts disagree on the batch size.
    """
    if tokens.ndim != 2 or tokens.shape[0] != prompts.input_ids.shape[0]:
        raise ValueError(f"score: tokens must be int64 [B={prompts.input_ids.shape[0]}, L], "
                         f"got {list(tokens.shape)}")
    length = tokens.shape[1]
    ids = torch.cat([prompts.input_ids, tokens[:, :-1]], dim=1)
    mask = torch.cat([prompts.attention_mask, prompts.attention_mask.new_ones(tokens.shape[0], length - 1)], dim=1)
    out = backbone(ids, mask, positions_from_mask(mask), pixel_values, keep=length, use_cache=False)
    logp, entropy = token_logp_entropy(out.logits, tokens, first_id, num_bins, temperature, restrict)
    return Decoded(tokens=tokens, logp=logp, entropy=entropy, prompt_hidden=out.hidden[:, 0])
