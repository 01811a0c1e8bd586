"""Learned rewards: a success classifier and a process reward model on the policy's own observations.

- :mod:`rewards.learned.model`: the network, its checkpoint folder and its input checks;
- :mod:`rewards.learned.labels`: labelled episodes, success labels and automatic milestone labels (stage
  predicates on privileged state in sim; gripper and rest events elsewhere);
- :mod:`rewards.learned.data`: episodes recorded from an env or read from a LeRobotDataset;
- :mod:`rewards.learned.train`: fitting and held-out metrics;
- :mod:`rewards.learned.terms`: the ``classifier`` and ``prm`` reward terms.
"""
