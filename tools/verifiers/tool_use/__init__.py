"""``tool_use``: the fine-grained, verifiable reward of a trajectory in an environment pack.

* ``reward``: ``score``, every component (format, schema, call matching, sub-goals, state,
  answer, penalties) and the default weights;
* ``match``: one-to-one matching of executed calls to gold calls, respecting ``depends_on``;
* ``schema``: schema validity of calls, with compiled checkers cached per schema;
* ``targets``: what a gold lookup must find for a call to count;
* ``values``: argument and output comparison (BFCL-style normalisation).
"""

from tools.verifiers.tool_use.reward import COMPONENTS, DEFAULT_WEIGHTS, score

__all__ = ["COMPONENTS", "DEFAULT_WEIGHTS", "score"]
