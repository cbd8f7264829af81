"""Environments: stateful tool worlds served per trajectory.

A *pack* (``pack.Pack``) is one world: metadata, policy text, tools that act on a
``world.World``, the initial state, and tasks with gold calls and complexity. Packs come
from a directory (``pack.load_pack``), from a generator (``procedural``) or from an
installed benchmark (importers); the tool server serves each pack as a toolset and
gives every trajectory session its own copy-on-write world.
"""

from tools.envs.pack import Complexity, EnvTask, EnvTool, Gold, GoldCall, Pack, PackInfo, load_pack
from tools.envs.world import World

__all__ = ["Complexity", "EnvTask", "EnvTool", "Gold", "GoldCall", "Pack", "PackInfo", "World", "load_pack"]
