"""vla-rl: RL fine-tuning of vision-language-action policies. Kept import-light on purpose."""

__version__ = "0.1.0"
