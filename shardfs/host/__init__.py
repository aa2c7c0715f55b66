"""A deployment-neutral host of mounts: root's side of publishing a mount at a target for a daemon that serves it
as another user (publisher.py), those daemons pooled by publish secret and replaced when they end (supervisor.py),
the connections held for them (held.py), the daemon itself (daemon.py) and what passes between them (handoff.py).
A CSI node plugin (shardfs/csi/) maps gRPC calls onto it; a Slurm Prolog (shardfs/slurm.py) calls it directly."""
