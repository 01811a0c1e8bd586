"""Two processes on the CPU (gloo) train as one: DDP on two half-batches equals one process on the whole batch.

The tolerance is 2e-6 absolute on every parameter after one update (Adam moves a weight by up to the
learning rate, 3e-4 to 1e-3 here): the two runs add the same per-sample gradients in a different order (half-batch means,
then the all-reduce average), which changes float32 sums in their last bits (and Adam's eps is raised, see ddp_equivalence.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vla_rl.algorithms.advantages import normalize_advantages
from vla_rl.config import ConfigError
from vla_rl.distributed import SINGLE, Distributed, rank_seed
from tests.vla_rl import ddp_equivalence

ROOT = Path(__file__).resolve().parents[2]
ATOL = 2e-6


def _two_ranks(script_args: list[str], tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *script_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # ~35 s each: two ranks import torch, build an env and a policy
@pytest.mark.parametrize("kind", ["ppo", "sft"])
def test_ddp_update_on_two_half_batches_equals_one_process_on_the_whole_batch(kind: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    whole = ddp_equivalence.update(kind)
    learner, _ = ddp_equivalence.build(kind)
    start = {k: v.detach().clone() for k, v in learner.policy.state_dict().items()}
    out = tmp_path / "ddp.pt"
    proc = _two_ranks([str(ROOT / "tests" / "vla_rl" / "ddp_equivalence.py"), kind, str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = torch.load(out)
    assert ddp.keys() == whole.keys()
    moved = max(float((whole[k].float() - start[k].float()).abs().max()) for k in whole)
    assert moved > 1e-4, "the update did not move the weights: the comparison would prove nothing"
    worst = max(float((whole[k].float() - ddp[k].float()).abs().max()) for k in whole)
    assert worst <= ATOL, f"DDP parameters differ from the one-process update by {worst:.3g} (> {ATOL})"


def test_one_process_is_the_identity() -> None:
    assert not SINGLE.enabled and SINGLE.is_main and SINGLE.world_size == 1
    x = torch.arange(4.0)
    assert SINGLE.sum(x) is x and SINGLE.gather_objects([1, 2]) == [1, 2]
    assert SINGLE.merge_scalars({"a": 1.0}) == {"a": 1.0}
    assert SINGLE.env_shard(8, 5) == (8, 5) and SINGLE.seed_base(100, 8) == 100
    assert SINGLE.total(7) == 7 and SINGLE.any(True) and not SINGLE.any(False)
    assert SINGLE.rank_folder(Path("store")) == Path("store")
    SINGLE.reseed(0, lambda seed: pytest.fail("one process keeps its RNG stream"))
    adv, mask = torch.tensor([1.0, 2.0, 6.0]), torch.tensor([True, True, False])
    assert torch.equal(SINGLE.normalize_advantages(adv, mask), normalize_advantages(adv, mask))
    # one process walks its shuffled decisions once, the remainder last (no wrap-around to fill a minibatch)
    flat = torch.tensor([3, 5, 6, 8, 9])
    torch.manual_seed(0)
    batches = list(SINGLE.minibatches(flat, 5, 2))
    torch.manual_seed(0)
    perm = flat[torch.randperm(5)]
    assert [b.tolist() for b in batches] == [perm[:2].tolist(), perm[2:4].tolist(), perm[4:].tolist()]
    assert rank_seed(0, 0) != rank_seed(0, 1)


def test_accelerate_cpu_launch_that_starts_one_process_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(ConfigError, match="--multi_gpu") as err:
        Distributed.from_environment()
    assert "--mpirun_hostfile configs/accelerate/localhost.hostfile" in str(err.value)
    assert (ROOT / "configs" / "accelerate" / "localhost.hostfile").is_file()


def test_uneven_shard_names_the_field() -> None:
    class Two(Distributed):
        def __init__(self) -> None:
            super().__init__()
            self.world_size, self.rank = 2, 1

    with pytest.raises(ConfigError, match="env.num_envs=3"):
        Two().env_shard(3, 0)
    assert Two().env_shard(4, 10) == (2, 12)


LAUNCHES = {  # torchrun's code inside accelerate; accelerate's multi-CPU launch through MPICH's mpirun
    "multi_gpu": ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "29533",
                  "-m", "vla_rl"],
    "cpu_mpi": ["accelerate", "launch", "--cpu", "--num_processes", "2", "--main_process_port", "29534",
                "--mpirun_hostfile", "configs/accelerate/localhost.hostfile", "-m", "vla_rl"],
}
SMOKE = ["train", "--smoke", "true", "--env.id", "mujoco/pick-red", "--policy.type", "compact-flow", "--seed", "3"]


@pytest.mark.slow  # ~1 min each: two launches of two ranks each
@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_accelerate_launch_two_ranks_smoke_run_survives_kill_9_of_the_launcher(launch: str, tmp_path: Path) -> None:
    import json
    import signal
    import time

    import psutil

    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "ACCELERATE_USE_CPU": "false"}
    for var in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        env.pop(var, None)
    cmd = [*LAUNCHES[launch], *SMOKE, "--run_dir", str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = run_dir / "checkpoints" / "iter_000001"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), (proc.communicate()[0] or "")[-3000:] if proc.poll() is not None else "no checkpoint in time"
    ranks = psutil.Process(proc.pid).children(recursive=True)  # with MPI: mpirun, its proxy and the ranks
    for p in ranks:  # frozen mid-run, so that they cannot simply finish the last iteration before they are checked
        p.suspend()
    os.kill(proc.pid, signal.SIGKILL)  # the launcher; its ranks must not outlive it
    proc.wait()
    for p in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.resume()
    gone, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"ranks outlived the launcher: {[p.pid for p in alive]}"
    assert not (run_dir / "eval_after.json").exists(), "the ranks went on training after the launcher died"
    logged = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    done_before_kill = sum(1 for r in logged if "update/loss" in r)

    resumed = subprocess.run([*cmd, "--resume", "true"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    out = resumed.stdout + resumed.stderr
    start = int(out.split("resuming ")[1].split(" at iteration ")[1].split()[0])
    assert done_before_kill - start <= 1, f"resumed at {start} after {done_before_kill} logged iterations"
    assert out.count("run folder:") == 1, "only rank 0 reports"
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*"))
    assert ckpts[-1] == "iter_000002"
    state = torch.load(run_dir / "checkpoints" / "iter_000002" / "trainer.pt", weights_only=True)
    assert len(state["ranks"]) == 2 and state["iteration"] == 2
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert rows[-1]["step"] > 0 and "eval/success" in rows[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "one run folder, one set of logs"


def test_cpu_mpi_config_is_the_cpu_launch_with_the_shipped_hostfile() -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    cfg = load_config_from_file(str(ROOT / "configs" / "accelerate" / "cpu_mpi.yaml"))
    assert cfg.distributed_type == DistributedType.MULTI_CPU and cfg.use_cpu and cfg.num_processes == 2
    hostfile = ROOT / cfg.mpirun_config["mpirun_hostfile"]
    assert hostfile == ROOT / LAUNCHES["cpu_mpi"][LAUNCHES["cpu_mpi"].index("--mpirun_hostfile") + 1]
    hosts = [x for x in hostfile.read_text().splitlines() if x.strip() and not x.startswith("#")]
    assert hosts == ["localhost"]


def test_fsdp_config_for_pi0_names_layer_classes_that_exist() -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    cfg = load_config_from_file(str(ROOT / "configs" / "accelerate" / "fsdp_pi0.yaml"))
    assert cfg.distributed_type == DistributedType.FSDP and cfg.fsdp_config["fsdp_version"] == 2
    names = cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"].split(",")
    from lerobot.policies.pi_gemma import _get_pi_gemma_decoder_layer_base
    from transformers.models.siglip import modeling_siglip

    existing = {_get_pi_gemma_decoder_layer_base().__name__, modeling_siglip.SiglipEncoderLayer.__name__}
    assert set(names) == existing, f"{names} are not the layer classes of LeRobot's pi0 / pi0.5 ({existing})"


def test_one_process_trains_on_the_gpu_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-process run (no launcher) puts its learner on PyTorch's current CUDA device when it sees one."""
    from vla_rl.distributed import default_device

    assert SINGLE.device == default_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu",
                                                             0 if torch.cuda.is_available() else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert SINGLE.device == torch.device("cuda", 1)


def test_learner_to_moves_the_frozen_reference_and_the_optimizer_state() -> None:
    """``Learner.to`` (what the trainer calls with the run's device) moves every module the learner holds."""
    from policies.mlp import GaussianMLPConfig, GaussianMLPPolicy
    from vla_rl.algorithms.ppo import PPOConfig, PPOLearner

    policy = GaussianMLPPolicy(GaussianMLPConfig(state_dim=2, env_state_dim=1, action_dim=1, chunk_size=2, hidden=(8,)))
    learner = PPOLearner(PPOConfig(kl_coef=0.1), policy)
    p = next(policy.parameters())
    p.grad = torch.ones_like(p)
    learner.optimizer.step()  # Adam moments exist
    learner.to("meta")
    assert {q.device.type for q in policy.parameters()} == {"meta"}
    assert learner.reference is not None and {q.device.type for q in learner.reference.parameters()} == {"meta"}
    moments = [v for s in learner.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and {m.device.type for m in moments} == {"meta"}
