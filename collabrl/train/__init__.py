"""Training: the only package that imports TRL.

Trainers adapt TRL (GRPO with a rollout function built from a protocol, SFT warm-up,
the rSIM two-model trainer) and learn from Episodes; they never parse tags or drive
engines themselves. `episodes` says which rollouts a trainer may learn from.
"""
