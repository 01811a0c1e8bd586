"""Real robots behind the ``sim`` observation/action contract.

- :mod:`hardware.adapter`: the robot adapter interface (connect, observe, send a chunk, disconnect);
- :mod:`hardware.lerobot_adapter`: any LeRobot ``Robot`` (``--robot.type so101_follower``, ``koch_follower``, ...);
- :mod:`hardware.ros2`: the ROS 2 bridge (``--robot.type ros2``), operator inputs, and a simulated arm node;
- :mod:`hardware.mujoco_robot`: ``--robot.type mujoco_arm``, a simulated LeRobot robot (no hardware, no ROS);
- :mod:`hardware.safety`, :mod:`hardware.watchdog`, :mod:`hardware.kinematics`: the safety envelope;
- :mod:`hardware.guard`: the only path from a policy to an arm (adapter + envelope + dry run);
- :mod:`hardware.scheduling`, :mod:`hardware.runner`, :mod:`hardware.timing`: chunk scheduling and the control loop;
- :mod:`hardware.recording`: LeRobotDataset episodes; :mod:`hardware.intervention`: keys and teleop takeover;
- :mod:`hardware.env`: a robot as a one-env :class:`sim.core.VecEnv`;
- :mod:`hardware.deploy`: ``DeployConfig`` / ``run_deploy`` / ``main`` behind ``vla-rl deploy``;
- :mod:`hardware.testing`: the ``tiny-joint`` bring-up policy and fault injection.

Kept import-light: importing ``hardware`` imports no robot SDK, rclpy or MuJoCo.
"""
