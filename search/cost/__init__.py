"""`estimate`: what a job costs before it runs (FLOPs, memory, GPU hours, from the config and the model's
config.json), and the CPU measurements that price a job on this machine."""
