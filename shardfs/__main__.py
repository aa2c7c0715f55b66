from shardfs.cli import run

run()
