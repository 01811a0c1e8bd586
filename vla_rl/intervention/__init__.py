"""RaC intervention data: step labels, a simulated operator, teleop takeover, labelled recording sessions.

- :mod:`~vla_rl.intervention.labels`: ``policy`` / ``recovery`` / ``correction`` and their dataset fields;
- :mod:`~vla_rl.intervention.operator`: a simulated operator on the MuJoCo tabletop;
- :mod:`~vla_rl.intervention.teleop`: session keys, LeRobot teleoperators, the camera view;
- :mod:`~vla_rl.intervention.session`: the labelled recording loop (``vla-rl intervene``).
"""
