"""GRAPE: preference alignment of a policy in rounds of sample -> score -> pair -> train (TPO) -> evaluate.

- :mod:`~vla_rl.grape.trajectory`: a sampled episode (:class:`~vla_rl.grape.trajectory.Trajectory`), a preference
  pair of two, a trajectory's log-likelihood under a policy, the round's trajectory file;
- :mod:`~vla_rl.grape.scoring`: GRAPE's score ``R(tau)`` (success, the policy's own likelihood, costs per task
  stage) and the check that an env reports the costs a score needs;
- :mod:`~vla_rl.grape.pairs`: top-m against bottom-m per initial state, instruction pairs, the pairs table;
- :mod:`~vla_rl.grape.sampling`: one round: sample each initial state until both outcomes appear, score, pair;
- :mod:`~vla_rl.grape.tpo`: the TPO loss and learner (``vla-rl train --algo.type tpo``);
- :mod:`~vla_rl.grape.rounds`: ``vla-rl align``: the rounds, their folders, resume;
- :mod:`~vla_rl.grape.report`: evaluation summaries, plots, videos and the run's report.
"""
