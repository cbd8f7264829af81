"""The tools: plain (async) functions and classes marked with ``protocol.tool``.

A tool never imports ``tool_server``: it can be tested, reused and served on its own.
"""
