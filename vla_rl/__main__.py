"""``python -m vla_rl <command> ...``: the ``vla-rl`` command, in the form launchers take
(``torchrun --nproc_per_node 2 -m vla_rl train ...``, ``accelerate launch -m vla_rl train ...``)."""

import sys

from vla_rl.cli import main

if __name__ == "__main__":
    sys.exit(main())
