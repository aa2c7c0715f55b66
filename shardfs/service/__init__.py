"""The daemon as a service: mounting and detaching, signals and systemd, the stats socket and metrics, the
runtime directory and the list of mounts."""
