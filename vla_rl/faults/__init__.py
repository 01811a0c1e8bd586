"""Fault injection and the small scenarios it is run on, shared by the fault tests (``tests/faults/``) and the
fault benchmark (``benchmarks/faults.py``): :mod:`.inject` kills a forked child or fails its writes at the k-th
file operation, :mod:`.scenarios` holds the checkpoint, dataset and training runs faults are injected into, and
:mod:`.ros_feed` a ROS 2 bridge fed bursts, stale stamps and a camera that stops."""
