"""`python -m tests.support.as_user UID GID MODULE ARG...`: MODULE's `main(ARGS)`, run as that user.

MODULE is imported first, as root, and the privileges dropped after: this interpreter and its standard
library may lie under a directory the user cannot reach (a pyenv in /root). What the tests are about (which
sockets the user can bind, which it can reach) happens after the imports, as the user.
"""

from __future__ import annotations

import importlib
import os
import sys

if __name__ == "__main__":
    uid, gid, module, *args = sys.argv[1:]
    main = importlib.import_module(module).main
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
    sys.exit(main(args))
