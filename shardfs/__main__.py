from shardfs.cli import main

raise SystemExit(main())
