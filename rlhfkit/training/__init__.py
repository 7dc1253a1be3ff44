"""What every training command shares: the offline loop of sft / rm / dpo (``loop.py``), the session around a run
(output folder, config, accelerator, logger, checkpoints), optimizer, schedule and accumulation, checkpoints,
metrics logging and trackers, devices and seeding, and running on several processes (how a batch splits, the
sharding engines, SIGTERM / SIGINT)."""
