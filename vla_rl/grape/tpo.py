"""TPO: GRAPE's trajectory-wise preference optimization, its loss and its learner.

Each round gives the learner pairs of whole trajectories of one initial state (chosen, rejected; see
:mod:`vla_rl.grape.pairs` and :mod:`vla_rl.grape.sampling`). :meth:`TPOLearner.update` first scores every
paired trajectory under the policy as it is at the start of the round, the frozen reference
``pi_ref``, then minimizes :func:`tpo_loss` over the pairs for ``epochs`` passes. ``log pi(tau)`` is the
sum over the trajectory's decisions of the policy's log-prob of its recorded sample
(:func:`vla_rl.grape.trajectory.trajectory_logp`), the same for every policy kind: the compact flow policy
and the LeRobot pi0 / pi0.5 / SmolVLA adapters re-score the recorded denoising chain (Flow-SDE /
Flow-Noise), the autoregressive policy its action tokens.

The learner needs :attr:`Needs.PREFERENCES`: each iteration it samples, scores and pairs one GRAPE round
(:func:`vla_rl.grape.sampling.preference_round`) as its :attr:`TPOLearner.sampling` says: ``vla-rl align``
(:mod:`vla_rl.grape.rounds`) sets the run's settings, ``vla-rl train --algo.type tpo`` keeps the defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from policies.base import Policy
from vla_rl.algorithms.base import IterationInputs, Learner, LearnerConfig, Needs, SmokeLimits, register_learner
from vla_rl.config import ConfigError
from vla_rl.data.chunks import ChunkDataset, cat_obs
from vla_rl.grape.sampling import RoundData, RoundSampling, preference_round
from vla_rl.grape.trajectory import PreferencePair, Trajectory, trajectory_logp


def tpo_loss(
    logp_chosen: torch.Tensor,
    logp_rejected: torch.Tensor,
    ref_logp_chosen: torch.Tensor,
    ref_logp_rejected: torch.Tensor,
    beta: float,
    chosen_penalty: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRAPE trajectory-wise preference loss (DPO over whole trajectories).

    ::

        rho_w = beta * (log pi(tau_w) - log pi_ref(tau_w))
        rho_l = beta * (log pi(tau_l) - log pi_ref(tau_l))
        drop  = max(0, log pi_ref(tau_w) - log pi(tau_w))
        loss  = mean(-log sigmoid(rho_w - rho_l - beta * chosen_penalty * drop))

    With ``chosen_penalty = 0`` this is GRAPE's loss. DPO's margin also grows when both trajectories
    become less likely, the rejected one faster; ``chosen_penalty > 0`` (DPO-Positive, Pal et al.,
    2024, who use 50) charges every nat the chosen trajectory loses against the reference, so the
    margin has to come from the rejected one or from the chosen one rising.

    Args:
        logp_chosen: ``float [P]`` trajectory log-prob (sum over steps) of each
            preferred trajectory under the current policy (differentiable).
        logp_rejected: ``float [P]`` same for the rejected trajectory of each pair.
        ref_logp_chosen: ``float [P]`` chosen trajectories under the reference policy.
        ref_logp_rejected: ``float [P]`` rejected trajectories under the reference policy.
        beta: inverse temperature ``> 0`` (0.1 in GRAPE).
        chosen_penalty: ``lambda >= 0`` of the chosen trajectory's likelihood drop (0: GRAPE).

    Returns:
        ``(loss, stats)``: 0-dim loss and detached 0-dim stats ``tpo_loss``,
        ``reward_chosen`` (mean ``rho_w``), ``reward_rejected`` (mean ``rho_l``),
        ``reward_margin`` (mean ``rho_w - rho_l``), ``accuracy`` (fraction of
        pairs with ``rho_w > rho_l``), ``chosen_drop`` (mean ``drop``, nats).

    Raises:
        ValueError: if the inputs are not equal-shape 1-D float tensors, ``beta <= 0`` or
            ``chosen_penalty < 0``.
    """
    named = {"logp_rejected": logp_rejected, "ref_logp_chosen": ref_logp_chosen, "ref_logp_rejected": ref_logp_rejected}
    for name, x in {"logp_chosen": logp_chosen, **named}.items():
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a floating-point tensor, got {got}")
        if x.shape != logp_chosen.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} must equal logp_chosen shape {tuple(logp_chosen.shape)}")
    if logp_chosen.dim() != 1 or logp_chosen.numel() == 0:
        raise ValueError(f"logp_chosen must be [P] (one log-prob per pair), got shape {tuple(logp_chosen.shape)}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not chosen_penalty >= 0:
        raise ValueError(f"chosen_penalty must be >= 0, got {chosen_penalty}")
    reward_chosen = beta * (logp_chosen - ref_logp_chosen)
    reward_rejected = beta * (logp_rejected - ref_logp_rejected)
    margin = reward_chosen - reward_rejected
    drop = (ref_logp_chosen - logp_chosen).clamp(min=0)
    loss = -F.logsigmoid(margin - beta * chosen_penalty * drop).mean()
    with torch.no_grad():
        stats = {
            "tpo_loss": loss.detach(),
            "reward_chosen": reward_chosen.detach().mean(),
            "reward_rejected": reward_rejected.detach().mean(),
            "reward_margin": margin.detach().mean(),
            "accuracy": (margin.detach() > 0).to(margin.dtype).mean(),
            "chosen_drop": drop.detach().mean(),
        }
    return loss, stats


@dataclass
class TPOConfig(LearnerConfig):
    """GRAPE's trajectory-wise preference optimization (the module doc)."""

    preference: bool = True
    """The preference loss (:func:`tpo_loss`). False is an ablation: the rejected trajectories go unused and only
    the other terms (``chosen_nll``, ``chosen_bc``, ``demo_bc``) train, on the same pairs' chosen trajectories in
    the same steps, which asks what ranking successes above failures adds to imitating the successes."""
    beta: float = 0.1
    """Inverse temperature of the preference loss (GRAPE: 0.1)."""
    chosen_penalty: float = 0.0
    """DPO-Positive's ``lambda``: every nat of log-likelihood a chosen trajectory loses against the reference
    counts this much against its pair's margin (:func:`tpo_loss`); 0 is GRAPE's loss. Pure TPO on a flow policy's
    denoising chains widens the margin by making both trajectories less likely, the chosen one included, which
    moves the policy away from what succeeded (docs/training.md, GRAPE)."""
    chosen_nll: float = 0.0
    """RPO's ``alpha`` (Pang et al., 2024): adds ``alpha`` times the chosen trajectory's negative log-likelihood per
    decision (its recorded denoising chain or action tokens) to the loss, so the chosen trajectories are pulled up,
    not only kept from falling (``chosen_penalty``); 0 is GRAPE's loss."""
    nll_successes_only: bool = False
    """Apply ``chosen_nll`` only to chosen trajectories that succeeded. A pair of two failures (a clean one over a
    colliding one, with ``grape.pair_single_outcome``) then only orders them: the policy is pushed away from the
    worse failure without being taught to imitate the better one."""
    chosen_bc: float = 0.0
    """Adds this times the policy's own supervised loss (``sft_loss``, flow matching) on the executed action chunks
    of the chosen trajectories that succeeded. ``chosen_nll`` pulls up a flow policy's recorded denoising chain,
    exploration noise included; this imitates the actions the chain produced, as pre-training and ``filtered_bc``
    do; for the autoregressive policy it is the cross-entropy of the executed action tokens at temperature 1
    (OpenVLA's fine-tuning loss). A policy without a supervised loss is refused. 0 is GRAPE's loss."""
    demos: str = ""
    """Demo LeRobotDataset for ``demo_bc``; ``vla-rl align`` defaults it to the demos its ``--policy.path`` was
    pre-trained on (``sft.json``'s ``dataset``, written by ``vla-rl sft`` and the quickstart)."""
    demo_bc: float = 0.0
    """Adds this times the policy's supervised loss on ``demo_batch`` rows of ``demos`` to every step: the
    pre-training mix of InstructGPT's PPO-ptx, here against preference optimization drifting off what pre-training
    taught (``filtered_bc`` mixes its demos the same way). Needs ``demos`` and a policy with a supervised loss.
    0 is GRAPE's loss."""
    demo_batch: int = 16
    """Demo rows per step with ``demo_bc``."""
    replay_rounds: int = 0
    """``vla-rl align`` only: ``chosen_bc`` also imitates the successes sampled in this many earlier rounds,
    ``replay_batch`` of them drawn afresh each step, read back from the rounds' ``trajectories.pt``. A round's
    update otherwise sees the successes of its own ``states_per_round`` initial states only; ``filtered_bc``
    imitates every success of the run (its buffer). 0 is GRAPE's loss; needs ``chosen_bc`` > 0."""
    replay_batch: int = 4
    """Earlier rounds' successes per step with ``replay_rounds``."""
    lr: float = 1e-5
    """Learning rate of the policy parameters (AdamW)."""
    bc_lr: float = 0.0
    """With ``chosen_bc`` or ``demo_bc``: their imitation loss gets its own AdamW at this rate, stepped after each
    preference step on the same parameters, instead of joining the preference loss at ``lr``. Adam's step size
    does not grow with a loss weight, so a weight cannot give the imitation ``filtered_bc``'s rate (1e-3) while the
    preference loss keeps its small one. 0 keeps one optimizer and one loss."""
    epochs: int = 4
    """Passes over a round's pairs."""
    pairs_per_step: int = 4
    """Pairs per gradient step."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip of the policy parameters."""
    states_per_iter: int = 4
    """``vla-rl train --algo.type tpo`` only: initial states sampled per iteration (``vla-rl align``: its
    ``states_per_round``)."""
    seed: int = 0
    """Seed of the pair shuffling."""

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"algo.beta must be > 0, got {self.beta}")
        for name in ("epochs", "pairs_per_step", "states_per_iter", "demo_batch", "replay_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"algo.lr must be > 0, got {self.lr}")
        if self.bc_lr < 0:
            raise ValueError(f"algo.bc_lr must be >= 0, got {self.bc_lr}")
        if self.bc_lr and self.chosen_bc == 0 and self.demo_bc == 0:
            raise ValueError(f"algo.bc_lr={self.bc_lr} is the rate of the imitation terms: set algo.chosen_bc or "
                             "algo.demo_bc > 0")
        for name in ("chosen_penalty", "chosen_nll", "chosen_bc", "demo_bc"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"algo.{name} must be >= 0, got {getattr(self, name)}")
        if not self.preference:
            if self.chosen_penalty:
                raise ValueError(f"algo.chosen_penalty={self.chosen_penalty} is part of the preference loss, which "
                                 "algo.preference false drops")
            if self.chosen_nll == 0 and self.chosen_bc == 0 and self.demo_bc == 0:
                raise ValueError("algo.preference false leaves nothing to train: set algo.chosen_nll, "
                                 "algo.chosen_bc or algo.demo_bc > 0")
        if self.demos and self.demo_bc == 0:
            raise ValueError(f"algo.demos={self.demos!r} is read only with algo.demo_bc > 0 (got 0)")
        if self.replay_rounds < 0:
            raise ValueError(f"algo.replay_rounds must be >= 0, got {self.replay_rounds}")
        if self.replay_rounds and self.chosen_bc == 0:
            raise ValueError(f"algo.replay_rounds={self.replay_rounds} adds earlier successes to chosen_bc's "
                             "imitation: set algo.chosen_bc > 0")

    def smoke(self, limits: SmokeLimits, num_envs: int) -> tuple[LearnerConfig, int]:
        return dataclasses.replace(self, epochs=1, states_per_iter=1), min(num_envs, limits.max_envs)


@register_learner("tpo", TPOConfig, help="GRAPE trajectory-wise preference optimization over paired rollouts")
class TPOLearner(Learner):
    """TPO on a round's preference pairs against the policy at the round's start (see the module doc)."""

    needs = Needs.PREFERENCES
    uses_critic = False
    cfg: TPOConfig

    def __init__(self, cfg: TPOConfig, policy: Policy) -> None:
        super().__init__(cfg, policy)
        for name in ("chosen_bc", "demo_bc"):
            if getattr(cfg, name) > 0 and type(policy).sft_loss is Policy.sft_loss:
                raise ConfigError(f"algo.{name} needs a policy with a supervised loss; {type(policy).__name__} has "
                                 f"none (set algo.{name} 0)")
        if cfg.demo_bc > 0 and not cfg.demos:
            raise ConfigError("algo.demo_bc imitates demos: name their LeRobotDataset with algo.demos")
        self.optimizer = torch.optim.AdamW(policy.actor_parameters(), lr=cfg.lr, weight_decay=0.0)
        self.bc_optimizer = (torch.optim.AdamW(policy.actor_parameters(), lr=cfg.bc_lr, weight_decay=0.0)
                             if cfg.bc_lr > 0 else None)
        self._gen = torch.Generator().manual_seed(cfg.seed)
        self._demo_gen = torch.Generator().manual_seed(cfg.seed + 1)  # demo rows; the pair order stays as without
        self._replay_gen = torch.Generator().manual_seed(cfg.seed + 2)  # replayed successes, likewise
        self.demos: ChunkDataset | None = None
        self.sampling = RoundSampling(states=cfg.states_per_iter)
        """How :meth:`collect` samples a round; ``vla-rl align`` sets the run's (:mod:`vla_rl.grape.rounds`)."""

    def distribute(self, dist: Any) -> None:
        """One process only: each rank would pair its own rollouts and take a different number of steps, and the
        trajectory log-likelihoods run many forwards per step; neither suits DDP's gradient all-reduce.

        Raises:
            ConfigError: under several processes (accelerate / torch.distributed).
        """
        if dist.enabled:
            raise ConfigError("algo.type tpo trains in one process (vla-rl align is one process too); run vla-rl "
                              "train --algo.type tpo without accelerate launch / torchrun")
        super().distribute(dist)

    def collect(self, inputs: IterationInputs) -> RoundData:
        """The iteration's round: ``inputs.data`` when it holds pairs, else one GRAPE round sampled here as
        :attr:`sampling` says, from the initial states ``inputs.seed_base + i``, with the earlier rounds' successes
        it replays.

        Raises:
            ValueError: with neither pairs nor a rollout engine.
            ConfigError: for ``replay_rounds`` without a source of earlier rounds (``vla-rl train``).
        """
        if isinstance(inputs.data, list):
            return RoundData([], inputs.data, [])
        s = self.sampling
        if self.cfg.replay_rounds and s.replay is None:
            raise ConfigError("algo.replay_rounds replays earlier rounds' successes from the round files vla-rl "
                              "align writes; vla-rl train --algo.type tpo keeps none (use vla-rl align)")
        if inputs.engine is None:
            raise ValueError("tpo: no preference pairs and no env to sample them from")
        seeds = [inputs.seed_base + i for i in range(s.states)]
        with tqdm(desc=f"round {inputs.iteration + 1} sampling", unit="traj", leave=False) as bar:
            data = preference_round(inputs.engine, seeds, s.settings, s.costs, progress=bar)
        if s.replay is not None:
            data.replay = s.replay(inputs.iteration)
        return data

    @torch.no_grad()
    def reference_logps(self, pairs: list[PreferencePair]) -> dict[int, torch.Tensor]:
        """``log pi_ref(tau)`` of every paired trajectory (by ``id(trajectory)``) under the current policy."""
        out: dict[int, torch.Tensor] = {}
        for p in pairs:
            for t in (p.chosen, p.rejected):
                if id(t) not in out:
                    out[id(t)] = trajectory_logp(self.policy, t).detach()
        return out

    def update(self, batch: RoundData | Sequence[PreferencePair]) -> dict[str, float]:
        """``epochs`` passes of :func:`tpo_loss` over the round's pairs (shuffled, ``pairs_per_step`` per step).

        ``batch``: a round (what :meth:`collect` returns) or its pairs alone. A round's ``replay`` holds earlier
        rounds' successful trajectories; with ``chosen_bc`` each step imitates ``replay_batch`` of them (drawn
        with replacement) beside its pairs' chosen successes.

        Returns ``update/<name>``: the mean of each loss statistic over the last epoch (``tpo_loss``,
        ``reward_margin``, ``accuracy``, ...) and ``pairs``; no pairs return ``{"update/pairs": 0}`` and change
        nothing.
        """
        batch, replay = (batch.pairs, batch.replay) if isinstance(batch, RoundData) else (list(batch), [])
        self.iteration += 1
        if not batch:
            return {"update/pairs": 0.0}
        was_training = self.policy.training
        self.policy.eval()  # deterministic re-scoring: the reference and the policy see the same network
        ref = self.reference_logps(batch) if self.cfg.preference else {}
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        last: dict[str, list[float]] = {}
        for _ in range(self.cfg.epochs):
            last = {}
            order = torch.randperm(len(batch), generator=self._gen).tolist()
            for a in range(0, len(order), self.cfg.pairs_per_step):
                pairs = [batch[i] for i in order[a : a + self.cfg.pairs_per_step]]
                loss, stats = self._preference(pairs, ref)
                if self.bc_optimizer is None:
                    both = _total(loss, self._imitation(pairs, replay, stats))
                    if both is not None:
                        self._step(self.optimizer, both, params)
                else:  # the preference step at lr, then the imitation step at bc_lr on the updated weights
                    if loss is not None:
                        self._step(self.optimizer, loss, params)
                    imitation = self._imitation(pairs, replay, stats)
                    if imitation is not None:
                        self._step(self.bc_optimizer, imitation, params)
                for k, v in stats.items():
                    last.setdefault(k, []).append(float(v))
        self.policy.train(was_training)
        out = {f"update/{k}": sum(v) / len(v) for k, v in last.items()}
        out["update/pairs"] = float(len(batch))
        if replay and self.cfg.chosen_bc > 0:
            out["update/replay_pool"] = float(len(replay))
        return out

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer] if self.bc_optimizer is None else [self.optimizer, self.bc_optimizer]

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: list[torch.Tensor]) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        optimizer.step()

    def _preference(self, pairs: list[PreferencePair], ref: dict[int, torch.Tensor]
                    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """``tpo_loss`` (without ``preference``, none) plus ``chosen_nll`` for one step, and their statistics; None
        when neither applies to these pairs."""
        loss: torch.Tensor | None = None
        stats: dict[str, torch.Tensor] = {}
        if not self.cfg.preference and self.cfg.chosen_nll == 0:
            return loss, stats
        lc = torch.stack([trajectory_logp(self.policy, p.chosen) for p in pairs])
        if self.cfg.preference:
            lr = torch.stack([trajectory_logp(self.policy, p.rejected) for p in pairs])
            rc = torch.stack([ref[id(p.chosen)] for p in pairs]).to(lc)
            rr = torch.stack([ref[id(p.rejected)] for p in pairs]).to(lr)
            loss, stats = tpo_loss(lc, lr, rc, rr, self.cfg.beta, self.cfg.chosen_penalty)
        if self.cfg.chosen_nll > 0:
            decisions = torch.tensor([float(len(p.chosen.actions)) for p in pairs]).to(lc)
            per_decision = lc / decisions
            if self.cfg.nll_successes_only:
                per_decision = per_decision[torch.tensor([p.chosen.success for p in pairs])]
            if per_decision.numel():
                nll = -per_decision.mean()
                loss = _total(loss, self.cfg.chosen_nll * nll)
                stats["chosen_nll"] = nll.detach()
        return loss, stats

    def _imitation(self, pairs: list[PreferencePair], replay: list[Trajectory] | None,
                   stats: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """``chosen_bc`` and ``demo_bc``'s weighted sum for one step (their values into ``stats``); None with
        neither term."""
        total: torch.Tensor | None = None
        if self.cfg.chosen_bc > 0:
            bc = self._chosen_bc([p.chosen for p in pairs] + self._replayed(replay or []))
            if bc is not None:
                total = self.cfg.chosen_bc * bc
                stats["chosen_bc"] = bc.detach()
        if self.cfg.demo_bc > 0:
            demo = self._demo_rows().sample(self.cfg.demo_batch, self._demo_gen)
            bc = self.policy.sft_loss(demo.obs, demo.actions, demo.mask)
            total = _total(total, self.cfg.demo_bc * bc)
            stats["demo_bc"] = bc.detach()
        return total

    def _demo_rows(self) -> ChunkDataset:
        """``cfg.demos`` as chunks of the policy's inputs, read once."""
        if self.demos is None:
            from vla_rl.data.dataset import load_policy_chunks

            self.demos = load_policy_chunks(self.cfg.demos, self.policy)
        return self.demos

    def _replayed(self, pool: list[Trajectory]) -> list[Trajectory]:
        """``replay_batch`` trajectories of ``pool`` (with replacement); none from an empty pool."""
        if not pool:
            return []
        picks = torch.randint(len(pool), (self.cfg.replay_batch,), generator=self._replay_gen)
        return [pool[i] for i in picks.tolist()]

    def _chosen_bc(self, chosen: list[Trajectory]) -> torch.Tensor | None:
        """The policy's ``sft_loss`` on the executed chunks of the successful ``chosen``, weighted by decisions;
        None when none succeeded."""
        wins = [t for t in chosen if t.success]
        if not wins:
            return None
        # one batch of every decision: sft_loss is a mean over rows, so this is the decision-weighted mean of the
        # per-trajectory losses, in one forward pass instead of one per trajectory
        return self.policy.sft_loss(cat_obs([t.obs for t in wins]), torch.cat([t.actions for t in wins]))

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["generator"] = self._gen.get_state()
        out["demo_generator"] = self._demo_gen.get_state()
        out["replay_generator"] = self._replay_gen.get_state()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "generator" in state:
            self._gen.set_state(state["generator"])
        if "demo_generator" in state:
            self._demo_gen.set_state(state["demo_generator"])
        if "replay_generator" in state:
            self._replay_gen.set_state(state["replay_generator"])


def _total(*terms: torch.Tensor | None) -> torch.Tensor | None:
    """The sum of the loss terms that apply (not None); None when none does."""
    present = [t for t in terms if t is not None]
    return sum(present[1:], present[0]) if present else None
