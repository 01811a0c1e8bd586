"""Building blocks of the compact flow VLA: image encoder, prefix encoder, action expert.

Layout (pi0 at small scale): a prefix of image tokens (one small CNN per
camera, pooled to a grid of tokens) and one instruction token goes through a
small transformer encoder once per observation; the action expert is a small
transformer over ``[state token, H action tokens]`` (each action token fuses the
noisy action with a sinusoidal embedding of the flow time t) that
cross-attends to the prefix, and a linear head maps its output to the velocity.

The prefix is the same for all K denoising steps of one observation, so the
cross-attention keys and values are projected once (:meth:`ActionExpert.memory`)
and reused by every step; at K=4 with two cameras that is most of the expert's
work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from policies.base import masked_mse


def sinusoidal_time_embedding(t: Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> Tensor:
    """Sine-cosine embedding ``[B] -> [B, dim]`` of flow times in ``[0, 1]`` (periods as in pi0).

    Raises:
        ValueError: if ``dim`` is odd or ``t`` is not 1-D.
    """
    if dim % 2:
        raise ValueError(f"time embedding dim must be even, got {dim}")
    if t.ndim != 1:
        raise ValueError(f"t must be [B], got {list(t.shape)}")
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float32, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t.float()[:, None] * (2.0 * math.pi / period)[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


class ImageEncoder(nn.Module):
    """Small CNN ``uint8 [B, H, W, 3] -> [B, T*T, width]`` tokens for one camera.

    Args:
        channels: conv channels, each conv has stride 2.
        grid: the feature map is average-pooled to ``grid x grid`` tokens.
        width: token width.
        keypoints: K extra tokens from a spatial softmax over K learned feature
            maps: each token embeds the expected image coordinates ``(x, y)`` of
            its map, which localizes small objects far more precisely than
            pooled features (0 disables).
        film_dim: width of a conditioning vector (the instruction embedding) that
            FiLM-modulates every conv block, ``h <- h * (1 + gamma) + beta`` (as
            RT-1 conditions its image encoder on language); the keypoint maps can
            then follow the object the instruction names. 0 disables. The
            modulation starts at identity (zero-initialized).
    """

    def __init__(self, channels: tuple[int, ...], grid: int, width: int, keypoints: int = 0, film_dim: int = 0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        self.film = nn.ModuleList() if film_dim else None
        c_in = 3
        for i, c in enumerate(channels):
            k = 5 if i == 0 else 3
            conv = nn.Conv2d(c_in, c, k, stride=2, padding=k // 2)
            self.blocks.append(nn.Sequential(conv, nn.GroupNorm(min(8, c), c)))
            if self.film is not None:
                film = nn.Linear(film_dim, 2 * c)
                nn.init.zeros_(film.weight)
                nn.init.zeros_(film.bias)
                self.film.append(film)
            c_in = c
        self.pool = nn.AdaptiveAvgPool2d(grid)
        self.proj = nn.Linear(c_in, width)
        self.pos = nn.Parameter(torch.randn(grid * grid, width) * 0.02)
        self.keypoints = keypoints
        if keypoints:
            self.kp_maps = nn.Conv2d(c_in, keypoints, 1)
            self.kp_proj = nn.Linear(2, width)
            self.kp_embed = nn.Parameter(torch.randn(keypoints, width) * 0.02)

    def forward(self, images: Tensor, cond: Tensor | None = None) -> Tensor:
        """Encode ``uint8 [B, H, W, 3]`` RGB images (FiLM-conditioned on ``cond [B, film_dim]``) to tokens.

        Returns:
            ``[B, grid^2 (+ keypoints), width]``.
        """
        # channels-first in memory: the permuted view is channels-last, which the convs keep, and GroupNorm's CPU
        # kernels are about 10x slower on channels-last maps (a PPO update step about 12% slower in all;
        # docs/results.md, "Training throughput")
        features = (images.permute(0, 3, 1, 2).float() / 127.5 - 1.0).contiguous()
        for i, block in enumerate(self.blocks):
            features = block(features)
            if self.film is not None:
                if cond is None:
                    raise ValueError("this image encoder is FiLM-conditioned: pass cond")
                gamma, beta = self.film[i](cond)[:, :, None, None].chunk(2, dim=1)
                features = features * (1.0 + gamma) + beta
            features = F.silu(features)
        tokens = self.proj(self.pool(features).flatten(2).transpose(1, 2)) + self.pos
        if not self.keypoints:
            return tokens
        return torch.cat([tokens, self.kp_proj(spatial_softmax(self.kp_maps(features))) + self.kp_embed], dim=1)


def spatial_softmax(maps: Tensor) -> Tensor:
    """Expected ``(x, y)`` in ``[-1, 1]`` of a softmax over each map: ``[B, K, H, W] -> [B, K, 2]``."""
    b, k, h, w = maps.shape
    attn = maps.flatten(2).softmax(-1).view(b, k, h, w)
    ys = torch.linspace(-1.0, 1.0, h, device=maps.device)
    xs = torch.linspace(-1.0, 1.0, w, device=maps.device)
    return torch.stack([(attn.sum(2) * xs).sum(-1), (attn.sum(3) * ys).sum(-1)], dim=-1)


class ActionExpert(nn.Module):
    """The flow-matching action expert: ``(state, x_t, t, prefix) -> (velocity, features)``.

    Args:
        state_dim: S.
        action_dim: A.
        horizon: H.
        width: token width.
        heads: attention heads.
        layers: transformer decoder layers.
        global_cond: add an MLP of ``[state token, mean prefix token]`` to every action
            token. Without this direct path the observation reaches the actions only
            through attention, which few-shot SFT learns too slowly: the sampler then
            draws from the marginal action distribution and ignores where the object is.
    """

    def __init__(
        self, state_dim: int, action_dim: int, horizon: int, width: int, heads: int, layers: int,
        global_cond: bool = True,
    ) -> None:
        super().__init__()
        self.width = width
        self.state_proj = nn.Linear(state_dim, width)
        self.cond_mlp = (
            nn.Sequential(nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, width)) if global_cond else None
        )
        self.action_in = nn.Linear(action_dim, width)
        self.action_time_mlp = nn.Sequential(nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, width))
        self.pos = nn.Parameter(torch.randn(horizon + 1, width) * 0.02)
        layer = nn.TransformerDecoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, layers, norm=nn.LayerNorm(width))
        self.action_out = nn.Linear(width, action_dim)

    def memory(self, prefix: Tensor) -> ExpertMemory:
        """Project the prefix into every layer's cross-attention keys and values (once per observation)."""
        w = self.width
        heads = self.decoder.layers[0].multihead_attn.num_heads
        kv = []
        for layer in self.decoder.layers:
            attn = layer.multihead_attn
            k = F.linear(prefix, attn.in_proj_weight[w : 2 * w], attn.in_proj_bias[w : 2 * w])
            v = F.linear(prefix, attn.in_proj_weight[2 * w :], attn.in_proj_bias[2 * w :])
            kv.append((_split_heads(k, heads), _split_heads(v, heads)))
        return ExpertMemory(prefix_mean=prefix.mean(1), kv=kv)

    def forward(self, state: Tensor, x_t: Tensor, t: Tensor, prefix: Tensor | ExpertMemory) -> tuple[Tensor, Tensor]:
        """One expert pass.

        Args:
            state: ``[B, S]`` normalized state.
            x_t: ``[B, H, A]`` noisy actions.
            t: ``[B]`` flow times.
            prefix: ``[B, N, width]`` encoded prefix tokens, or their :meth:`memory` (reused across steps).

        Returns:
            ``(velocity [B, H, A], features [B, H, width])``.
        """
        mem = prefix if isinstance(prefix, ExpertMemory) else self.memory(prefix)
        act = self.action_in(x_t)
        time = sinusoidal_time_embedding(t, self.width)[:, None, :].expand_as(act)
        act = self.action_time_mlp(torch.cat([act, time], dim=-1))
        state_tok = self.state_proj(state)
        if self.cond_mlp is not None:
            act = act + self.cond_mlp(torch.cat([state_tok, mem.prefix_mean], dim=-1))[:, None, :]
        x = torch.cat([state_tok[:, None, :], act], dim=1) + self.pos
        w = self.width
        for layer, (k, v) in zip(self.decoder.layers, mem.kv, strict=True):
            # nn.TransformerDecoderLayer (norm_first, no dropout, no masks) with the keys/values precomputed
            h = layer.norm1(x)
            x = x + layer.self_attn(h, h, h, need_weights=False)[0]
            attn = layer.multihead_attn
            q = _split_heads(F.linear(layer.norm2(x), attn.in_proj_weight[:w], attn.in_proj_bias[:w]), attn.num_heads)
            o = F.scaled_dot_product_attention(q, k, v)
            x = x + attn.out_proj(o.transpose(1, 2).flatten(2))
            x = x + layer.linear2(layer.activation(layer.linear1(layer.norm3(x))))
        features = self.decoder.norm(x)[:, 1:]
        return self.action_out(features), features


@dataclass
class ExpertMemory:
    """What the action expert needs from a prefix, computed once for all denoising steps.

    Attributes:
        prefix_mean: ``[B, width]`` mean prefix token (global conditioning).
        kv: per decoder layer, the cross-attention keys and values ``[B, heads, N, width / heads]``.
    """

    prefix_mean: Tensor
    kv: list[tuple[Tensor, Tensor]]


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """``[B, L, D] -> [B, heads, L, D / heads]``."""
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)


class PrefixEncoder(nn.Module):
    """Images + instruction embedding ``-> [B, N, width]`` prefix tokens.

    Args:
        num_cameras: number of cameras (one CNN each).
        channels, grid, keypoints: CNN settings (see :class:`ImageEncoder`).
        film: FiLM-condition every CNN on the instruction embedding.
        text_dim: width of the instruction embedding.
        width, heads, layers: the prefix transformer.
    """

    def __init__(
        self, num_cameras: int, channels: tuple[int, ...], grid: int, text_dim: int, width: int, heads: int,
        layers: int, keypoints: int = 0, film: bool = False,
    ) -> None:
        super().__init__()
        film_dim = text_dim if film else 0
        self.cameras = nn.ModuleList(
            ImageEncoder(channels, grid, width, keypoints, film_dim) for _ in range(num_cameras)
        )
        self.camera_embed = nn.Parameter(torch.randn(num_cameras + 1, width) * 0.02)
        self.text_proj = nn.Linear(text_dim, width)
        self.encoder: nn.Module
        if layers > 0:
            layer = nn.TransformerEncoderLayer(
                width, heads, dim_feedforward=4 * width, dropout=0.0, activation="gelu", batch_first=True,
                norm_first=True,
            )
            self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(width), enable_nested_tensor=False)
        else:
            self.encoder = nn.LayerNorm(width)

    def forward(self, images: list[Tensor], text: Tensor) -> Tensor:
        """Encode per-camera ``uint8 [B, H, W, 3]`` images and ``text [B, text_dim]`` to ``[B, N, width]``."""
        pairs = enumerate(zip(self.cameras, images, strict=True))
        tokens = [enc(img, text) + self.camera_embed[i] for i, (enc, img) in pairs]
        tokens.append((self.text_proj(text) + self.camera_embed[-1])[:, None, :])
        return self.encoder(torch.cat(tokens, dim=1))


def flow_matching_loss(velocity: Tensor, noise: Tensor, actions: Tensor, mask: Tensor | None = None) -> Tensor:
    """The conditional flow-matching loss ``mean |v - (noise - actions)|^2``.

    ``velocity`` is the model's ``v(x_t, t, obs)`` at ``x_t = t noise + (1 - t) actions``
    (pi0 convention: ``t = 1`` is noise), whose time derivative ``noise - actions``
    is the regression target. The mean runs over the action dims of every valid step.

    Args:
        velocity: ``[B, H, A]`` predicted velocity (differentiable).
        noise, actions: ``[B, H, A]`` the noise ``x_1`` and the clean action chunk ``x_0``.
        mask: optional ``[B, H]`` bool of valid action steps; padded steps count neither
            in the loss nor in its gradient, even when they hold ``nan``.

    Returns:
        Scalar loss (0 when the mask selects nothing).
    """
    return masked_mse(velocity, noise - actions, mask)
