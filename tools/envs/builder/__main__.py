"""``python -m tools.envs.builder --scenario ... --model URL --out DIR``."""

import sys

from tools.envs.builder.cli import main

sys.exit(main())
