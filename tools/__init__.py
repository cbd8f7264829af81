"""The tools: plain (async) functions and classes marked with ``protocol.tool``.

A tool never imports ``tool_server``: it can be tested, reused and served on its own.
"""

from protocol.moved import redirect

# Old module paths (before the sub-packages), importable with a DeprecationWarning.
redirect(
    {
        "tools.corpus": "tools.search.corpus",
        "tools.dense_search": "tools.search.dense",
        "tools.envs.bfcl_data": "tools.envs.bfcl.data",
        "tools.envs.bfcl_state": "tools.envs.bfcl.state",
        "tools.envs.tau2_domain": "tools.envs.tau2.domain",
        "tools.sandbox_frames": "tools.sandbox.frames",
        "tools.sandbox_host": "tools.sandbox.host",
        "tools.sandbox_interpreter": "tools.sandbox.interpreter",
        "tools.sandbox_libc": "tools.sandbox.libc",
        "tools.sandbox_mounts": "tools.sandbox.mounts",
        "tools.sandbox_pool": "tools.sandbox.pool",
        "tools.sandbox_proc": "tools.sandbox.processes",
        "tools.sandbox_repl": "tools.sandbox.repl",
        "tools.sandbox_seccomp": "tools.sandbox.seccomp",
        "tools.sandbox_template": "tools.sandbox.template",
        "tools.sandbox_types": "tools.sandbox.records",
        "tools.sandbox_uids": "tools.sandbox.uids",
        "tools.sandbox_worker": "tools.sandbox.worker",
        "tools.sandbox_zygote": "tools.sandbox.zygote",
        "tools.search_index": "tools.search.index",
        "tools.search_topk": "tools.search.topk",
        "tools.verifiers.tool_use_match": "tools.verifiers.tool_use.match",
        "tools.verifiers.tool_use_schema": "tools.verifiers.tool_use.schema",
        "tools.verifiers.tool_use_values": "tools.verifiers.tool_use.values",
    }
)
